"""AMD loader and launcher on hip-python (`from hip import hip`), the same interface as `cuda.py`.

    device = get_device(0)
    module = device.load_module(code_object=hsaco_bytes)
    function = device.get_function(module, "add")
    device.launch(function, grid, block, shared_bytes, packer, stream)

hip-python is an optional extra (`pip install tessera[rocm]`) and is imported
only when an AMD device is asked for; without it, or without the ROCm
runtime (`libamdhip64.so`), the error says which is missing.

Kernel arguments (AMDGPU ABI, code object v5): the explicit arguments form
the start of the kernarg segment, each at the next multiple of its own
alignment -- for pointers and scalars, their size -- which is exactly the
buffer `ArgumentPacker` fills (bool is one byte; f16/bf16 two);
`packing.check_kernarg_layout` compares the two from the code object's
metadata before the first launch. Shared memory (LDS) is static in
Tessera's code objects, so launches pass 0 dynamic bytes. The runtime
appends the hidden arguments (block counts, group sizes, ...) itself from the
code object's metadata. HIP's `kernelParams` form has historically been
unimplemented, so the buffer goes through `extra` as
{HIP_LAUNCH_PARAM_BUFFER_POINTER, buffer, HIP_LAUNCH_PARAM_BUFFER_SIZE,
&size, HIP_LAUNCH_PARAM_END}, prepared once per packer.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass
from typing import Any

from .errors import LaunchError
from .native import any_library_loads
from .limits import DeviceLimits, validate_launch
from .packing import ArgumentPacker

_LIBHIP_NAMES = ("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.7", "libamdhip64.so.5")

# hip_runtime_api.h: the markers of the `extra` array
HIP_LAUNCH_PARAM_BUFFER_POINTER = 0x01
HIP_LAUNCH_PARAM_BUFFER_SIZE = 0x02
HIP_LAUNCH_PARAM_END = 0x03

NO_HIP_PYTHON_MESSAGE = ("hip-python is not installed, so tessera cannot load kernels on AMD GPUs; "
                         "pip install tessera[rocm]")
NO_RUNTIME_MESSAGE = ("no ROCm runtime found (libamdhip64.so could not be loaded), so nothing can run on an AMD "
                      "GPU here; install ROCm, or pass numpy arrays (or set TESSERA_INTERPRET=1) to run on the "
                      "CPU interpreter")


@functools.cache
def driver_available() -> bool:
    """Whether the ROCm runtime library loads; never initializes HIP."""
    return any_library_loads(_LIBHIP_NAMES)


def _hip_python():
    try:
        from hip import hip
    except ImportError:
        raise LaunchError(NO_HIP_PYTHON_MESSAGE) from None
    return hip


_init_lock = threading.Lock()
_initialized = False


def _runtime():
    """hip-python's `hip` module, initialized; a LaunchError naming what is missing otherwise."""
    global _initialized
    hip = _hip_python()
    if not driver_available():
        raise LaunchError(NO_RUNTIME_MESSAGE)
    if not _initialized:
        with _init_lock:
            if not _initialized:
                try:
                    result = hip.hipInit(0)
                except RuntimeError as exc:
                    raise LaunchError(f"the ROCm runtime could not be loaded: {exc}") from None
                _check(result, "hipInit")
                _initialized = True
    return hip


def _check(result, what: str):
    result = result if isinstance(result, tuple) else (result,)
    err = result[0]
    if int(err) != 0:
        name = getattr(err, "name", None) or f"hipError_t {int(err)}"
        raise LaunchError(f"{what} failed: {name}", driver_error=name)
    return result[1] if len(result) == 2 else result[1:] or None


def device_count() -> int:
    if not driver_available():
        return 0
    try:
        return _check(_runtime().hipGetDeviceCount(), "hipGetDeviceCount")
    except LaunchError:
        return 0


def check_architecture(target: str, device_arch: str, device: str = "this GPU") -> None:
    """AMD code objects run only on the gfx version they were built for."""
    if target.split(":")[0] != device_arch:
        raise LaunchError(f"the kernel was compiled for {target} but {device} is {device_arch}; compile it with "
                          f"target='{device_arch}'")


@dataclass
class HipFunction:
    device: "HipDevice"
    module: Any
    handle: Any
    name: str
    max_threads: int | None = None
    static_shared_bytes: int = 0


class HipDevice:
    """One AMD GPU. Get it with `get_device(ordinal)`."""

    backend = "hip"

    def __init__(self, ordinal: int):
        hip = _runtime()
        count = _check(hip.hipGetDeviceCount(), "hipGetDeviceCount")
        if not 0 <= ordinal < count:
            raise LaunchError(f"there is no HIP device {ordinal}; this machine has {count} "
                              f"(check HIP_VISIBLE_DEVICES)")
        self.ordinal = ordinal
        props = hip.hipDeviceProp_t()
        _check(hip.hipGetDeviceProperties(props, ordinal), "hipGetDeviceProperties")
        self.name = _text(props.name)
        self.arch = _text(props.gcnArchName).split(":")[0]    # "gfx90a:sramecc+:xnack-" -> "gfx90a"
        A = hip.hipDeviceAttribute_t

        def attribute(a) -> int:
            return _check(hip.hipDeviceGetAttribute(a, ordinal), "hipDeviceGetAttribute")

        self.limits = DeviceLimits(
            name=f"GPU {ordinal} ({self.name}, {self.arch})",
            max_grid=tuple(attribute(getattr(A, f"hipDeviceAttributeMaxGridDim{c}")) for c in "XYZ"),
            max_block=tuple(attribute(getattr(A, f"hipDeviceAttributeMaxBlockDim{c}")) for c in "XYZ"),
            max_threads_per_block=attribute(A.hipDeviceAttributeMaxThreadsPerBlock),
            max_shared_bytes=attribute(A.hipDeviceAttributeMaxSharedMemoryPerBlock),
        )
        self.multiprocessors = attribute(A.hipDeviceAttributeMultiprocessorCount)
        self._hip = hip
        self._extra: dict[int, tuple] = {}     # id(packer) -> (packer, size_t, void*[5])

    def __repr__(self) -> str:
        return f"<HipDevice {self.ordinal}: {self.name} ({self.arch})>"

    @property
    def target(self) -> str:
        return self.arch

    def _enter(self) -> None:
        hip = self._hip
        if _check(hip.hipGetDevice(), "hipGetDevice") != self.ordinal:
            _check(hip.hipSetDevice(self.ordinal), "hipSetDevice")

    def load_module(self, code_object: bytes | None = None, **_: Any):
        if not code_object:
            raise LaunchError("there is nothing to load: the kernel has no AMD code object (hsaco)")
        self._enter()
        return _check(self._hip.hipModuleLoadData(bytes(code_object)), "loading the code object (hipModuleLoadData)")

    def get_function(self, module, name: str) -> HipFunction:
        handle = _check(self._hip.hipModuleGetFunction(module, name.encode()),
                        f"finding kernel '{name}' (hipModuleGetFunction)")
        return HipFunction(self, module, handle, name)

    def check_target(self, target: str | None, *, cubin: bool = True) -> None:
        if target:
            check_architecture(target, self.arch, f"GPU {self.ordinal} ({self.name})")

    def blocks_per_multiprocessor(self, function: HipFunction, block_threads: int, shared_bytes: int) -> int:
        """How many blocks of `function` one compute unit holds at once
        (hipModuleOccupancyMaxActiveBlocksPerMultiprocessor: VGPRs, SGPRs, LDS and waves per CU)."""
        self._enter()
        return int(_check(self._hip.hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(
            function.handle, block_threads, shared_bytes),
            f"asking how many blocks of '{function.name}' fit on a CU (hipModuleOccupancyMaxActiveBlocksPerMultiprocessor)"))

    def extra_array(self, packer: ArgumentPacker) -> int:
        """Address of the `extra` array that hands `packer`'s buffer to hipModuleLaunchKernel."""
        entry = self._extra.get(id(packer))
        if entry is None or entry[0] is not packer:
            size = ctypes.c_size_t(packer.size)
            config = (ctypes.c_void_p * 5)(HIP_LAUNCH_PARAM_BUFFER_POINTER, packer.address,
                                           HIP_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size),
                                           HIP_LAUNCH_PARAM_END)
            entry = (packer, size, config)
            self._extra[id(packer)] = entry
        return ctypes.addressof(entry[2])

    def launch(self, function: HipFunction, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared_bytes: int, packer: ArgumentPacker, stream: int = 0) -> None:
        validate_launch(grid, block, shared_bytes, self.limits, function.max_threads)
        self._enter()
        result = self._hip.hipModuleLaunchKernel(function.handle, *grid, *block, shared_bytes, stream or None,
                                                 None, self.extra_array(packer))
        _check(result, f"launching kernel '{function.name}' (hipModuleLaunchKernel)")

    def pointer_device(self, address: int) -> int | None:
        return None

    def synchronize(self) -> None:
        self._enter()
        _check(self._hip.hipDeviceSynchronize(), "hipDeviceSynchronize")


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode(errors="replace")
    return str(value)


_devices: dict[int, HipDevice] = {}
_devices_lock = threading.Lock()


def get_device(ordinal: int = 0) -> HipDevice:
    device = _devices.get(ordinal)
    if device is None:
        with _devices_lock:
            device = _devices.get(ordinal) or HipDevice(ordinal)
            _devices[ordinal] = device
    return device


def current_ordinal() -> int:
    return int(_check(_runtime().hipGetDevice(), "hipGetDevice"))


def pointer_device(address: int) -> int | None:
    return None
