"""The exceptions every LLVM backend raises; every failure is one of these, never a crash.

* `CodegenError`: the thread IR asks for something the backend does not
  support (a dtype, an op, a target, a missing attribute). It names the
  kernel, the op and its source line, and what to change.
* `BackendError`: the base class, also raised when LLVM itself fails (its
  message included), crashed in an isolated child process, or a tool the
  backend runs afterwards (ptxas, ld.lld) fails or is missing.
"""

from __future__ import annotations

from tessera.ir.errors import located


class BackendError(RuntimeError):
    """Compiling thread IR to GPU code failed."""


class CodegenError(BackendError):
    """The thread IR uses something the backend cannot lower."""

    def __init__(self, message: str, *, kernel: str | None = None, op: str | None = None, loc=None,
                 op_name: str | None = None):
        self.message = message
        self.kernel = kernel
        self.op = op                # the op as printed (thread IR)
        self.op_name = op_name      # its name alone ("exp"), for messages at the user's source line
        self.loc = loc
        where = []
        if kernel is not None:
            where.append(f"kernel '{kernel}'")
        if op is not None:
            where.append(f"op `{op}`")
        super().__init__(located(message, loc, where))
