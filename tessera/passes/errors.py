"""Errors raised by passes.

`LoweringError` says that a program is valid tile IR but cannot be compiled
for the chosen target and configuration as it stands: a tile that needs more
shared memory than the block has, a layout that does not fit the block's
threads, an op the thread-level lowering does not handle yet. The message
names the op (and its source line when known) and what to change; the
frontend turns it into a `CompileError` like the IR's own errors.

`PipelineWarning` says that a valid program was compiled with less than it
asked for: a `tessera.pipeline` loop with fewer stages, without async
copies, TMA or warp specialization. The compile driver shows it at the
loop's source line, or raises it as a `CompileError` in strict mode. Its
kind `UnpipelinedLoopWarning` says that a plain loop feeding a dot, which
the compiler pipelines on its own where it may, was not: shown (as an
error) in strict mode only, since nobody asked for the pipeline.
"""

from __future__ import annotations

from tessera.ir.core import Operation
from tessera.ir.errors import IRError, located


class LoweringError(IRError):
    """A valid program that cannot be lowered as configured; the message says what to change."""

    def __init__(self, message: str, op: Operation | None = None, kernel: str | None = None):
        self.message = message
        self.op = op
        self.kernel = kernel
        self.loc = op.loc if op is not None else None
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.kernel is not None:
            where.append(f"kernel '{self.kernel}'")
        if self.op is not None:
            where.append(f"op '{self.op.name}'")
        return located(self.message, self.loc, where)


class PipelineWarning(UserWarning):
    """A `tessera.pipeline` loop gets less than it asked for; the message says what, why and what to change."""

    def __init__(self, message: str, loc=None):
        super().__init__(message)
        self.message = message
        self.loc = loc


class UnpipelinedLoopWarning(PipelineWarning):
    """A plain loop feeding a tensor-core dot is not (fully) software-pipelined; the message says why and how to
    opt out. Only strict mode shows it (`schedule/auto_pipeline.py`)."""
