"""Reading `__dlpack__` objects that live on a GPU (JAX, CuPy, ...): their address, element type and extent.

A launch reads the DLTensor inside the capsule an object exports and drops
the capsule (the object itself keeps the memory alive). Exporting takes a
`stream=` (the Python array API's `__dlpack__` protocol): the stream the
consumer will use, so the producer can order its pending work before it.

- Binding a launch (`tessera.dsl.arguments`) reads the element type, shape
  and strides with `stream=-1` ("no synchronization": nothing runs yet).
- The launch itself (`Launcher`) exports once more with the launch's
  stream, as the protocol asks: on CUDA the handle, with the legacy default
  stream 0 spelled 1 (0 is ambiguous there and refused); on ROCm the
  handle, 0 being the default stream.

Producers that predate `stream=` are called without it.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any

from .errors import LaunchError

# dlpack.h DLDeviceType
DL_CPU, DL_CUDA, DL_CUDA_MANAGED, DL_ROCM = 1, 2, 13, 10
GPU_DEVICE_TYPES = {DL_CUDA: "cuda", DL_CUDA_MANAGED: "cuda", DL_ROCM: "rocm"}
DEVICE_NAMES = {1: "CPU", 3: "pinned host (CUDA)", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 11: "pinned host (ROCm)"}

# dlpack.h DLDataTypeCode -> the numpy-style kind letter `DLPackTensor.type_name` uses
_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool", 10: "float8_e4m3fn", 12: "float8_e5m2"}
CUDA_LEGACY_DEFAULT_STREAM = 1
NO_SYNCHRONIZATION = -1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensor(ctypes.Structure):
    """The head of dlpack.h's DLTensor (the first member of DLManagedTensor)."""

    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", ctypes.c_uint32), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


@dataclass(frozen=True)
class DLPackTensor:
    """What a capsule says: the first element's address, the element type, the shape and strides (elements)."""

    address: int
    code: int                   # DLDataTypeCode
    bits: int
    lanes: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None     # None: C-contiguous

    @property
    def type_name(self) -> str:
        """'float32', 'bfloat16', 'float8_e4m3fn', 'bool', ...; 'dlpack code C, B bits' when unknown."""
        kind = _CODES.get(self.code)
        if kind is None or self.lanes != 1:
            return f"dlpack type code {self.code}, {self.bits} bits x {self.lanes} lanes"
        if kind in ("bool",) or kind.startswith("float8"):
            return kind
        return f"{kind}{self.bits}"

    @property
    def nbytes(self) -> int:
        """Bytes from the first element to the end of the last one (0 when empty)."""
        if any(n == 0 for n in self.shape):
            return 0
        itemsize = max(1, self.bits * self.lanes // 8)
        if self.strides is None:
            count = 1
            for n in self.shape:
                count *= n
            return count * itemsize
        if any(s < 0 for s in self.strides):
            raise LaunchError(f"a DLPack array with negative strides {self.strides} has no first element to "
                              f"point at; pass a contiguous copy")
        return (1 + sum((n - 1) * s for n, s in zip(self.shape, self.strides))) * itemsize


def gpu_device(obj: Any) -> int | None:
    """The GPU ordinal a `__dlpack_device__` object states; None when it states none; a LaunchError naming
    the memory when it lives elsewhere."""
    query = getattr(obj, "__dlpack_device__", None)
    if query is None:
        return None
    device_type, device_id = query()
    device_type = int(device_type)
    if device_type in GPU_DEVICE_TYPES:
        return int(device_id)
    where = DEVICE_NAMES.get(device_type, f"DLPack device type {device_type}")
    if device_type == DL_CPU:
        raise LaunchError(f"an array in CPU memory ({type(obj).__name__}) was passed to a GPU launch; copy it "
                          f"to the GPU, or pass numpy arrays to run on the CPU interpreter")
    raise LaunchError(f"an array in {where} memory ({type(obj).__name__}) was passed to a GPU launch; copy it "
                      f"to GPU memory first")


def is_gpu_dlpack(obj: Any) -> bool:
    """Whether `obj` is known to a launch only through `__dlpack__` and says it is on a GPU (torch tensors, read
    directly, are not: asking a CUDA tensor for its array interface would build one)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return False
    if not hasattr(obj, "__dlpack__") or hasattr(obj, "__cuda_array_interface__"):
        return False
    query = getattr(obj, "__dlpack_device__", None)
    try:
        return query is not None and int(query()[0]) in GPU_DEVICE_TYPES
    except Exception:           # a broken query: the launch reports it when it asks again
        return False


def stream_argument(launch_stream: int, device_type: int = DL_CUDA) -> int:
    """The `stream=` a consumer passes to `__dlpack__` for a launch on raw stream handle `launch_stream`."""
    if device_type == DL_ROCM:
        return launch_stream
    return launch_stream or CUDA_LEGACY_DEFAULT_STREAM


def read(obj: Any, stream: int | None = None) -> DLPackTensor:
    """Export `obj`'s capsule (with `stream=` when given) and read it, without consuming it."""
    capsule = _export(obj, stream)
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    try:
        head = _DLTensor.from_address(get_pointer(capsule, b"dltensor"))
    except ValueError:
        raise LaunchError(f"{type(obj).__name__}.__dlpack__() did not return a DLPack capsule") from None
    ndim = head.ndim
    shape = tuple(ctypes.cast(head.shape, ctypes.POINTER(ctypes.c_int64))[:ndim]) if ndim else ()
    strides = tuple(ctypes.cast(head.strides, ctypes.POINTER(ctypes.c_int64))[:ndim]) if head.strides else None
    code, bits, lanes = head.dtype & 0xFF, (head.dtype >> 8) & 0xFF, head.dtype >> 16
    return DLPackTensor((head.data or 0) + head.byte_offset, code, bits, lanes, shape, strides)


def read_layout(obj: Any) -> DLPackTensor:
    """`read` for binding a launch: no synchronization asked (nothing runs yet), or none said where a
    producer refuses -1."""
    try:
        return read(obj, NO_SYNCHRONIZATION)
    except (ValueError, BufferError):
        return read(obj)


def _export(obj: Any, stream: int | None) -> Any:
    if stream is None:
        return obj.__dlpack__()
    try:
        return obj.__dlpack__(stream=stream)
    except TypeError:           # a producer without the stream keyword
        return obj.__dlpack__()
