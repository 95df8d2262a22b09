"""mbarrier and TMA thread ops -> LLVM NVVM intrinsics (sm_90+; see `tessera/ir/bulk_async_ops.py`).

| op                          | PTX (intrinsic in `intrinsics.SM90_FIXED`)                                |
| --------------------------- | ------------------------------------------------------------------------- |
| mbarrier_init               | mbarrier.init.shared.b64 [bar], count                                     |
| mbarrier_inval              | mbarrier.inval.shared.b64 [bar]                                           |
| mbarrier_arrive             | mbarrier.arrive.shared.b64 _, [bar], 1 (release, CTA scope)               |
| mbarrier_arrive_expect_tx   | mbarrier.arrive.expect_tx.shared.b64 _, [bar], tx                         |
| mbarrier_expect_tx          | mbarrier.expect_tx.relaxed.cta.shared.b64 [bar], tx                       |
| mbarrier_wait               | a loop around mbarrier.try_wait.parity.shared.b64 p, [bar], parity        |
| fence_mbarrier_init         | fence.mbarrier_init.release.cluster                                       |
| fence_proxy_async           | fence.proxy.async.shared::cta                                             |
| fence_proxy_async_global    | fence.proxy.async.global                                                  |
| tma_load                    | cp.async.bulk.tensor.<r>d.shared::cluster.global.tile.mbarrier::complete_tx::bytes |
| tma_store                   | cp.async.bulk.tensor.<r>d.global.shared::cta.tile.bulk_group              |
| bulk_commit_group           | cp.async.bulk.commit_group                                                |
| bulk_wait_group_read        | cp.async.bulk.wait_group.read N                                           |
| bulk_wait_group             | cp.async.bulk.wait_group N                                                |

`mbarrier_wait` loops because `try_wait` may give up after a
hardware-chosen time; the loop is the blocking wait CUTLASS and Triton emit.
`tma_load` passes the destination as a shared::cluster address (the
intrinsic's addrspace(7), which for a CTA's own shared memory is the same
location), the tensor map by the address of its kernel parameter, and the
coordinates innermost first, the reverse of the
IR's numpy order; cache hints are off, and multicast (`{multicast = mask}`)
is on where the op asks for it (`cluster.py`). A kernel using TMA
aligns its dynamic shared memory to 1024 bytes, so that 128B-swizzled
boxes at 1024-byte offsets are 1024-byte aligned.

A `tensormap` parameter is `ptr byval([128 x i8]) align 64 "nvvm.grid_constant"`
(`tensor_map_parameter`): LLVM 22 takes the grid-constant mark as this
parameter attribute (the older `!nvvm.annotations` "grid_constant" entry is
upgraded to it). Without the mark, taking the byval parameter's address
makes LLVM copy the 128 bytes to local memory; with it, the PTX parameter
is `.param .align 64 .b8 <name>[128]` and the TMA instruction reads it in
place through `cvta.param` (PTX allows a generic address of a param map).

The ops need the target features in `REQUIRED_FEATURES`; `NvptxDialect.check_op`
rejects them elsewhere, before LLVM (which would abort on "Cannot select").
"""

from __future__ import annotations

from llvmlite import ir

from ..llvm.types import I1, I16, I32, I64
from .codegen_table import codegen_for

TMA_SHARED_ALIGN = 1024
TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64
_CLUSTER_SMEM = ir.PointerType(addrspace=7)

# op -> (target feature, what to tell the user it is)
REQUIRED_FEATURES = {
    **{name: ("mbarrier", "mbarriers (sm_90+)") for name in (
        "mbarrier_init", "mbarrier_inval", "mbarrier_arrive", "mbarrier_arrive_expect_tx", "mbarrier_wait",
        "fence_mbarrier_init", "mbarrier_expect_tx")},
    "fence_proxy_async": ("mbarrier", "the async proxy (sm_90+: TMA, wgmma)"),
    "fence_proxy_async_global": ("tma", "the async proxy (sm_90+: TMA)"),
    **{name: ("tma", "the Tensor Memory Accelerator (sm_90+)") for name in (
        "tma_load", "tma_store", "bulk_commit_group", "bulk_wait_group_read", "bulk_wait_group")},
}


class _GridConstantMap(ir.values.ArgumentAttributes):
    """The parameter attributes of a by-value tensor map (llvmlite's fixed list has no typed byval for opaque
    pointers, nor string attributes)."""

    def _to_list(self, typ):
        return [f"byval([{TENSOR_MAP_BYTES} x i8])", f"align {TENSOR_MAP_ALIGN}", '"nvvm.grid_constant"',
                *super()._to_list(typ)]


def tensor_map_parameter(param: ir.Argument) -> None:
    """Make `param` the 128-byte CUtensorMap passed by value as a grid constant (see the module docstring)."""
    param.attributes = _GridConstantMap()


@codegen_for("mbarrier_init")
def _init(lw, op, bar, count):
    lw.intrinsic("llvm.nvvm.mbarrier.init.shared", [bar, count])


@codegen_for("mbarrier_inval")
def _inval(lw, op, bar):
    lw.intrinsic("llvm.nvvm.mbarrier.inval.shared", [bar])


@codegen_for("mbarrier_arrive")
def _arrive(lw, op, bar):
    lw.intrinsic("llvm.nvvm.mbarrier.arrive.scope.cta.space.cta", [bar, ir.Constant(I32, 1)])


@codegen_for("mbarrier_arrive_expect_tx")
def _arrive_expect_tx(lw, op, bar, tx_bytes):
    lw.intrinsic("llvm.nvvm.mbarrier.arrive.expect.tx.scope.cta.space.cta", [bar, tx_bytes])


@codegen_for("mbarrier_expect_tx")
def _expect_tx(lw, op, bar, tx_bytes):
    lw.intrinsic("llvm.nvvm.mbarrier.expect.tx.scope.cta.space.cta", [bar, tx_bytes])


@codegen_for("mbarrier_wait")
def _wait(lw, op, bar, parity):
    b = lw.builder
    loop, done = lw.new_block("mbarrier.wait"), lw.new_block("mbarrier.ready")
    b.branch(loop)
    b.position_at_end(loop)
    ready = lw.intrinsic("llvm.nvvm.mbarrier.try.wait.parity.scope.cta.space.cta", [bar, parity])
    b.cbranch(ready, done, loop)
    b.position_at_end(done)


@codegen_for("fence_mbarrier_init")
def _fence_mbarrier_init(lw, op):
    lw.intrinsic("llvm.nvvm.fence.mbarrier_init.release.cluster", [])


@codegen_for("fence_proxy_async")
def _fence_proxy_async(lw, op):
    lw.intrinsic("llvm.nvvm.fence.proxy.async.shared_cta", [])


@codegen_for("fence_proxy_async_global")
def _fence_proxy_async_global(lw, op):
    lw.intrinsic("llvm.nvvm.fence.proxy.async.global", [])


@codegen_for("tma_load")
def _tma_load(lw, op, dst, tensor_map, *rest):
    *coords, bar = rest
    smem = lw.shared_memory
    smem.align = max(smem.align or 0, TMA_SHARED_ALIGN)
    b = lw.builder
    mask = op.attrs.get("multicast", 0)     # .multicast::cluster to these cluster ranks (`cluster.py`)
    args = [b.addrspacecast(dst, _CLUSTER_SMEM), bar, tensor_map, *reversed(coords),
            ir.Constant(I16, mask), ir.Constant(I64, 0), ir.Constant(I1, int(mask != 0)), ir.Constant(I1, 0),
            ir.Constant(I32, 0)]
    lw.intrinsic(f"llvm.nvvm.cp.async.bulk.tensor.g2s.tile.{len(coords)}d", args)


@codegen_for("tma_store")
def _tma_store(lw, op, src, tensor_map, *coords):
    smem = lw.shared_memory
    smem.align = max(smem.align or 0, TMA_SHARED_ALIGN)
    args = [src, tensor_map, *reversed(coords), ir.Constant(I64, 0), ir.Constant(I1, 0)]
    lw.intrinsic(f"llvm.nvvm.cp.async.bulk.tensor.s2g.tile.{len(coords)}d", args)


@codegen_for("bulk_commit_group")
def _bulk_commit_group(lw, op):
    lw.intrinsic("llvm.nvvm.cp.async.bulk.commit.group", [])


@codegen_for("bulk_wait_group_read")
def _bulk_wait_group_read(lw, op):
    lw.intrinsic("llvm.nvvm.cp.async.bulk.wait.group.read", [ir.Constant(I32, op.attrs["pending"])])


@codegen_for("bulk_wait_group")
def _bulk_wait_group(lw, op):
    lw.intrinsic("llvm.nvvm.cp.async.bulk.wait.group", [ir.Constant(I32, op.attrs["pending"])])
