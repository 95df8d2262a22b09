"""The lowering table: thread-IR op name -> the function that emits its LLVM IR.

Each family module (`llvm_ops.py`, `llvm_memory.py`, `llvm_thread.py`, and
the control flow in `llvm_codegen.py`) registers its ops:

    @lowering("add", "sub")
    def _arith(lw, op, a, b): ...

A lowering function receives the function-wide `llvm_codegen.Lowering`
(builder, module, target, helpers), the `Operation` and the LLVM values of
its operands, and returns the LLVM value of its result, a list (one per
result) for multi-result ops, or None. The validator rejects any op that
has no entry here before LLVM sees anything.
"""

from __future__ import annotations

from typing import Callable

LOWERINGS: dict[str, Callable] = {}


def lowering(*names: str) -> Callable[[Callable], Callable]:
    """Register the decorated function as the NVPTX lowering of ops `names`."""

    def register(fn: Callable) -> Callable:
        for name in names:
            if name in LOWERINGS:
                raise RuntimeError(f"NVPTX lowering for op {name!r} defined twice")
            LOWERINGS[name] = fn
        return fn

    return register
