"""The exceptions the NVPTX backend raises; every failure is one of these, never a crash.

* `LoweringError`: the thread IR asks for something this backend does not
  support (a dtype, an op, a target, a missing attribute). It names the
  kernel, the op and its source line, and what to change.
* `PtxasError`: ptxas rejected the PTX or is missing/too old; the message
  carries ptxas's own stderr.
* `BackendError`: the base class, also raised when LLVM itself fails (its
  message included) or crashed in an isolated child process.
"""

from __future__ import annotations


class BackendError(RuntimeError):
    """Compiling thread IR to PTX/cubin failed."""


class LoweringError(BackendError):
    """The thread IR uses something the NVPTX backend cannot lower."""

    def __init__(self, message: str, *, kernel: str | None = None, op: str | None = None, loc=None):
        self.message = message
        self.kernel = kernel
        self.op = op
        self.loc = loc
        where = []
        if kernel is not None:
            where.append(f"kernel '{kernel}'")
        if op is not None:
            where.append(f"op `{op}`")
        prefix = f"{loc}: " if loc is not None else ""
        context = f"in {', '.join(where)}: " if where else ""
        super().__init__(f"{prefix}{context}{message}")


class PtxasError(BackendError):
    """ptxas failed (or cannot be found / is too old); `stderr` is what it printed."""

    def __init__(self, message: str, stderr: str = ""):
        self.stderr = stderr
        super().__init__(f"{message}\n{stderr.rstrip()}" if stderr.strip() else message)
