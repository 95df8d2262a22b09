"""NVIDIA loader and launcher on cuda-python's driver API (`cuda.bindings.driver`).

    if driver_available():
        device = get_device(0)                      # primary context, limits, compute capability
        module = device.load_module(cubin=compiled.cubin)
        function = device.get_function(module, "add")
        device.launch(function, grid=(4, 1, 1), block=(128, 1, 1), shared_bytes=0, packer=packer, stream=0)

Nothing touches the driver until a device is asked for. `driver_available`
first checks that `libcuda.so.1` loads at all (with plain `dlopen`), because
without a driver `cuInit` raises and other CUDA Python layers can hang; every
entry point goes through `_driver()`, which turns "no driver" into a
`LaunchError` instead. Every `CUresult` other than success becomes a
`LaunchError` carrying the driver's error name and a hint.

Contexts: each device uses its primary context, the one torch and the CUDA
runtime use, so modules loaded here run on torch's streams. A launch makes
that context current only when another one is (multi-GPU), and restores it.
With one GPU visible a warm launch asks nothing first: it calls
`cuLaunchKernel` at once, and only when the driver answers that no context
(or another one) is current does it make ours current and launch again, so a
warm launch is one driver call. cuda-python's `cuLaunchKernel` is called
directly: measured against a ctypes call of the same symbol (a stub
libcuda), cuda-python's conversions cost 0.46 µs a call and ctypes' 0.5-1.1 µs.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .errors import LaunchError
from .native import any_library_loads
from .limits import DEFAULT_SHARED_BYTES, DeviceLimits, validate_launch
from .packing import ArgumentPacker

_LIBCUDA_NAMES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")

NO_DRIVER_MESSAGE = ("no NVIDIA driver found (libcuda.so.1 could not be loaded), so nothing can run on an NVIDIA "
                     "GPU here; install the NVIDIA driver, or pass numpy arrays (or set TESSERA_INTERPRET=1) to "
                     "run on the CPU interpreter")


@functools.cache
def driver_available() -> bool:
    """Whether the NVIDIA driver library loads; never initializes CUDA, never hangs."""
    return any_library_loads(_LIBCUDA_NAMES)


_init_lock = threading.Lock()
_initialized = False


def _driver():
    """`cuda.bindings.driver`, initialized; a LaunchError when the driver or cuda-python is missing."""
    global _initialized
    if not driver_available():
        raise LaunchError(NO_DRIVER_MESSAGE)
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver   # cuda-python before 12.6
        except ImportError:
            raise LaunchError("cuda-python is not installed, so tessera cannot load kernels on NVIDIA GPUs; "
                              "pip install cuda-python") from None
    if not _initialized:
        with _init_lock:
            if not _initialized:
                try:
                    result = driver.cuInit(0)
                except RuntimeError as exc:   # cuda-python could not bind the driver's functions
                    raise LaunchError(f"the NVIDIA driver could not be loaded: {exc}") from None
                _check(result, "cuInit")
                _initialized = True
    return driver


def driver_version() -> str:
    """The CUDA version the installed driver supports, e.g. "13.0" (cuDriverGetVersion)."""
    version = int(_check(_driver().cuDriverGetVersion(), "cuDriverGetVersion"))
    return f"{version // 1000}.{version % 1000 // 10}"


def device_count() -> int:
    """How many CUDA devices the driver sees; 0 without a driver (or when it fails to start)."""
    if not driver_available():
        return 0
    try:
        return _check(_driver().cuDeviceGetCount(), "cuDeviceGetCount")
    except LaunchError:
        return 0


# -- errors ----------------------------------------------------------------------------

# What cuLaunchKernel answers when the thread's current context is not the function's (none yet, or another
# library's): then the launch makes ours current and tries again.
_NOT_OUR_CONTEXT = (201, 400)     # CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE

def _no_lock() -> None:
    pass


_HINTS = {
    "CUDA_ERROR_NO_DEVICE": "no CUDA-capable GPU is visible; check CUDA_VISIBLE_DEVICES and nvidia-smi",
    "CUDA_ERROR_INSUFFICIENT_DRIVER": "the NVIDIA driver is older than cuda-python needs; update the driver",
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "the cubin was built for another GPU architecture; compile for this "
                                    "device's target (see CudaDevice.target)",
    "CUDA_ERROR_INVALID_IMAGE": "the cubin is damaged or for another architecture; clear the kernel cache "
                                "and recompile",
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": "the driver is older than the PTX this kernel uses; update the driver, "
                                          "or install ptxas (pip install nvidia-cuda-nvcc-cu12) so a cubin is "
                                          "loaded instead of PTX",
    "CUDA_ERROR_INVALID_PTX": "the driver's PTX JIT rejected the kernel; install ptxas "
                              "(pip install nvidia-cuda-nvcc-cu12) to see the assembler's message",
    "CUDA_ERROR_NOT_FOUND": "the module has no kernel of that name",
    "CUDA_ERROR_OUT_OF_MEMORY": "the GPU is out of memory",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": "too many registers or too much shared memory for this block size; "
                                          "compile with fewer warps or smaller tiles",
    "CUDA_ERROR_INVALID_VALUE": "a launch parameter is out of range (grid, block, shared memory or arguments)",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "the kernel accessed memory outside its tensors; run it with "
                                  "TESSERA_INTERPRET=1 on numpy copies to find the access (the CUDA context is "
                                  "now unusable: restart the process)",
    "CUDA_ERROR_INVALID_HANDLE": "a handle (stream, module or function) belongs to another context or was freed; "
                                 "pass a stream of the tensors' device",
    "CUDA_ERROR_INVALID_CONTEXT": "no usable CUDA context on this thread",
    "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED": "this call is not allowed while a CUDA graph is being captured; "
                                             "launch the kernel once before capturing so it is loaded",
    "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT": "the launch went to the legacy default stream during graph capture; "
                                          "pass the capturing stream (stream=...)",
}


def driver_error(result_code: Any, what: str) -> LaunchError:
    """The LaunchError for a failed driver call: its CUresult name, description and a hint."""
    name = getattr(result_code, "name", None) or f"CUresult {int(result_code)}"
    description = ""
    try:
        err, text = _driver_module().cuGetErrorString(result_code)
        if int(err) == 0 and text:
            description = f" ({text.decode() if isinstance(text, bytes) else text})"
    except Exception:  # the description is a courtesy; the name is what matters
        pass
    hint = _HINTS.get(name)
    message = f"{what} failed: {name}{description}" + (f"; {hint}" if hint else "")
    return LaunchError(message, driver_error=name)


def _driver_module():
    """The imported driver bindings (for error descriptions); None before any import."""
    return sys.modules.get("cuda.bindings.driver") or sys.modules.get("cuda.cuda")


def _check(result: tuple, what: str):
    """The value(s) of a cuda-python call `(CUresult, *values)`, or its LaunchError."""
    if int(result[0]) != 0:
        raise driver_error(result[0], what)
    return result[1] if len(result) == 2 else result[1:] or None


# -- architectures ---------------------------------------------------------------------

_ARCH = re.compile(r"(?:sm|compute)_(\d+)(\d)([af]?)")


def target_name(capability: tuple[int, int]) -> str:
    """Compute capability -> the target to compile for: (8, 0) sm_80, (9, 0) sm_90a, (10, 0) sm_100."""
    major, minor = capability
    return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


def check_architecture(target: str, capability: tuple[int, int], *, cubin: bool, device: str = "this GPU") -> None:
    """Raise a LaunchError when code for `target` cannot run on a device of `capability`.

    A cubin runs on its own major version at the same or a later minor
    (sm_80 code on sm_86/sm_89); PTX is compiled by the driver for any
    device at least as new; `a` targets (sm_90a) run only on exactly their
    compute capability.
    """
    match = _ARCH.fullmatch(target)
    if match is None:
        raise LaunchError(f"the kernel was compiled for {target!r}, which is not an NVIDIA target; compile for "
                          f"{target_name(capability)}")
    major, minor, suffix = int(match[1]), int(match[2]), match[3]
    if suffix == "a":
        ok = (major, minor) == capability
    elif cubin:
        ok = major == capability[0] and minor <= capability[1]
    else:
        ok = (major, minor) <= capability
    if not ok:
        want = target_name(capability)
        extra = f" ({target} code runs only on compute capability {major}.{minor})" if suffix == "a" else ""
        raise LaunchError(f"the kernel was compiled for {target}{extra} but {device} is {want} (compute capability "
                          f"{capability[0]}.{capability[1]}); compile it with target='{want}'")


# -- devices, modules, functions ------------------------------------------------------------


@dataclass
class CudaFunction:
    """A kernel in a loaded module, with what its launches need to know."""

    device: "CudaDevice"
    module: Any              # CUmodule (kept so the module outlives the function)
    handle: Any              # CUfunction
    name: str
    max_threads: int         # per block: .maxntid, or fewer when registers are short
    static_shared_bytes: int
    registers: int
    dynamic_shared_limit: int = DEFAULT_SHARED_BYTES   # raised by the opt-in when a launch needs more
    validated: set = field(default_factory=set)        # (block, shared bytes) already checked


class CudaDevice:
    """One GPU: its primary context, identity and limits. Get it with `get_device(ordinal)`."""

    backend = "cuda"

    def __init__(self, ordinal: int):
        d = _driver()
        count = _check(d.cuDeviceGetCount(), "cuDeviceGetCount")
        if not 0 <= ordinal < count:
            raise LaunchError(f"there is no CUDA device {ordinal}; this machine has {count} "
                              f"(check CUDA_VISIBLE_DEVICES)")
        self.ordinal = ordinal
        self.handle = _check(d.cuDeviceGet(ordinal), "cuDeviceGet")
        raw_name = _check(d.cuDeviceGetName(256, self.handle), "cuDeviceGetName")
        self.name = (raw_name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(raw_name, bytes)
                     else str(raw_name))
        A = d.CUdevice_attribute
        self.capability = (self._attribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                           self._attribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
        self.limits = DeviceLimits(
            name=f"GPU {ordinal} ({self.name}, {self.target})",
            max_grid=tuple(self._attribute(getattr(A, f"CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_{c}")) for c in "XYZ"),
            max_block=tuple(self._attribute(getattr(A, f"CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_{c}")) for c in "XYZ"),
            max_threads_per_block=self._attribute(A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            max_shared_bytes=self._attribute(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        )
        self.multiprocessors = self._attribute(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        self.context = _check(d.cuDevicePrimaryCtxRetain(self.handle), "cuDevicePrimaryCtxRetain")
        self._context_id = int(self.context)
        self._driver = d
        self.only_device = count == 1      # then every device address is on it, and no context can be another's

    def __repr__(self) -> str:
        return f"<CudaDevice {self.ordinal}: {self.name} ({self.target})>"

    @property
    def target(self) -> str:
        return target_name(self.capability)

    def _attribute(self, attribute) -> int:
        return _check(_driver().cuDeviceGetAttribute(attribute, self.handle), f"cuDeviceGetAttribute({attribute.name})")

    # -- context ----------------------------------------------------------------------

    def _enter(self) -> bool:
        """Make this device's context current; True when another one must be restored afterwards."""
        d = self._driver
        current = _check(d.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(current) == self._context_id:
            return False
        if int(current) == 0:           # nothing current on this thread: just adopt ours
            _check(d.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
            return False
        _check(d.cuCtxPushCurrent(self.context), "cuCtxPushCurrent")
        return True

    def _exit(self, pushed: bool) -> None:
        if pushed:
            _check(self._driver.cuCtxPopCurrent(), "cuCtxPopCurrent")

    # -- loading ----------------------------------------------------------------------

    def load_module(self, cubin: bytes | None = None, ptx: str | None = None):
        """Load a cubin, or JIT-compile PTX when there is no cubin; returns the CUmodule."""
        if cubin:
            image, what = bytes(cubin), "loading the cubin (cuModuleLoadData)"
        elif ptx:
            image, what = ptx.encode() + b"\0", "JIT-compiling the PTX (cuModuleLoadData)"
        else:
            raise LaunchError("there is nothing to load: the kernel has neither a cubin nor PTX")
        pushed = self._enter()
        try:
            return _check(self._driver.cuModuleLoadData(image), what)
        finally:
            self._exit(pushed)

    def get_function(self, module, name: str) -> CudaFunction:
        d = self._driver
        handle = _check(d.cuModuleGetFunction(module, name.encode()), f"finding kernel '{name}' (cuModuleGetFunction)")
        F = d.CUfunction_attribute

        def attribute(a) -> int:
            return _check(d.cuFuncGetAttribute(a, handle), f"cuFuncGetAttribute({a.name})")

        return CudaFunction(self, module, handle, name,
                            max_threads=attribute(F.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
                            static_shared_bytes=attribute(F.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
                            registers=attribute(F.CU_FUNC_ATTRIBUTE_NUM_REGS))

    def check_target(self, target: str | None, *, cubin: bool) -> None:
        if target:
            check_architecture(target, self.capability, cubin=cubin, device=f"GPU {self.ordinal} ({self.name})")

    # -- occupancy --------------------------------------------------------------------

    def blocks_per_multiprocessor(self, function: CudaFunction, block_threads: int, shared_bytes: int) -> int:
        """How many blocks of `function` (with `block_threads` threads and `shared_bytes` of dynamic shared
        memory) one SM holds at once, from its registers and shared memory
        (cuOccupancyMaxActiveBlocksPerMultiprocessor). Opts in to the shared memory first, as a launch
        would: the driver counts a block whose request exceeds the function's limit as not fitting."""
        if shared_bytes > function.dynamic_shared_limit:
            self._opt_in_shared_bytes(function, shared_bytes)
        pushed = self._enter()
        try:
            return int(_check(self._driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                function.handle, block_threads, shared_bytes),
                f"asking how many blocks of '{function.name}' fit on an SM (cuOccupancyMaxActiveBlocksPerMultiprocessor)"))
        finally:
            self._exit(pushed)

    # -- launching --------------------------------------------------------------------

    def launch(self, function: CudaFunction, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared_bytes: int, packer: ArgumentPacker, stream: int = 0) -> None:
        """cuLaunchKernel with the arguments already in the packer's buffer (grid and block are (x, y, z))."""
        self.prepare_launch(function, block, shared_bytes, packer, pack=None)(*grid, (), stream)

    def prepare_launch(self, function: CudaFunction, block: tuple[int, int, int], shared_bytes: int,
                       packer: ArgumentPacker, *, pack: Callable[[Sequence[Any]], None] | None = None,
                       lock: Any = None) -> Callable[[int, int, int, Sequence[Any], int], None]:
        """`launch(gx, gy, gz, values, stream)`: `pack(values)` into the packer's buffer (None: it is packed
        already) and cuLaunchKernel, holding `lock`, with the block and shared memory fixed and checked
        against the device's limits once here; per launch only the grid is checked."""
        if (block, shared_bytes) not in function.validated:
            validate_launch((1, 1, 1), block, shared_bytes + function.static_shared_bytes, self.limits,
                            function.max_threads)
            function.validated.add((block, shared_bytes))
        if shared_bytes > function.dynamic_shared_limit:
            self._opt_in_shared_bytes(function, shared_bytes)
        launch_kernel, handle, params = self._driver.cuLaunchKernel, function.handle, packer.kernel_params
        (bx, by, bz), (most_x, most_y, most_z) = block, self.limits.max_grid
        success, optimistic = self._driver.CUresult.CUDA_SUCCESS, self.only_device
        pack = pack or (lambda values: None)
        acquire, release = (lock.acquire, lock.release) if lock is not None else (_no_lock, _no_lock)
        name = function.name

        def in_context(gx: int, gy: int, gz: int, stream: int, err: Any) -> None:
            """After an optimistic launch that returned `err` other than CUDA_SUCCESS (None: none was tried):
            done if it was a success after all, else launch again with the function's context pushed."""
            if err is not None:
                if int(err) == 0:       # a result object other than the CUDA_SUCCESS member
                    return
                if int(err) not in _NOT_OUR_CONTEXT:
                    raise driver_error(err, f"launching kernel '{name}' (cuLaunchKernel)")
            pushed = self._enter()
            try:
                (err,) = launch_kernel(handle, gx, gy, gz, bx, by, bz, shared_bytes, stream, params, 0)
            finally:
                self._exit(pushed)
            if int(err) != 0:
                raise driver_error(err, f"launching kernel '{name}' (cuLaunchKernel)")

        plain = getattr(pack, "plain", None)
        if plain is not None:       # pointers and ints only: the packer's one struct call, inlined
            pack_into, buffer, start, exactly, fallback = plain

            def launch_plain(gx: int, gy: int, gz: int, values: Sequence[Any], stream: int) -> None:
                if gx > most_x or gy > most_y or gz > most_z:
                    validate_launch((gx, gy, gz), block, shared_bytes + function.static_shared_bytes, self.limits)
                acquire()       # threads sharing the buffer must not interleave pack and launch
                try:
                    try:
                        pack_into(buffer, start, *values)
                    except fallback:
                        exactly(values)
                    if optimistic:
                        (err,) = launch_kernel(handle, gx, gy, gz, bx, by, bz, shared_bytes, stream, params, 0)
                        if err is not success:
                            in_context(gx, gy, gz, stream, err)
                    else:
                        in_context(gx, gy, gz, stream, None)
                finally:
                    release()
            return launch_plain

        def launch(gx: int, gy: int, gz: int, values: Sequence[Any], stream: int) -> None:
            if gx > most_x or gy > most_y or gz > most_z:
                validate_launch((gx, gy, gz), block, shared_bytes + function.static_shared_bytes, self.limits)
            acquire()       # threads sharing the buffer must not interleave pack and launch
            try:
                pack(values)
                if optimistic:
                    (err,) = launch_kernel(handle, gx, gy, gz, bx, by, bz, shared_bytes, stream, params, 0)
                    if err is not success:
                        in_context(gx, gy, gz, stream, err)
                else:
                    in_context(gx, gy, gz, stream, None)
            finally:
                release()
        return launch

    def _opt_in_shared_bytes(self, function: CudaFunction, shared_bytes: int) -> None:
        d = self._driver
        pushed = self._enter()
        try:
            _check(d.cuFuncSetAttribute(function.handle,
                                        d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        shared_bytes),
                   f"opting in to {shared_bytes} bytes of dynamic shared memory (cuFuncSetAttribute)")
        finally:
            self._exit(pushed)
        function.dynamic_shared_limit = shared_bytes

    def pointer_device(self, address: int) -> int | None:
        """The ordinal of the device that owns `address`, or None when the driver does not know it."""
        d = self._driver
        try:
            err, ordinal = d.cuPointerGetAttribute(d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address)
        except Exception:
            return None
        return int(ordinal) if int(err) == 0 else None

    def synchronize(self) -> None:
        pushed = self._enter()
        try:
            _check(self._driver.cuCtxSynchronize(), "cuCtxSynchronize")
        finally:
            self._exit(pushed)


_devices: dict[int, CudaDevice] = {}
_devices_lock = threading.Lock()


def get_device(ordinal: int = 0) -> CudaDevice:
    """The (cached) device `ordinal`; a LaunchError when there is no driver or no such device."""
    device = _devices.get(ordinal)
    if device is None:
        with _devices_lock:
            device = _devices.get(ordinal) or CudaDevice(ordinal)
            _devices[ordinal] = device
    return device


def current_ordinal() -> int:
    """The device a launch without device tensors goes to: torch's current one, else the current context's, else 0."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_device()
    d = _driver()
    context = _check(d.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(context) == 0:
        return 0
    return int(_check(d.cuCtxGetDevice(), "cuCtxGetDevice"))


def pointer_device(address: int) -> int | None:
    """Which device owns `address` (for arrays that do not say, e.g. Numba's); None if unknown.
    With one GPU visible the answer is that GPU, without asking the driver."""
    if not _devices:
        return None
    device = next(iter(_devices.values()))
    return device.ordinal if device.only_device else device.pointer_device(address)
