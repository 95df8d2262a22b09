"""Kernel arguments -> the bytes and the `void**` array a launch passes to the driver.

    packer = ArgumentPacker([PointerType(f32), PointerType(f32), ScalarType(i32)])  # once per specialization
    packer.pack([x_address, out_address, n])      # every launch: one struct.pack_into
    cuLaunchKernel(..., kernelParams=packer.kernel_params, extra=0)

The ABI (what `tessera.backends.llvm.codegen` declares; PTX `.param`s and the AMDGPU
kernarg segment lay parameters out the same way): parameters in order, each
at the next multiple of its own size.

| IR parameter          | bytes = alignment | written as                                       |
| --------------------- | ----------------- | ------------------------------------------------ |
| ptr<T>                | 8                 | the device address (an int in [0, 2**64))        |
| bool                  | 1                 | 0 or 1 (the kernel declares an i8 and tests != 0) |
| i8 .. i64, u8 .. u64  | 1, 2, 4, 8        | wrapped to the width (two's complement)          |
| f16 / bf16            | 2                 | IEEE half / the top half of an f32               |
| f32 / f64             | 4 / 8             | IEEE single / double                             |
| f8e4m3, f8e5m2, e8m0  | 1                 | the format's bit pattern                         |
| tensormap             | 128, aligned 64   | the encoded CUtensorMap's bytes, by value        |

Scalars become the value `DType.quantize` gives (ints wrap, floats round to
nearest even once, from the exact value; overflow is +-inf where the format
has one), so a launch sees exactly what the CPU interpreter computes with.
Sub-byte scalars have no ABI and are rejected.

The buffer and the `void**` array are allocated once and never move:
`kernel_params[i]` always points at parameter i's offset in the buffer. The
CUDA driver copies the parameters when `cuLaunchKernel` is called, so the
buffer can be rewritten for the next launch at once (and a captured CUDA
graph keeps the values of its capture). The HIP loader passes the buffer
itself (`extra` form), which needs exactly this layout.

`pack` tries one precompiled `struct.Struct.pack_into` over all parameters
with native formats ('Q', 'i', 'f', ...). Anything that form would not store
exactly (an out-of-range int, an int for a float parameter, numpy scalars of
other types, non-finite bf16) makes it fall back to converting each value
through `DType.encode`, which is the definition; tests check the two agree.
"""

from __future__ import annotations

import ctypes
import math
import operator
import struct
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tessera.ir import dtypes as dt
from tessera.ir.types import PointerType, ScalarType, TensorMapType

from . import dlpack
from .errors import LaunchError

POINTER_BYTES = 8
TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64
_MAP_FORMAT = f"{TENSOR_MAP_BYTES}s"

# struct formats that store a value of the dtype exactly as the ABI wants it.
_NATIVE_FORMATS = {
    dt.bool_: "?", dt.i8: "b", dt.i16: "h", dt.i32: "i", dt.i64: "q",
    dt.u8: "B", dt.u16: "H", dt.u32: "I", dt.u64: "Q",
    dt.f16: "e", dt.f32: "f", dt.f64: "d",
}  # fmt: skip
_BITS_FORMATS = {1: "B", 2: "H", 4: "I", 8: "Q"}  # unsigned bit patterns of each width


@dataclass(frozen=True)
class ParamSlot:
    """Where one kernel parameter lives in the argument buffer."""

    index: int
    name: str
    type: PointerType | ScalarType | TensorMapType
    size: int       # bytes; also the alignment, except for tensor maps (TENSOR_MAP_ALIGN)
    offset: int

    @property
    def is_pointer(self) -> bool:
        return isinstance(self.type, PointerType)

    @property
    def is_tensor_map(self) -> bool:
        return isinstance(self.type, TensorMapType)

    @property
    def dtype(self) -> dt.DType | None:
        return self.type.dtype if isinstance(self.type, ScalarType) else None

    def describe(self) -> str:
        return f"argument {self.index} ({self.name})" if self.name else f"argument {self.index}"


def param_layout(param_types: Sequence[PointerType | ScalarType],
                 names: Sequence[str] | None = None) -> tuple[list[ParamSlot], int]:
    """Each parameter's size and offset, and the end of the last one (the buffer size)."""
    slots, end = [], 0
    for i, t in enumerate(param_types):
        size = _param_size(t, i)
        align = TENSOR_MAP_ALIGN if isinstance(t, TensorMapType) else size
        offset = -(-end // align) * align
        slots.append(ParamSlot(i, names[i] if names else "", t, size, offset))
        end = offset + size
    return slots, end


def _param_size(t, index: int) -> int:
    if isinstance(t, PointerType):
        if t.address_space != "global":
            raise LaunchError(f"parameter {index} is a {t} pointer; only global-memory pointers can be passed "
                              f"to a kernel")
        return POINTER_BYTES
    if isinstance(t, ScalarType):
        if t.dtype.is_subbyte:
            raise LaunchError(f"parameter {index} has sub-byte type {t.dtype.name}, which has no kernel ABI; "
                              f"pass it as i8/u8 and cast inside the kernel")
        return t.dtype.bits // 8
    if isinstance(t, TensorMapType):
        return TENSOR_MAP_BYTES
    raise LaunchError(f"parameter {index} has type {t}; kernels take only pointers, scalars and tensor maps (the "
                      f"compiler lowers tiles and views before codegen)")


class _Inexact(Exception):
    """The single-struct fast path would not store these values exactly."""


class ArgumentPacker:
    """A preallocated argument buffer and `void**` array for one kernel specialization.

    `pack(values)` writes one launch's arguments -- ints (device addresses)
    for pointers, numbers for scalars -- and raises a LaunchError naming the
    argument when one cannot be passed. `kernel_params` is the `void**` for
    cuLaunchKernel; `address` and `size` describe the buffer (HIP's `extra`).
    """

    def __init__(self, param_types: Sequence[PointerType | ScalarType], names: Sequence[str] | None = None):
        self.slots, self.size = param_layout(list(param_types), names)
        self._count = len(self.slots)
        words = max(1, -(-self.size // 8)) + TENSOR_MAP_ALIGN // 8
        self._buffer = (ctypes.c_uint64 * words)()      # fixed address; the parameters start 64-byte aligned
        self._start = -ctypes.addressof(self._buffer) % TENSOR_MAP_ALIGN
        self.address = ctypes.addressof(self._buffer) + self._start
        self.view = memoryview(self._buffer).cast("B")[self._start:]    # the parameters' bytes, writable in place
        self._pointers = (ctypes.c_void_p * max(1, self._count))(*[self.address + s.offset for s in self.slots])
        self._bits = struct.Struct(_struct_format(self.slots, _bits_format))
        self._exact_converters = tuple(_exact_converter(s) for s in self.slots)
        self.pack = self.prefix_pack(self._count)

    @property
    def kernel_params(self) -> int:
        """Address of the `void*[n]` array for `cuLaunchKernel(kernelParams=...)`."""
        return ctypes.addressof(self._pointers)

    def prefix_pack(self, count: int) -> Callable[[Sequence[Any]], None]:
        """`pack(values)` writing the first `count` parameters (all of them: `self.pack`) and leaving the rest
        of the buffer as it is (a kernel's trailing tensor maps, which `KernelTensorMaps` writes only when they
        change). A closure over prepared structs, so a launch pays for one Python call and one `pack_into`,
        not for attribute lookups."""
        slots = self.slots[:count]
        pack_into = struct.Struct(_struct_format(slots, _native_format)).pack_into
        bits = self._bits if count == self._count else struct.Struct(_struct_format(slots, _bits_format))
        exactly = lambda values: self._pack_exactly(values, slots, bits)     # noqa: E731
        # Fast-path guards: parameters whose native format would accept a value without converting it as
        # `quantize` does (see `_fast_kind`); converters for the formats struct lacks.
        checks = tuple((s.index, kind) for s in slots if (kind := _fast_kind(s)) is not None)
        converters = tuple((s.index, conv) for s in slots if (conv := _fast_converter(s)) is not None)
        buffer, start = self._buffer, self._start
        fallback = (_Inexact, LaunchError, struct.error, OverflowError, TypeError, ValueError, IndexError)

        if not checks and not converters:       # pointers and ints: one struct call
            def pack(values):
                try:
                    pack_into(buffer, start, *values)
                except fallback:
                    exactly(values)
            pack.plain = (pack_into, buffer, start, exactly, fallback)     # for a caller inlining the struct call
            pack.checked = (pack_into, buffer, start, 0, object, exactly, fallback)     # (values[0] is an object)
            return pack

        if len(checks) == 1 and not converters:      # one float scalar (a GEMM's alpha): no loop
            (at, kind), = checks

            def pack(values):
                try:
                    if not isinstance(values[at], kind):
                        raise _Inexact
                    pack_into(buffer, start, *values)
                except fallback:
                    exactly(values)
            pack.checked = (pack_into, buffer, start, at, kind, exactly, fallback)   # for a caller inlining it
            return pack

        def pack(values):
            try:
                for i, kind in checks:
                    if not isinstance(values[i], kind):
                        raise _Inexact
                if converters:
                    values = list(values)
                    for i, convert in converters:
                        values[i] = convert(values[i])
                pack_into(buffer, start, *values)
            except fallback:
                exactly(values)
        return pack

    def write_bytes(self, offset: int, data: bytes) -> None:
        """Copy `data` into the buffer at parameter byte `offset` (a tensor map's 128 bytes, by value). A slice
        assignment to `view`: ~0.3 µs less than ctypes.memmove, on every launch that writes a map."""
        self.view[offset:offset + len(data)] = data

    def _pack_exactly(self, values: Sequence[Any], slots: Sequence[ParamSlot] | None = None,
                      bits: struct.Struct | None = None) -> None:
        """Each value through its `DType.encode` (the definition), into `slots` (default: all) with `bits`."""
        slots, bits = (self.slots, self._bits) if slots is None else (slots, bits)
        if len(values) != len(slots):
            names = ", ".join(s.name or str(s.type) for s in slots)
            raise LaunchError(f"the kernel takes {len(slots)} runtime arguments ({names}), got {len(values)}")
        patterns = []
        for slot, convert, value in zip(slots, self._exact_converters, values):
            try:
                patterns.append(convert(value))
            except LaunchError as exc:
                raise LaunchError(f"{slot.describe()}: {exc.message}") from None
        bits.pack_into(self._buffer, self._start, *patterns)

    def decode(self) -> list[Any]:
        """The values the buffer holds now, as the kernel will read them (for tests and debugging)."""
        patterns = self._bits.unpack_from(self._buffer, self._start)
        return [bits if slot.dtype is None else slot.dtype.decode(bits).item()
                for slot, bits in zip(self.slots, patterns)]

    def raw_bytes(self) -> bytes:
        """The buffer's first `size` bytes."""
        return ctypes.string_at(self.address, self.size)


def _struct_format(slots: list[ParamSlot], char: Callable[[ParamSlot], str]) -> str:
    fmt, end = ["<"], 0
    for slot in slots:
        fmt.append("x" * (slot.offset - end) + char(slot))
        end = slot.offset + slot.size
    return "".join(fmt)


def _bits_format(slot: ParamSlot) -> str:
    return _MAP_FORMAT if slot.is_tensor_map else _BITS_FORMATS[slot.size]


def _native_format(slot: ParamSlot) -> str:
    if slot.is_tensor_map:
        return _MAP_FORMAT
    if slot.is_pointer:
        return "Q"
    return _NATIVE_FORMATS.get(slot.dtype, _BITS_FORMATS[slot.size])


def _fast_kind(slot: ParamSlot) -> type | None:
    """The Python type a value must have for the native format to store it exactly.

    'f' would round an int above 2**53 twice (int -> double -> float) and
    '?' would take any object's truthiness; ints, f16 and f64 need no guard
    (struct rejects out-of-range ints, and every int that fits a double's
    53 bits is exact where f16 has not overflowed already).
    """
    if slot.dtype is None:
        return None
    d = slot.dtype
    if d == dt.bool_:
        return bool
    if d.is_float and d != dt.f16 and d != dt.f64:
        return float
    return None


def _fast_converter(slot: ParamSlot) -> Callable[[Any], int] | None:
    """Formats struct lacks: bit patterns computed in the fast path."""
    if slot.is_tensor_map:
        return _map_bytes_fast
    if slot.is_pointer or slot.dtype in _NATIVE_FORMATS:
        return None
    if slot.dtype == dt.bf16:
        return _bf16_bits
    return _encoder(slot.dtype)  # fp8 / e8m0: rare as parameters; numpy is the definition


def _exact_converter(slot: ParamSlot) -> Callable[[Any], int]:
    if slot.is_tensor_map:
        return _map_bytes
    if slot.is_pointer:
        return _address_bits
    d = slot.dtype
    mask = (1 << d.bits) - 1
    encode = _encoder(d)

    def convert(value):
        if d.is_int and isinstance(value, int):
            return value & mask      # wrap; bool is an int here (True -> 1)
        return encode(value)

    return convert


def _encoder(d: dt.DType) -> Callable[[Any], int]:
    def encode(value) -> int:
        try:
            patterns = d.encode(value)
            if patterns.size != 1:
                raise TypeError(f"expected one number, got an array of shape {patterns.shape}")
            return int(patterns.reshape(()))
        except (TypeError, ValueError, OverflowError) as exc:
            raise LaunchError(f"cannot pass {value!r} as a {d.name} scalar ({exc})") from None
    return encode


def _address_bits(value) -> int:
    if value is None:
        return 0
    try:
        address = operator.index(value)
    except TypeError:
        raise LaunchError(f"a pointer parameter takes a device address (int), got {type(value).__name__}; "
                          f"use device_pointer(obj) to get one") from None
    if not 0 <= address < 1 << 64:
        raise LaunchError(f"device address {address:#x} is outside [0, 2**64)")
    return address


def _map_bytes_fast(value) -> bytes:
    if type(value) is not bytes or len(value) != TENSOR_MAP_BYTES:
        raise _Inexact                  # struct would pad or cut it: let the exact path say what is wrong
    return value


def _map_bytes(value) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)) or len(bytes(value)) != TENSOR_MAP_BYTES:
        raise LaunchError(f"a tensor-map parameter takes the {TENSOR_MAP_BYTES} bytes of an encoded CUtensorMap "
                          f"(tessera.runtime.tensor_map.encode_tensor_map), got {type(value).__name__}"
                          + (f" of {len(bytes(value))} bytes" if isinstance(value, (bytes, bytearray)) else ""))
    return bytes(value)


_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def _bf16_bits(x: float) -> int:
    """bf16 bit pattern of the float `x`, rounded once to nearest even (as `bf16.quantize`)."""
    if not math.isfinite(x):
        raise _Inexact  # inf and NaN patterns: let encode define them
    _, e = math.frexp(x)                   # |x| in [2**(e-1), 2**e)
    if e > 128:                            # |x| >= 2**128: beyond bf16 (and the scaling below)
        return 0xFF80 if x < 0 else 0x7F80
    quantum = max(e - 8, -133)             # 8 significant bits; subnormals: fixed 2**-133
    r = math.ldexp(round(math.ldexp(x, -quantum)), quantum)  # exact scaling, round() ties to even
    if abs(r) >= 2.0**128:
        return 0xFF80 if x < 0 else 0x7F80
    (bits,) = _U32.unpack(_F32.pack(math.copysign(r, x)))   # r is exact in f32
    return bits >> 16


# -- device pointers ---------------------------------------------------------------

CPU_TENSOR_MESSAGE = ("a CPU tensor was passed to a GPU launch; move it with .cuda(), or pass numpy arrays to "
                      "run on the CPU interpreter")
NUMPY_MESSAGE = ("a numpy array (CPU memory) was passed to a GPU launch; copy it to the GPU (e.g. "
                 "torch.from_numpy(a).cuda()), or pass only numpy arrays to run on the CPU interpreter")

def device_pointer(obj: Any, device: int | None = None) -> int:
    """The device address of a GPU array; `device` (an ordinal) also checks where it lives.

    Accepts torch CUDA (or ROCm) tensors, objects with `__cuda_array_interface__`
    (CuPy, Numba, ...) and `__dlpack__` objects on a GPU (JAX, CuPy, ...).
    """
    address, where = pointer_and_device(obj)
    if device is not None and where is not None and where != device:
        raise LaunchError(f"the tensor is on GPU {where} but the launch runs on GPU {device}; move it with "
                          f".to('cuda:{device}') or launch under torch.cuda.device({where})")
    return address


def pointer_and_device(obj: Any, stream: int | None = None) -> tuple[int, int | None]:
    """(device address, device ordinal) of a GPU array; the ordinal is None when the object does not say.
    A `__dlpack__` object is exported with `stream=stream` when given (`dlpack.stream_argument`)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        device = obj.device
        if device.type == "cuda":
            return obj.data_ptr(), device.index
        if device.type == "cpu":
            raise LaunchError(CPU_TENSOR_MESSAGE)
        raise LaunchError(f"a tensor on device '{device}' was passed to a GPU launch; move it with .cuda()")
    if isinstance(obj, np.ndarray):
        raise LaunchError(NUMPY_MESSAGE)
    interface = getattr(obj, "__cuda_array_interface__", None)
    if interface is not None:
        return int(interface["data"][0]), dlpack.gpu_device(obj)
    if hasattr(obj, "__dlpack__"):
        device = dlpack.gpu_device(obj)
        return dlpack.read(obj, stream).address, device
    raise LaunchError(f"cannot pass a {type(obj).__name__} as a pointer argument; pass a torch CUDA tensor, an "
                      f"object with __cuda_array_interface__ or __dlpack__ (CuPy, Numba, JAX), or an int "
                      f"device address")


def check_kernarg_layout(packer: ArgumentPacker, kernel_args: Sequence[dict]) -> None:
    """LaunchError unless `packer` puts every parameter where an AMD code object reads it.

    `kernel_args` is the code object's argument metadata (`.args` of its AMDGPU note, keys without
    the dot: offset, size, value_kind); the explicit ones (every kind but `hidden_*`) must match the
    packer's slots one for one. A mismatch would make the kernel read garbage, so it stops the launch.
    """
    explicit = [a for a in kernel_args if not str(a.get("value_kind", "")).startswith("hidden_")]
    expected = [(a["offset"], a["size"]) for a in explicit]
    packed = [(s.offset, s.size) for s in packer.slots]
    if expected != packed:
        raise LaunchError(f"the code object reads its arguments at (offset, size) {expected}, but the launch "
                          f"packs them at {packed}; this is a compiler bug: please report it with the kernel")
