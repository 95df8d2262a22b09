"""Every kernel launch a library op makes, also compiled for the GPU targets in strict mode.

`compiled_launches(targets)` is a context manager: inside it, each launch
(`kernel[grid](...)`, autotuned or not) first compiles the specialization its
arguments select for each target -- strict on NVIDIA, so a `tessera.pipeline`
that gets less than it asks for is a CompileError, as on the GPU -- and then
runs on the interpreter as usual, so the op's results can still be checked.
An autotuned kernel launched without a config compiles with each of its
configs (the GPU may pick any). Each distinct (kernel, specialization, target,
num_warps) is compiled once per process; the list the context yields holds
one `Compiled` per launch, for tests that read the PTX.

Why here and not in each test: an op's alignment bugs are in the arguments it
passes (ALIGN, PIPELINED, strides of views into bigger tensors), which only
running the op itself produces; hand-built signatures miss exactly those.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

from tessera.dsl.autotune import AutotunedKernel
from tessera.dsl.fast_launch import launches_recorded

NVIDIA = ("sm_80", "sm_90a")
_COMPILED: dict[tuple, Any] = {}


@dataclass(frozen=True)
class Compiled:
    """One launch's compile for one target: the kernel's name, its constexprs, and the compiled kernel."""

    kernel: str
    target: str
    constexprs: dict
    compiled: Any

    @property
    def ptx(self) -> str:
        return self.compiled.stages.get("ptx", "")


def _variants(kernel, kwargs: dict) -> list[tuple[Any, dict]]:
    """(plain kernel, keyword arguments) for each way the GPU could run this launch."""
    if not isinstance(kernel, AutotunedKernel):
        return [(kernel, dict(kwargs))]
    if kernel.tuned_names <= set(kwargs):
        return [(kernel.kernel, dict(kwargs))]
    return [(kernel.kernel, {**kwargs, **config.as_dict()}) for config in kernel.tuner.configs]


def _compile(kernel, target: str, args: tuple, kwargs: dict) -> Compiled:
    options = dict(kwargs)
    num_warps = options.pop("num_warps", 4)
    options.pop("stream", None)
    bound = kernel._bind(args, options)
    key = (kernel.name, kernel.source.source_hash, bound.key, target, num_warps)
    if key not in _COMPILED:
        strict = target != "gfx942"     # no asynchronous copies on AMD yet: a plain loop there is expected
        _COMPILED[key] = kernel.compile(*args, target=target, num_warps=num_warps, strict=strict, **options)
    constexprs = {k: v for k, v in options.items() if k in kernel.source.constexpr_params}
    return Compiled(kernel.name, target, constexprs, _COMPILED[key])


@contextlib.contextmanager
def compiled_launches(targets=NVIDIA) -> Iterator[list[Compiled]]:
    """Inside, every launch compiles for each of `targets` (see the module docstring), then runs."""
    seen: list[Compiled] = []

    def record(kernel, grid, args, kwargs):
        for plain, options in _variants(kernel, kwargs):
            for target in targets:
                seen.append(_compile(plain, target, args, options))
        with launches_recorded(None):
            kernel[grid](*args, **kwargs)

    with launches_recorded(record):
        yield seen
