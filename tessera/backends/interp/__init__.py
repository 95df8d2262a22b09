"""The tile interpreter: execute tile IR on the CPU with numpy (the author's debug mode). It may import
`tessera.ir` only; the SIMT simulator (`tessera.backends.simt`) builds on its values and semantics.

    from tessera.backends.interp import Memory, run_function
    run_function(fn, [x, y, out, n], grid=(4,))        # numpy arrays written in place
    run_program(fn, args, program_id=(2,), grid=(4,))  # just one program instance
    run_function(fn, args, grid=(8,), resident=2)      # programs that spin on each other: 2 live at once

Programs that wait for each other (spin loops on flags, ticket queues) run on a cooperative scheduler
(`cooperative.py`); a deadlock is an `InterpreterError` naming the waiting loops.

`Memory(array, dtype)` views a numpy array as kernel memory of `dtype` (a
uint16 array as bf16, a uint8 array as packed u4). Everything the kernel
does wrong (out-of-bounds access, integer division by zero, a failed
assert) raises `InterpreterError` with the op's source location.
"""

from .errors import InterpreterError
from .interpreter import ProgramInstance, bind_arguments, run_function, run_program
from .registry import SEMANTICS, semantics
from .storage import Memory
from .values import Pointers, View

__all__ = [
    "InterpreterError", "Memory", "Pointers", "ProgramInstance", "SEMANTICS", "View",
    "bind_arguments", "run_function", "run_program", "semantics",
]
