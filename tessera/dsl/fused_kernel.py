"""`FusedKernel`: a tile-IR function the fusion pass built, run like a kernel launch.

A fused function has no Python source, so it does not go through `Kernel`:
host arrays run it on the CPU tile interpreter (as do GPU tensors under
`TESSERA_INTERPRET=1`, copied in and back); GPU tensors compile it for the
device (once per target and warp count, kept in memory: the disk cache keys
on a kernel's source) and launch it on the caller's stream.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from ..backends.interp import Memory, run_function
from ..ir.core import Function, Module
from .arguments import DeviceArray, TypedArray
from .gpu_launch import _numpy_view, gpu_runtime, launch_parameters


class FusedKernel:
    def __init__(self, fn: Function):
        self.fn = fn
        self.launchers: dict[tuple, Any] = {}

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
        from ..runtime.launcher import KernelBinary, Launcher
        from .compiler import compile_tile_module

        runtime = gpu_runtime(self.name)
        ordinal = next(a.device for a in args if isinstance(a, DeviceArray))
        device = runtime.get_device(ordinal or 0)
        key = (device.target, num_warps)
        launcher = self.launchers.get(key)
        if launcher is None:
            compiled = compile_tile_module(Module([self.fn]), target=device.target, num_warps=num_warps)
            metadata = compiled.metadata
            shared = metadata.get("dynamic_shared_bytes", metadata.get("shared_bytes"))
            binary = KernelBinary(compiled.name, compiled.target, compiled.binary, compiled.stages.get("ptx") or None,
                                  int(metadata["num_threads"]), int(shared or 0))
            types, names, recipes = launch_parameters([a.type for a in self.fn.args],
                                                      [a.name_hint or f"arg{i}" for i, a in enumerate(self.fn.args)],
                                                      metadata)
            launcher = self.launchers[key] = Launcher(binary, types, backend=device.backend, names=names,
                                                      tensor_maps=recipes)
        launcher(grid, [a.obj if isinstance(a, DeviceArray) else a for a in args], stream=stream)


def _host(arg: Any) -> Any:
    return Memory(arg.array, arg.dtype) if isinstance(arg, TypedArray) else arg
