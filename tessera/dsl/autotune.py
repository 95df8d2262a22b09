"""`@tessera.autotune`: launch a kernel with the fastest of several configs.

    @tessera.autotune(configs=[tessera.Config({"BLOCK": 128}, num_warps=4),
                               tessera.Config({"BLOCK": 1024}, num_warps=8)],
                      key=["n"])
    @tessera.kernel
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tessera.constexpr):
        ...

    add[lambda meta: (tessera.cdiv(meta["n"], meta["BLOCK"]),)](x, y, out, n)
    add.best_config(x, y, out, n)          # Config({'BLOCK': 1024}, num_warps=8), once tuned

The first launch for a new tuning key (the `key` arguments' values and the
array dtypes) on a device times every config and keeps the winner, in memory
and on disk (see `tessera/runtime/autotune.py` for the file, pruning and
pinning). Tuning runs the kernel on the caller's buffers, then the winner
runs once more for the real result; kernels that accumulate into an output
name it in `reset_to_zero=`, and kernels that update a buffer in place name
it in `restore_value=`.

Launches on GPU tensors prune configs by the compiled binary's resources on
the device's target (registers and spills need ptxas, shared memory does
not) and time with CUDA events (torch). Launches with host arrays run on the
CPU interpreter and are timed with `time.perf_counter`; they are pruned by
resources only when `target=` (or `metadata=`) is given. `warmup` and `rep`
count launches.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable, Iterable

from ..ir.target import DEFAULT_TARGET, get_target
from ..runtime.autotune import CPU_DEVICE, AutotuneError, Autotuner, Config, Timer, cuda_event_timer, perf_counter_timer
from .arguments import DeviceArray
from .errors import KernelArgumentError
from .fast_launch import FastLaunches, Launchable, SlowLaunch
from .kernel import LAUNCH_OPTIONS, Grid, Kernel

__all__ = ["AutotuneError", "AutotunedKernel", "Config", "autotune"]


class AutotunedKernel(Launchable):
    """A kernel whose constexpr configs are chosen by measurement. Create with `@tessera.autotune`."""

    def __init__(self, kernel: Kernel, configs: list[Config], key: list[str], *, prune=None, warmup: int = 1,
                 rep: int = 3, reset_to_zero: Iterable[str] = (), restore_value: Iterable[str] = (),
                 target: str | None = None, metadata: Callable[[Config, dict], dict] | None = None,
                 timer: Timer | None = None, model: Callable[[list[Config], dict], Config] | None = None):
        if not isinstance(kernel, Kernel):
            raise TypeError("@tessera.autotune goes above @tessera.kernel, on a kernel")
        self.kernel = kernel
        params = kernel.source.param_names
        for what, names in (("key", key), ("reset_to_zero", reset_to_zero), ("restore_value", restore_value)):
            unknown = sorted(set(names) - set(params))
            if unknown:
                raise KernelArgumentError(f"autotune {what} names unknown parameters {unknown}; the kernel's "
                                          f"parameters are {params}", kernel=kernel.name)
        for config in configs:
            unknown = sorted(set(config.kwargs) - set(kernel.source.constexpr_params))
            if unknown:
                raise KernelArgumentError(f"autotune Config({config}) sets {unknown}, which are not constexpr "
                                          f"parameters of the kernel", kernel=kernel.name)
        self.warmup, self.rep, self.target, self.metadata = warmup, rep, target, metadata
        self.tuner = Autotuner(kernel.name, kernel.source.source_hash, list(configs), list(key), prune,
                               list(reset_to_zero), list(restore_value), timer, model)
        self.tuned_names = {name for config in configs for name in config.kwargs}
        self.fast_launches = FastLaunches(kernel.launch_signature(self.tuned_names, key), self._launch_slowly)
        self.__name__, self.__doc__ = kernel.__name__, kernel.__doc__

    @property
    def name(self) -> str:
        return self.kernel.name

    def __repr__(self) -> str:
        return f"<tessera.autotune {self.name}: {len(self.tuner.configs)} configs>"

    def pin(self, config: Config | None) -> None:
        """Launch with `config` from now on, without tuning; `pin(None)` tunes again."""
        self.tuner.pin(config)
        self.fast_launches.clear()

    def best_config(self, *args, grid: Grid | None = None, **kwargs) -> Config | None:
        """The config these arguments launch with: pinned or already tuned; with `grid=`, tuned if need be."""
        named, device = self._named_arguments(args, kwargs)
        if grid is None:
            return self.tuner.lookup(named, device)
        return self._choose(args, kwargs, named, device, grid)

    def predicted_config(self, *args, **kwargs) -> tuple[Config, str]:
        """The config these arguments would launch with, found without timing anything, and how ("pinned",
        "tuned" or "model"; see `Autotuner.predict`): what `tessera.fusion()` launches an autotuned kernel with,
        since its inputs are not computed while it records."""
        named, device = self._named_arguments(args, kwargs)
        return self.tuner.predict(named, device)

    # -- launching --------------------------------------------------------

    def _launch_slowly(self, grid: Grid, args: tuple, kwargs: dict) -> SlowLaunch | None:
        """Choose the config (tuning if need be) and launch it the slow way; what ran, for the warm path."""
        named, device = self._named_arguments(args, kwargs)
        config = self._choose(args, kwargs, named, device, grid)
        done = self.kernel._launch_slowly(grid, args, {**kwargs, **config.as_dict()})
        return None if done is None else SlowLaunch(done.launcher, done.ordinal, done.by_name, dict(config.kwargs))

    def _launch(self, config: Config, args: tuple, kwargs: dict, grid: Grid) -> None:
        self.kernel.run(*args, grid=grid, **kwargs, **config.as_dict())

    def _choose(self, args: tuple, kwargs: dict, named: dict[str, Any], device: str, grid: Grid) -> Config:
        config = self.tuner.lookup(named, device)
        if config is not None:      # the common launch: no target, compile or timer needed
            return config
        on_gpu = device != CPU_DEVICE
        target = self._target(args, kwargs, on_gpu)
        metadata = None
        if self.metadata is not None:
            metadata = lambda config: self.metadata(config, named)  # noqa: E731
        elif on_gpu or self.target is not None:
            metadata = lambda config: self._compiled_metadata(config, args, kwargs, target.name)  # noqa: E731
        timer = (cuda_event_timer if on_gpu and _have_torch() else perf_counter_timer)(self.warmup, self.rep)
        return self.tuner.choose(named, device, lambda config: self._launch(config, args, kwargs, grid),
                                 metadata=metadata, target=target if metadata is not None else None, timer=timer)

    def _compiled_metadata(self, config: Config, args: tuple, kwargs: dict, target: str) -> dict:
        """The binary's resources (via the disk cache, which the real launch then reuses)."""
        launch_kwargs = {**kwargs, **config.kwargs}
        return dict(self.kernel.binary(*args, target=target, num_warps=config.num_warps, **launch_kwargs).metadata)

    def _target(self, args: tuple, kwargs: dict, on_gpu: bool):
        if self.target is not None:
            return get_target(self.target)
        if on_gpu:
            from ..runtime import cuda
            return get_target(cuda.get_device(_gpu_ordinal(self._bind(args, kwargs))).target)
        return get_target(DEFAULT_TARGET)

    def _bind(self, args: tuple, kwargs: dict):
        return self.kernel._bind(args, {k: v for k, v in {**kwargs, **self.tuner.configs[0].kwargs}.items()
                                        if k not in LAUNCH_OPTIONS})

    def _named_arguments(self, args: tuple, kwargs: dict) -> tuple[dict[str, Any], str]:
        """Every argument by name (without the tuned ones), and the name of the device the launch runs on."""
        clash = sorted(self.tuned_names & set(kwargs))
        if clash:
            raise KernelArgumentError(f"{clash} are chosen by autotune; do not pass them to the launch (use "
                                      f"{self.name}.pin(tessera.Config(...)) to fix a config)", kernel=self.name)
        if "num_warps" in kwargs and "num_warps" not in self.kernel.source.param_names:
            raise KernelArgumentError("num_warps is chosen by autotune; do not pass it to the launch",
                                      kernel=self.name)
        bound = self._bind(args, kwargs)
        named = dict(inspect.signature(self.kernel.fn).bind_partial(
            *args, **{k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS}).arguments)
        if not bound.on_device or os.environ.get("TESSERA_INTERPRET", "0") == "1":
            return named, CPU_DEVICE
        from ..runtime import cuda
        return named, cuda.get_device(_gpu_ordinal(bound)).name


def _gpu_ordinal(bound) -> int:
    return next((a.device for a in bound.runtime_args if isinstance(a, DeviceArray)), None) or 0


def _have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def autotune(configs: Iterable[Config], key: Iterable[str] = (), *, prune=None, warmup: int = 1, rep: int = 3,
             reset_to_zero: Iterable[str] = (), restore_value: Iterable[str] = (), target: str | None = None,
             metadata: Callable[[Config, dict], dict] | None = None, timer: Timer | None = None,
             model: Callable[[list[Config], dict], Config] | None = None) -> Callable[[Kernel], AutotunedKernel]:
    """Decorate a `@tessera.kernel` to launch with the fastest of `configs` per value of the `key` arguments.

    prune(configs, named_args) -> configs drops configs before timing;
    metadata(config, named_args) -> {"shared_bytes", "registers", ...}
    replaces compiling to read resources; timer(run, config) -> seconds
    replaces the clock (tests); model(configs, named_args) -> config picks
    one without timing where a launch cannot be timed (inside
    `tessera.fusion()`: see `AutotunedKernel.predicted_config`).
    """
    configs = list(configs)

    def decorate(kernel: Kernel) -> AutotunedKernel:
        return AutotunedKernel(kernel, configs, list(key), prune=prune, warmup=warmup, rep=rep,
                               reset_to_zero=reset_to_zero, restore_value=restore_value, target=target,
                               metadata=metadata, timer=timer, model=model)
    return decorate
