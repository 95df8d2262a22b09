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

`allowed` names shortfalls a test accepts on a target (substrings of the
PipelineWarning, e.g. varlen's "cp.async instead of TMA" on sm_90a, which
`test_attention_compile.compile_checked` documents): such a compile runs
non-strict and fails on any other shortfall. A kernel's own accepted
shortfalls (`tessera.kernel(tolerate=...)`, decode's) stay warnings in
strict mode, and are not counted as others. gfx942 compiles
non-strict (some AMD loops stay one stage, their LDS short for a ring, and
other ops' loads are not yet direct-to-LDS), so there it checks only that
the launch compiles.

Why here and not in each test: an op's alignment bugs are in the arguments it
passes (ALIGN, PIPELINED, strides of views into bigger tensors), which only
running the op itself produces; hand-built signatures miss exactly those.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

from tessera import PipelineWarning
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


def _compile(kernel, target: str, args: tuple, kwargs: dict, allowed: tuple[str, ...]) -> Compiled:
    options = dict(kwargs)
    num_warps = options.pop("num_warps", 4)
    options.pop("stream", None)
    bound = kernel._bind(args, options)
    key = (kernel.name, kernel.source.source_hash, bound.key, target, num_warps, allowed)
    if key not in _COMPILED:
        strict = target != "gfx942" and not allowed
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _COMPILED[key] = kernel.compile(*args, target=target, num_warps=num_warps, strict=strict, **options)
        accepted = allowed + kernel.tolerate        # the test's, and the kernel's own (`tessera.kernel(tolerate=)`)
        other = [str(w.message) for w in caught if issubclass(w.category, PipelineWarning)
                 and target != "gfx942" and not any(a in str(w.message) for a in accepted)]
        assert not other, f"{kernel.name} on {target}: shortfalls beyond {allowed}: {other}"
    constexprs = {k: v for k, v in options.items() if k in kernel.source.constexpr_params}
    return Compiled(kernel.name, target, constexprs, _COMPILED[key])


@contextlib.contextmanager
def compiled_launches(targets=NVIDIA, allowed: dict[str, tuple[str, ...]] | None = None) -> Iterator[list[Compiled]]:
    """Inside, every launch compiles for each of `targets` (see the module docstring), then runs. `allowed`:
    per target, the shortfalls accepted there."""
    seen: list[Compiled] = []
    allowed = allowed or {}

    def record(kernel, grid, args, kwargs):
        for plain, options in _variants(kernel, kwargs):
            for target in targets:
                seen.append(_compile(plain, target, args, options, tuple(allowed.get(target, ()))))
        with launches_recorded(None):
            kernel[grid](*args, **kwargs)

    with launches_recorded(record):
        yield seen
