"""The exceptions every LLVM backend raises; every failure is one of these, never a crash.

* `CodegenError`: the thread IR asks for something the backend does not
  support (a dtype, an op, a target, a missing attribute). It names the
  kernel, the op and its source line, and what to change.
* `BackendError`: the base class, also raised when LLVM itself fails (its
  message included), crashed in the compile worker process, or a tool the
  backend runs afterwards (ptxas, ld.lld) fails or is missing.
* `CompileTimeoutError`: LLVM (or ptxas, ld.lld) ran past the compile time
  limit (`TESSERA_COMPILE_TIMEOUT`); names the kernel, the target and the limit.
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


class CompileTimeoutError(BackendError):
    """A compile step ran past the time limit and was stopped."""

    def __init__(self, kernel: str, target: str, limit_s: float, step: str = "LLVM"):
        self.kernel = kernel
        self.target = target
        self.limit_s = limit_s
        super().__init__(f"{step} did not finish compiling kernel '{kernel}' for {target} within the {limit_s:g} s "
                         f"limit and was stopped. Smaller tiles (fewer elements per thread: a smaller block, "
                         f"more warps, or a loop over pieces of the tile) compile faster; "
                         f"TESSERA_COMPILE_TIMEOUT=<seconds> raises the limit.")
