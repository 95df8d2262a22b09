"""`FusedKernel`: a tile-IR function the fusion pass built, run like a kernel launch.

A fused function has no Python source, so it does not go through `Kernel`:
host arrays run it on the CPU tile interpreter (as do GPU tensors under
`TESSERA_INTERPRET=1`, copied in and back); GPU tensors compile it for the
device and launch it on the caller's stream. Its binary is kept in memory
per (target, warp count) and on disk (`BinaryCache`) under a key made of
the function's printed IR, with source locations (debug builds print them),
in place of a kernel's source: the IR is all a fused function is (the
constexprs, dtypes and divisibility facts of the launches it came from are
in it), so a second process, or a new capture of the same launches, loads
the binary instead of compiling it.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Sequence

from ..backends.interp import Memory, run_function
from ..ir.core import Function, Module
from ..ir.printer import print_module
from ..runtime.cache import BinaryCache, CacheEntry
from ..runtime.cache_key import cache_key
from .arguments import DeviceArray, TypedArray
from .errors import KernelArgumentError
from .gpu_launch import _numpy_view, _tool_identity, gpu_runtime, launch_parameters
from .modes import debug_mode


class FusedKernel:
    def __init__(self, fn: Function):
        self.fn = fn
        self.launchers: dict[tuple, Any] = {}
        self.ir_hash = hashlib.sha256(print_module(Module([fn]), locations=True).encode()).hexdigest()

    @property
    def name(self) -> str:
        return self.fn.name

    def run(self, grid: tuple[int, ...], args: Sequence[Any], *, num_warps: int = 4, stream: Any = None) -> None:
        """Launch over `grid` with `args`: one runtime value per parameter (TypedArray / DeviceArray / scalar)."""
        if not any(isinstance(a, DeviceArray) for a in args):
            run_function(self.fn, [_host(a) for a in args], grid)
        elif os.environ.get("TESSERA_INTERPRET", "0") == "1":
            self._interpret_device(grid, args)
        else:
            self._launch_on_gpu(grid, args, num_warps, stream)

    def binary(self, target: str, num_warps: int = 4) -> CacheEntry:
        """The compiled fused function for `target`: from the disk cache, or compiled now and stored there."""
        from ..ir.target import get_target

        debug = debug_mode()
        options = {"num_warps": num_warps, "debug": debug, "fused": True, **_tool_identity(get_target(target).vendor)}
        key = cache_key(self.ir_hash, (), (), options, target)

        def compile_now() -> CacheEntry:
            from .compiler import compile_tile_module

            return CacheEntry.from_compiled(compile_tile_module(Module([self.fn]), target=target,
                                                                num_warps=num_warps, debug=debug))

        return BinaryCache().get_or_compile(key, compile_now)

    def _interpret_device(self, grid, args) -> None:
        staged, copy_back = [], []
        for arg in args:
            if isinstance(arg, DeviceArray):
                host = arg.obj.detach().cpu().contiguous()
                staged.append(TypedArray(_numpy_view(host, arg.dtype), arg.dtype))
                copy_back.append((arg.obj, host))
            else:
                staged.append(arg)
        run_function(self.fn, [_host(a) for a in staged], grid)
        for device_tensor, host in copy_back:
            device_tensor.copy_(host)

    def _launch_on_gpu(self, grid, args, num_warps: int, stream) -> None:
        from ..runtime.launcher import KernelBinary, Launcher, cluster_shape
        from ..runtime.packing import check_kernarg_layout

        if any(isinstance(a, TypedArray) for a in args):
            raise KernelArgumentError("the fused launch mixes host arrays and GPU tensors; move every array to "
                                      "the same GPU (or all to the host to run on the CPU interpreter)",
                                      kernel=self.name)
        runtime = gpu_runtime(self.name)
        ordinal = next(a.device for a in args if isinstance(a, DeviceArray))
        device = runtime.get_device(ordinal or 0)
        key = (device.target, num_warps)
        launcher = self.launchers.get(key)
        if launcher is None:
            entry = self.binary(device.target, num_warps)
            metadata = entry.metadata
            shared = metadata.get("dynamic_shared_bytes", metadata.get("shared_bytes"))
            binary = KernelBinary(entry.name, entry.target, entry.binary, entry.ptx or None,
                                  int(metadata["num_threads"]), int(shared or 0), cluster_shape(metadata))
            types, names, recipes = launch_parameters([a.type for a in self.fn.args],
                                                      [a.name_hint or f"arg{i}" for i, a in enumerate(self.fn.args)],
                                                      metadata)
            launcher = Launcher(binary, types, backend=device.backend, names=names, tensor_maps=recipes)
            if "kernel_args" in metadata:  # AMD: the code object says where it reads each argument
                check_kernarg_layout(launcher.packer, metadata["kernel_args"])
            self.launchers[key] = launcher
        launcher(grid, [a.obj if isinstance(a, DeviceArray) else a for a in args], stream=stream)


def _host(arg: Any) -> Any:
    return Memory(arg.array, arg.dtype) if isinstance(arg, TypedArray) else arg
