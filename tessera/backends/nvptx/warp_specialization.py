"""NVPTX codegen of the warp-specialization ops (`ir/warp_specialization_ops.py`).

* `setmaxnreg {action, count}` is `setmaxnreg.{inc,dec}.sync.aligned.u32 count`
  (`llvm.nvvm.setmaxnreg.*`, sm_90a only). ptxas honours it only when it
  knows the register count at entry: the kernel has `.maxntid` (always
  emitted) and, so that the count is fixed, `.minnctapersm 1` (the dialect
  adds `"nvvm.minctasm"="1"` to kernels that use it; without it ptxas warns
  "setmaxnreg ignored").
* `elect_sync` is `elect.sync %r|%p, 0xffffffff` (`llvm.nvvm.elect.sync`,
  which returns {the elected lane, i1 whether this lane is it}; sm_90+). The
  member mask is the full warp, so every lane must execute it (the
  simulator checks that): electing among the active lanes of divergent code
  (activemask) could elect two leaders when the warp is not converged.
* `named_barrier {id, count}` is `bar.sync id, count`
  (`llvm.nvvm.barrier.cta.sync.aligned.count`, every NVIDIA target); with
  `arrive`, `bar.arrive id, count` (`...arrive.aligned.count`).

`check_op` refuses setmaxnreg and elect_sync where the target lacks them,
before LLVM (which aborts on "Cannot select").
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir.core import Function, Operation
from tessera.ir.target import Target

from ..llvm.types import I32
from .codegen_table import codegen_for

FULL_WARP = -1   # 0xffffffff
NEEDS = {"setmaxnreg": ("setmaxnreg", "sm_90a"), "elect_sync": ("mbarrier", "sm_90+")}


def check_op(op: Operation, target: Target) -> str | None:
    """Why `op` cannot run on `target`, or None."""
    need = NEEDS.get(op.name)
    if need is not None and not target.has(need[0]):
        return (f"{op.name} needs {need[1]}, which {target.name} is not: compile for sm_90a, or leave warp "
                "specialization out of kernels for this target")
    return None


def uses_setmaxnreg(fn: Function) -> bool:
    return any(op.name == "setmaxnreg" for op in fn.walk())


@codegen_for("setmaxnreg")
def _setmaxnreg(lw, op):
    lw.intrinsic(f"llvm.nvvm.setmaxnreg.{op.attrs['action']}.sync.aligned.u32", [ir.Constant(I32, op.attrs["count"])])


@codegen_for("elect_sync")
def _elect_sync(lw, op):
    elected = lw.intrinsic("llvm.nvvm.elect.sync", [ir.Constant(I32, FULL_WARP)])
    return lw.builder.extract_value(elected, 1)


@codegen_for("named_barrier")
def _named_barrier(lw, op):
    name = "arrive" if op.attrs.get("arrive") else "sync"
    lw.intrinsic(f"llvm.nvvm.barrier.cta.{name}.aligned.count",
                 [ir.Constant(I32, op.attrs["id"]), ir.Constant(I32, op.attrs["count"])])
