"""What a `tessera.pipeline` loop asked for and did not get, said out loud.

The scheduling transforms fall back to what they can do -- fewer stages,
cp.async instead of TMA, no producer warpgroup, a plain loop -- and each
such fallback is a `PipelineWarning` at the loop (`shortfall`) naming the
reason. The compile driver shows it at the user's source line, or in strict
mode (`TESSERA_STRICT=1`, `kernel.compile(..., strict=True)`) raises it as
a `CompileError`. The planners collect their reasons with `refuse`.
"""

from __future__ import annotations

import warnings

from tessera.ir.core import Operation

from ..errors import PipelineWarning


def refuse(why: list[str], reason: str) -> None:
    """Record why a plan was not made; returns None, the planners' "no plan"."""
    why.append(reason)
    return None


def shortfall(ctx, op: Operation, message: str) -> None:
    """Warn that a loop gets less than it asked for (`message`: what, why, and what to change), located at `op`
    (the loop, or what keeps it from its schedule); the kernel's `lowering_notes` keep it too."""
    ctx.notes.append(f"{op.name}{f' at {op.loc}' if op.loc else ''}: {message}")
    warnings.warn(PipelineWarning(message, op.loc), stacklevel=2)


def place(op: Operation) -> str:
    """Where `op` is in the user's source, for messages about one of several ops of a loop."""
    return f"line {op.loc.line}, column {op.loc.column + 1}" if op.loc is not None else "an unknown line"
