"""Launching a specialization on a GPU: disk cache -> (compile) -> load -> launch.

The warm path is one dictionary lookup per launch: the kernel keeps a
`Launcher` (prepared argument buffer, loaded module) per (specialization,
device target, num_warps). The first launch of a specialization in a process
asks the binary cache, keyed without tracing the kernel (source, helper
functions, global constants, specialization, options, target, compiler
identity); only a miss traces and compiles, so a second process that
launches an already-compiled kernel never runs LLVM.

`TESSERA_INTERPRET=1` sends launches with torch CUDA tensors to the CPU
interpreter instead: each tensor is copied to the host, the kernel runs,
and the results are copied back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..ir import dtypes as dt
from ..ir.tensor_map import TensorMapRecipe
from ..ir.types import TensorMapType
from ..runtime.cache import BinaryCache, CacheEntry
from ..runtime.cache_key import cache_key
from ..runtime.errors import LaunchError
from .arguments import BoundArguments, DeviceArray, TypedArray
from .modes import debug_mode
from .errors import KernelArgumentError

if TYPE_CHECKING:
    from .kernel import Kernel


def binary_for(kernel: "Kernel", bound: BoundArguments, target: str, num_warps: int) -> CacheEntry:
    """The compiled binary of this specialization, from the disk cache or freshly compiled (and stored).

    A hit neither traces the kernel nor imports the compiler: the key is made of the kernel's source,
    helpers and globals, the bound arguments, the options, and identities computed without running a tool.
    """
    from ..ir.target import get_target  # imported on first use: `import tessera` stays light

    callees, constants = kernel.dependencies
    debug = debug_mode()
    options = {"num_warps": num_warps, "globals": constants, "debug": debug,
               **_tool_identity(get_target(target).vendor)}
    if kernel.fast_math:
        options["fast_math"] = True
    key = cache_key(kernel.source.source_hash, callees, bound.key, options, target)

    def compile_now() -> CacheEntry:
        from .compiler import compile_tile_module

        module = kernel._specialization(bound).module
        return CacheEntry.from_compiled(compile_tile_module(module, target=target, num_warps=num_warps,
                                                            debug=debug, tolerate=kernel.tolerate))

    return BinaryCache().get_or_compile(key, compile_now)


def _tool_identity(vendor: str) -> dict:
    """The tool that makes the binary, part of the cache key (a new ptxas / ld.lld gives a new binary): where
    it is, its size and modification time (not its `--version`: no subprocess per process)."""
    if vendor == "amd":
        from ..backends.amdgpu import find_linker

        linker = find_linker()
        return {"ld.lld": str(linker) if linker else None}
    from ..backends.nvptx.toolkit import find_ptxas_path

    path = find_ptxas_path()
    if path is None:
        return {"ptxas": None}
    stat = path.stat()
    return {"ptxas": f"{path}:{stat.st_size}:{stat.st_mtime_ns}"}


def gpu_runtime(kernel_name: str):
    """The runtime module of this machine's GPUs: `runtime.cuda` with an NVIDIA driver, else `runtime.hip`
    with ROCm; a LaunchError naming both when neither is present."""
    from ..runtime import cuda, hip

    if cuda.driver_available():
        return cuda
    if hip.driver_available():
        return hip
    raise LaunchError("no NVIDIA driver was found (libcuda.so.1), nor ROCm (libamdhip64.so), so GPU tensors cannot "
                      "be launched on; pass numpy arrays, or set TESSERA_INTERPRET=1 to run torch tensors on the "
                      "CPU", kernel=kernel_name)


def launch_on_gpu(kernel: "Kernel", bound: BoundArguments, grid: tuple[int, ...], *, stream: Any,
                  num_warps: int) -> tuple[Any, int | None]:
    """Launch; returns the `Launcher` and the device it ran on (None when the arrays do not say and there
    are several GPUs), so the warm path (`fast_launch.py`) can reuse it."""
    launcher, ordinal = launcher_for(kernel, bound, num_warps)
    try:
        launcher(grid, [a.obj if isinstance(a, DeviceArray) else a for a in bound.runtime_args], stream=stream)
    except LaunchError as exc:
        raise exc.with_kernel(kernel.name) from None
    return launcher, ordinal


def launcher_for(kernel: "Kernel", bound: BoundArguments, num_warps: int) -> tuple[Any, int | None]:
    """The `Launcher` of this specialization on the arrays' GPU (compiled or taken from the cache), and that
    GPU's ordinal (None when the arrays do not say and there are several)."""
    from ..runtime.launcher import KernelBinary, Launcher, cluster_shape
    from ..runtime.packing import check_kernarg_layout

    if any(isinstance(a, TypedArray) for a in bound.runtime_args):
        raise KernelArgumentError("the launch mixes host arrays and GPU tensors; move every array to the same "
                                  "GPU (or all to the host to run on the CPU interpreter)", kernel=kernel.name)
    runtime = gpu_runtime(kernel.name)
    ordinal = next(a.device for a in bound.runtime_args if isinstance(a, DeviceArray))
    device = runtime.get_device(ordinal or 0)
    if ordinal is None and getattr(device, "only_device", False):
        ordinal = device.ordinal
    key = (bound.key, device.target, num_warps)
    launcher = kernel.launchers.get(key)
    if launcher is None:
        entry = binary_for(kernel, bound, device.target, num_warps)
        metadata = entry.metadata
        dynamic_shared = metadata.get("dynamic_shared_bytes", metadata.get("shared_bytes"))
        binary = KernelBinary(entry.name, entry.target, entry.binary, entry.ptx or None,
                              int(metadata["num_threads"]), int(dynamic_shared or 0), cluster_shape(metadata))
        params = [p for p in bound.params if not p.constexpr]
        types, names, recipes = launch_parameters([p.type for p in params], [p.name for p in params], metadata)
        launcher = Launcher(binary, types, backend=device.backend, names=names, tensor_maps=recipes)
        if "kernel_args" in metadata:  # AMD: the code object says where it reads each argument
            check_kernarg_layout(launcher.packer, metadata["kernel_args"])
        kernel.launchers[key] = launcher
    return launcher, ordinal


def launch_parameters(types: list, names: list[str], metadata: dict) -> tuple[list, list[str], list]:
    """The kernel's parameter types and names with the hidden tensor maps of `metadata` appended, and their
    recipes (`Launcher(..., tensor_maps=)`)."""
    maps = sorted(metadata.get("tensor_maps", ()), key=lambda m: m["param"])
    if not maps:
        return types, names, []
    names = [*names, *(m["name"] for m in maps)]
    return [*types, *(TensorMapType() for _ in maps)], names, [TensorMapRecipe.from_json(m, names) for m in maps]


def interpret_device_arrays(kernel: "Kernel", bound: BoundArguments, grid: tuple[int, ...]) -> None:
    """TESSERA_INTERPRET=1 with torch CUDA tensors: copy in, run on the CPU interpreter, copy back."""
    staged, copy_back = [], []
    for arg in bound.runtime_args:
        if not isinstance(arg, DeviceArray):
            staged.append(arg)
            continue
        if not type(arg.obj).__module__.startswith("torch"):
            raise KernelArgumentError("TESSERA_INTERPRET=1 can copy torch CUDA tensors to the host, not "
                                      f"{type(arg.obj).__name__} objects; pass numpy arrays", kernel=kernel.name)
        host = arg.obj.detach().cpu().contiguous()
        staged.append(TypedArray(_numpy_view(host, arg.dtype), arg.dtype))
        copy_back.append((arg.obj, host))
    kernel.interpret_bound(kernel._specialization(bound), bound, grid, runtime_args=staged)
    for device_tensor, host in copy_back:
        device_tensor.copy_(host)


def _numpy_view(host_tensor: Any, dtype: dt.DType) -> np.ndarray:
    """A numpy array sharing the host tensor's memory (raw bits for dtypes numpy lacks)."""
    import torch

    if dtype in (dt.bf16, dt.f8e4m3, dt.f8e5m2):
        bits = torch.int16 if dtype.bits == 16 else torch.uint8
        return host_tensor.view(bits).numpy().view(dtype.storage_dtype)
    return host_tensor.numpy()
