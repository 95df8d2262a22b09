"""The semantics table: op name -> the Python function that executes it.

Each family module (`elementwise.py`, `memory.py`, ...) registers its ops
in the `OpTable` (`ir/op_table.py`):

    @semantics("add", "sub", "mul")
    def _arith(ctx, op, a, b): ...

A semantics function receives the program instance `ctx` (see
`interpreter.ProgramInstance`: program id, grid, region runner, errors), the
`Operation` and the runtime values of its operands, and returns its result:
the value itself for a one-result op, None for a no-result op, or (with
`multi=True`) a sequence with one value per result, as control flow does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tessera.ir.op_table import OpTable


@dataclass(frozen=True)
class Semantics:
    fn: Callable
    multi: bool = False  # returns a sequence of results rather than one value


SEMANTICS = OpTable("interpreter semantics", entry=Semantics)
semantics = SEMANTICS.register      # @semantics("add", "sub"), or @semantics("for", multi=True)


def apply_semantics(ctx, sem: Semantics, op, values: list, where: str):
    """Run `sem` on `op`; errors raised below the op (by Memory, say) get the op's location.

    `where` names the running instance in notes added to unexpected
    exceptions ("program (1, 0, 0)", "block (0, 0, 0)"). Used by both the
    tile interpreter and the SIMT simulator.
    """
    from .control_flow import KernelReturn
    from .errors import InterpreterError

    try:
        return sem.fn(ctx, op, *values)
    except KernelReturn:
        raise
    except InterpreterError as e:
        if e.op is None:
            raise ctx.error(op, e.message) from None
        raise
    except Exception as e:
        e.add_note(f"while running '{op.name}' at {op.loc or 'unknown location'} in kernel '{ctx.fn.name}', {where}")
        raise
