"""The one exception the interpreter raises for a kernel that does something wrong.

An `InterpreterError` says where (the op's source location), in which kernel
and program instance, which op, what went wrong and, where we can tell, what
to change ("mask off out-of-range lanes", "pass np.ascontiguousarray(x)").
"""

from __future__ import annotations

from tessera.ir.errors import located


class InterpreterError(RuntimeError):
    """A kernel run on the CPU did something the hardware would not survive or define."""

    def __init__(self, message: str, *, op: str | None = None, loc=None, kernel: str | None = None,
                 program_id: tuple[int, ...] | None = None):
        self.message = message
        self.op = op
        self.loc = loc
        self.kernel = kernel
        self.program_id = program_id
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.kernel is not None:
            where.append(f"kernel '{self.kernel}'")
        if self.program_id is not None:
            where.append(f"program {self.program_id}")
        if self.op is not None:
            where.append(f"op '{self.op}'")
        return located(self.message, self.loc, where)
