"""Turning a launch's Python arguments into a specialization and runtime values.

A launch `kernel[grid](x, y, n, BLOCK=1024)` binds arguments to parameters
like a Python call, then classifies each runtime argument:

| argument                                   | IR type            | specialized on            |
| ------------------------------------------ | ------------------ | ------------------------- |
| numpy array (any non-negative strides)     | ptr<dtype>         | dtype, 16-byte alignment  |
| ml_dtypes array (bfloat16, float8_*)       | ptr<bf16 / f8...>  | dtype, 16-byte alignment  |
| `tessera.reinterpret(array, dtype)`        | ptr<dtype>         | dtype, 16-byte alignment  |
| torch CPU tensor (every dtype)             | ptr<dtype>         | dtype, 16-byte alignment  |
| CPU `__dlpack__` object                    | ptr<dtype>         | dtype, 16-byte alignment  |
| torch CUDA tensor, `__cuda_array_interface__` object | ptr<dtype> (on the GPU) | dtype, 16-byte alignment |
| GPU `__dlpack__` object (JAX, ...), exported with the launch's stream | ptr<dtype> (on the GPU) | dtype, 16-byte alignment |
| Python bool                                | bool               | -                         |
| Python int                                 | i32 (i64/u64 when it does not fit) | %16 == 0, == 1 |
| Python float                               | f32                | -                         |
| numpy scalar                               | its dtype          | ints: %16 == 0, == 1      |

A strided host array is passed as the run of memory from its first element
to its last (the kernel indexes it with the strides it is given, as on a GPU).
constexpr parameters are specialized on their value. `do_not_specialize`
parameters keep only their dtype in the key.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..ir import dtypes as dt
from ..backends.interp import addresses as interp_addresses
from ..ir.types import PointerType, ScalarType
from ..runtime import dlpack
from ..runtime.packing import pointer_and_device
from .errors import KernelArgumentError
from .source import KernelSource
from .specialization import ParamSpec


@dataclass(frozen=True)
class TypedArray:
    """A numpy array whose bytes hold elements of a tessera dtype numpy lacks (bf16, fp8, packed int4, ...)."""

    array: np.ndarray
    dtype: dt.DType


def reinterpret(array: Any, dtype: dt.DType) -> TypedArray | DeviceArray:
    """View `array`'s storage as elements of `dtype`: a uint16 array as bf16, a uint8 array as fp8 or packed u4.

    Sub-byte dtypes are stored packed (element k at bit k*bits, little-endian
    within bytes); `tessera.ir.dtypes.pack` builds such arrays. GPU tensors
    (torch CUDA tensors, `__cuda_array_interface__` objects) are viewed the
    same way, for launches on the GPU.
    """
    device_array = _device_array(array)
    if device_array is not None:
        _check_reinterpretable(device_array.dtype.bits, "uint8" if device_array.dtype == dt.u8 else
                               device_array.dtype.name, dtype)
        return DeviceArray(device_array.obj, dtype, device_array.address, device_array.device, device_array.nbytes)
    array = _as_numpy(array)
    if array is None:
        raise TypeError("tessera.reinterpret takes a numpy array, a CPU torch tensor or a GPU tensor")
    _check_reinterpretable(array.dtype.itemsize * 8, str(array.dtype), dtype)
    return TypedArray(array, dtype)


def _check_reinterpretable(bits: int, name: str, dtype: dt.DType) -> None:
    if dtype.is_subbyte:
        if name != "uint8":
            raise TypeError(f"packed {dtype.name} data must be a uint8 array, got {name}")
    elif bits != dtype.bits:
        raise TypeError(f"cannot view {name} elements ({bits} bits) as {dtype.name} ({dtype.bits} bits); use a "
                        f"{dtype.storage_dtype} array")


def addresses(arrays) -> Any:
    """The data addresses of `arrays`, as a 1-D int64 array for a kernel to load and convert to pointers
    (`tessera.load(ptrs + g).to(tessera.pointer_type(tessera.f16))`): a grouped GEMM over separate allocations.

    numpy arrays (or CPU torch tensors, or `reinterpret`ed ones) give a numpy array, and the CPU interpreter
    may then follow those addresses -- every access bounds-checked against the array it lands in. CUDA
    tensors give an int64 tensor on their device (`t.data_ptr()` each).
    """
    arrays = list(arrays)
    if arrays and type(arrays[0]).__module__.startswith("torch") and arrays[0].device.type != "cpu":
        import torch
        return torch.tensor([t.data_ptr() for t in arrays], dtype=torch.int64, device=arrays[0].device)
    found, kept = [], []
    for array in arrays:
        numpy_array = _as_numpy(array.array if isinstance(array, TypedArray) else array)
        if numpy_array is None:
            raise TypeError(f"tessera.addresses takes numpy arrays or torch tensors, got {type(array).__name__}")
        found.append(interp_addresses.register(numpy_array))
        kept.append(numpy_array)
    result = np.array(found, dtype=np.uint64).view(np.int64).view(AddressArray)
    result.targets = kept
    return result


class AddressArray(np.ndarray):
    """The int64 addresses `tessera.addresses` returns; it keeps the arrays they point into alive (`targets`),
    so the interpreter can follow them for as long as the addresses are used."""

    targets: list


@dataclass(frozen=True)
class DeviceArray:
    """An argument living in GPU memory: the caller's object, its element type, address, device and size."""

    obj: Any
    dtype: dt.DType
    address: int
    device: int | None
    nbytes: int = 0


TORCH_DTYPES = {
    "torch.float32": dt.f32, "torch.float16": dt.f16, "torch.bfloat16": dt.bf16, "torch.float64": dt.f64,
    "torch.int8": dt.i8, "torch.int16": dt.i16, "torch.int32": dt.i32, "torch.int64": dt.i64,
    "torch.uint8": dt.u8, "torch.uint16": dt.u16, "torch.uint32": dt.u32, "torch.uint64": dt.u64,
    "torch.bool": dt.bool_, "torch.float8_e4m3fn": dt.f8e4m3, "torch.float8_e5m2": dt.f8e5m2,
}


def _device_array(value: Any) -> DeviceArray | None:
    """A DeviceArray for GPU tensors (torch CUDA tensors, `__cuda_array_interface__` objects, GPU `__dlpack__`
    objects), else None."""
    if type(value).__module__.startswith("torch"):
        device = getattr(value, "device", None)
        if getattr(device, "type", "cpu") != "cuda":
            return None
        dtype = TORCH_DTYPES.get(str(value.dtype))
        if dtype is None:
            raise TypeError(f"torch dtype {value.dtype} has no tessera equivalent")
        # read directly (what pointer_and_device and _memory_range give a CUDA tensor): library ops view their
        # packed weights this way on every call
        return DeviceArray(value, dtype, value.data_ptr(), device.index, value.numel() * value.element_size())
    if dlpack.is_gpu_dlpack(value):
        return _dlpack_device_array(value)
    if hasattr(value, "__cuda_array_interface__"):
        dtype = _interface_dtype(value.__cuda_array_interface__["typestr"])
    else:
        return None
    address, device = pointer_and_device(value)
    start, end = _memory_range(value)
    return DeviceArray(value, dtype, address, device, end - start)


def _dlpack_device_array(value: Any) -> DeviceArray:
    """A GPU `__dlpack__` object (JAX, CuPy, ...) read from its capsule; the launch exports it once more with
    its stream (`Launcher._export`)."""
    layout = dlpack.read_layout(value)
    name = layout.type_name
    dtype = _EXTENSION_DTYPES.get(name)
    if dtype is None:
        try:
            dtype = dt.dtype_from_numpy(np.dtype("bool" if name == "bool" else name))
        except (TypeError, ValueError):
            raise TypeError(f"a {type(value).__name__} of DLPack element type {name} has no tessera equivalent") \
                from None
    return DeviceArray(value, dtype, layout.address, dlpack.gpu_device(value), layout.nbytes)


@dataclass(frozen=True)
class BoundArguments:
    """A launch's arguments, split into the specialization and what runs."""

    params: tuple[ParamSpec, ...]    # what the tracer traces
    key: tuple                       # the in-memory cache key (hashable)
    runtime_args: tuple[Any, ...]    # one per non-constexpr parameter: TypedArray/DeviceArray and scalars
    by_name: dict[str, Any]          # every bound argument, for grid callables

    @property
    def on_device(self) -> bool:
        """True when any array argument lives in GPU memory (the launch goes to the GPU)."""
        return any(isinstance(a, DeviceArray) for a in self.runtime_args)


def bind_arguments(source: KernelSource, args: tuple, kwargs: dict, do_not_specialize: frozenset[str]) -> BoundArguments:
    """Bind a launch's arguments to the kernel's parameters and classify them."""
    try:
        bound = source.signature.bind(*args, **kwargs)
    except TypeError as exc:
        params = ", ".join(source.param_names)
        raise KernelArgumentError(f"bad arguments for kernel '{source.name}({params})': {exc}",
                                  kernel=source.name) from None
    bound.apply_defaults()
    aliased = _aliased_arguments(bound.arguments)
    specs, key, runtime = [], [], []
    for name, value in bound.arguments.items():
        if name in source.constexpr_params:
            _check_constexpr_value(source, name, value)
            specs.append(ParamSpec(name, constexpr=True, value=value))
            key.append((name, type(value).__name__, value))
            continue
        spec, runtime_value = _classify(source, name, value, specialize=name not in do_not_specialize)
        if name in aliased:
            spec = replace(spec, may_alias=True)
        specs.append(spec)
        key.append((name, str(spec.type), spec.divisible_by_16, spec.equals_one, spec.may_alias))
        runtime.append(runtime_value)
    return BoundArguments(tuple(specs), tuple(key), tuple(runtime), dict(bound.arguments))


def _memory_range(value: Any) -> tuple[int, int] | None:
    """[start, end) byte addresses of an array argument, or None for scalars."""
    if isinstance(value, DeviceArray):            # a reinterpret()ed GPU tensor: the tensor's own range
        value = value.obj
    try:
        typed = value if isinstance(value, TypedArray) else host_array(value)
    except ValueError:                          # refused when the argument is classified
        typed = None
    if typed is not None:
        start = typed.array.__array_interface__["data"][0]
        return start, start + typed.array.nbytes
    if type(value).__module__.startswith("torch") and hasattr(value, "data_ptr"):
        return value.data_ptr(), value.data_ptr() + value.numel() * value.element_size()
    interface = getattr(value, "__cuda_array_interface__", None)
    if interface is not None:
        start = interface["data"][0]
        return start, start + math.prod(interface["shape"]) * itemsize(interface["typestr"])
    if dlpack.is_gpu_dlpack(value):
        layout = dlpack.read_layout(value)
        return layout.address, layout.address + layout.nbytes
    return None


@functools.lru_cache(maxsize=64)
def _interface_dtype(typestr: str) -> dt.DType:
    """The tessera dtype of an array-interface type string ('|u1': u8), kept: numpy parses it in microseconds."""
    return dt.dtype_from_numpy(np.dtype(typestr))


@functools.lru_cache(maxsize=64)
def itemsize(typestr: str) -> int:
    """Bytes per element of a numpy type string ('<f4': 4)."""
    return np.dtype(typestr).itemsize


def _aliased_arguments(arguments: dict[str, Any]) -> set[str]:
    """Names of array arguments whose memory overlaps another array argument's (in-place updates, views)."""
    ranges = {name: r for name, value in arguments.items() if (r := _memory_range(value)) is not None}
    aliased = set()
    for a, (a_start, a_end) in ranges.items():
        for b, (b_start, b_end) in ranges.items():
            if a != b and a_start < b_end and b_start < a_end:
                aliased.update((a, b))
    return aliased


CONSTEXPR_TYPES = (bool, int, float, str, type(None), dt.DType)


def _is_constexpr_type(value: Any) -> bool:
    """A plain constexpr, or an object whose class opts in with `__tessera_constexpr__ = True` (layouts)."""
    return isinstance(value, CONSTEXPR_TYPES) or getattr(type(value), "__tessera_constexpr__", False) is True


def _is_constexpr_data(value: Any) -> bool:
    """A constexpr value, or a (nested) tuple of them."""
    if isinstance(value, tuple):
        return all(_is_constexpr_data(v) for v in value)
    return _is_constexpr_type(value)


def _check_constexpr_value(source: KernelSource, name: str, value: Any) -> None:
    if not _is_constexpr_data(value):
        raise KernelArgumentError(
            f"constexpr parameter '{name}' got {type(value).__name__}; constexprs must be ints, floats, bools, "
            f"strings, dtypes, layouts, @tessera.func helpers or (nested) tuples of those", kernel=source.name)


def _as_numpy(value: Any) -> np.ndarray | None:
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("torch") and hasattr(value, "numpy"):
        if getattr(value, "device", None) is not None and value.device.type != "cpu":
            return None
        return value.detach().numpy()
    return None


# element types numpy itself lacks, by the name their providers (ml_dtypes, JAX) give them
_EXTENSION_DTYPES = {"bfloat16": dt.bf16, "float8_e4m3fn": dt.f8e4m3, "float8_e5m2": dt.f8e5m2}
# torch dtypes numpy lacks, viewed as the unsigned ints of their bits (what the interpreter stores them as)
_TORCH_BITS_VIEW = {dt.bf16: "uint16", dt.f8e4m3: "uint8", dt.f8e5m2: "uint8"}


def host_array(value: Any) -> TypedArray | None:
    """A host array argument as a contiguous run of elements the interpreter reads and writes in place: numpy
    arrays of any non-negative strides, torch CPU tensors of every dtype (bf16 and fp8 through their bits),
    ml_dtypes arrays, and objects with a CPU `__dlpack__`; None for anything else."""
    if type(value).__module__.startswith("torch") and hasattr(value, "numpy"):
        if getattr(value, "device", None) is not None and value.device.type != "cpu":
            return None
        dtype = TORCH_DTYPES.get(str(value.dtype))
        if dtype is None:
            raise ValueError(f"torch dtype {value.dtype} has no tessera equivalent")
        tensor = value.detach()
        if dtype in _TORCH_BITS_VIEW:
            tensor = tensor.view(getattr(__import__("torch"), _TORCH_BITS_VIEW[dtype]))
        return TypedArray(_contiguous_span(tensor.numpy()), dtype)
    if not isinstance(value, np.ndarray) and hasattr(value, "__dlpack__"):
        device = getattr(value, "__dlpack_device__", lambda: (1, 0))()
        if int(device[0]) != 1:                    # kDLCPU
            return None
        value = np.from_dlpack(value)
    if not isinstance(value, np.ndarray):
        return None
    extension = _EXTENSION_DTYPES.get(value.dtype.name)
    if extension is not None:
        return TypedArray(_contiguous_span(value.view(extension.storage_dtype)), extension)
    try:
        dtype = dt.dtype_from_numpy(value.dtype)
    except ValueError:
        return None
    return TypedArray(_contiguous_span(value), dtype)


def _contiguous_span(array: np.ndarray) -> np.ndarray:
    """`array` itself when it is C-contiguous; else a flat view of every element from its first to its last
    (a kernel addresses a strided array through the strides it is given, like a GPU does)."""
    if array.flags.c_contiguous:
        return array
    if any(s < 0 for s in array.strides):
        raise ValueError(f"an array with negative strides {array.strides} has no first element to point at; "
                         f"pass np.ascontiguousarray(x) (and copy results back if the kernel writes to it)")
    if any(s % array.itemsize for s in array.strides):
        raise ValueError(f"strides {array.strides} are not whole elements of {array.itemsize} bytes")
    span = 0 if array.size == 0 else 1 + sum((n - 1) * s // array.itemsize for n, s in zip(array.shape, array.strides))
    return np.lib.stride_tricks.as_strided(array, shape=(span,), strides=(array.itemsize,))


def _classify(source: KernelSource, name: str, value: Any, specialize: bool) -> tuple[ParamSpec, Any]:
    if isinstance(value, TypedArray):
        return _pointer_spec(name, value, specialize), value
    try:
        device_array = value if isinstance(value, DeviceArray) else _device_array(value)
    except (TypeError, ValueError) as exc:
        raise KernelArgumentError(f"argument '{name}': {exc}", kernel=source.name) from None
    if device_array is not None:
        aligned = specialize and device_array.address % 16 == 0
        return ParamSpec(name, False, type=PointerType(device_array.dtype), divisible_by_16=aligned), device_array
    try:
        typed = host_array(value)
    except ValueError as exc:
        raise KernelArgumentError(f"argument '{name}': {exc}", kernel=source.name) from None
    if typed is not None:
        return _pointer_spec(name, typed, specialize), typed
    if isinstance(value, np.ndarray):
        raise KernelArgumentError(
            f"argument '{name}' has numpy dtype {value.dtype}, which kernels cannot use; pass one of "
            f"bool/int8..int64/uint8..uint64/float16/float32/float64, bfloat16/float8 (ml_dtypes), or "
            f"tessera.reinterpret(array, dtype)", kernel=source.name)
    if isinstance(value, (bool, np.bool_)):
        return ParamSpec(name, False, type=ScalarType(dt.bool_)), bool(value)
    if isinstance(value, (int, np.integer)):
        dtype = _int_dtype(value) if isinstance(value, int) else dt.dtype_from_numpy(value.dtype)
        facts = dict(divisible_by_16=int(value) % 16 == 0, equals_one=int(value) == 1) if specialize else {}
        return ParamSpec(name, False, type=ScalarType(dtype), **facts), int(value)
    if isinstance(value, (float, np.floating)):
        dtype = dt.f32 if isinstance(value, float) else dt.dtype_from_numpy(value.dtype)
        return ParamSpec(name, False, type=ScalarType(dtype)), float(value)
    raise KernelArgumentError(
        f"argument '{name}' of type {type(value).__name__} cannot be passed to a kernel; pass a numpy array, a GPU "
        f"tensor, a Python/numpy scalar, or annotate the parameter `{name}: tessera.constexpr`", kernel=source.name)


def _pointer_spec(name: str, typed: TypedArray, specialize: bool) -> ParamSpec:
    aligned = specialize and typed.array.ctypes.data % 16 == 0
    return ParamSpec(name, False, type=PointerType(typed.dtype), divisible_by_16=aligned)


def _int_dtype(value: int) -> dt.DType:
    for dtype in (dt.i32, dt.i64, dt.u64):
        if dtype.min_value <= value <= dtype.max_value:
            return dtype
    raise KernelArgumentError(f"integer argument {value} does not fit in 64 bits")
