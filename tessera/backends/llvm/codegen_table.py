"""LLVM codegen tables (`OpTable`s): thread-IR op name -> the function that emits its LLVM IR.

`COMMON` holds every target-neutral op (elementwise, casts, memory,
registers, control flow, and the thread ops whose LLVM differs per target
but whose shape does not: they ask the `TargetDialect` for the details).
Each target layers its own table over it for the ops only it has:

    NVPTX = OpTable("NVPTX codegen", base=COMMON)

    @NVPTX.register("ldmatrix")
    def _ldmatrix(lw, op, row): ...

A codegen function receives the function-wide `codegen.Codegen`
(builder, module, target, dialect, helpers), the `Operation` and the LLVM
values of its operands, and returns the LLVM value of its result, a list
(one per result) for multi-result ops, or None. The validator rejects any
op that has no entry in the target's table before LLVM sees anything.
"""

from __future__ import annotations

from tessera.ir.op_table import OpTable

COMMON = OpTable("common LLVM codegen")
codegen_for = COMMON.register  # `@codegen_for("add", "sub")` registers a target-neutral codegen function
