"""Tensor-core operands computed before a loop: put in shared memory once, before the loop.

A dot in a loop body whose A or B operand is computed before the loop
(attention's Q block) would otherwise move that operand into the form its
instruction reads in every iteration. `stage_invariant_operands`, called by
the `for` lowering before it lowers the loop, stores it once instead:

* wgmma (sm_90a) reads shared memory: the operand goes into its K-major
  tile, or MN-major for a B whose registers run along N
  (`wgmma_dot.store_operand`), and the wgmmas of every iteration read it
  there through descriptors;
* mma.sync: an operand too large to hold in registers for the whole loop
  (layout assignment left it out of its fragment layout:
  `mma.RESIDENT_OPERAND_REGISTERS`) goes into XOR-swizzled shared memory,
  and each iteration reads it with ldmatrix into short-lived registers, as
  FlashAttention-2 keeps Q; smaller ones are loaded straight into their
  fragments and stay in registers.

At the kernel's top level nothing writes a staged buffer again. Inside an
enclosing loop (a persistent kernel's tile loop) the next iteration writes
it again, and the allocator may give its bytes to a buffer after the loop
(the tile's epilogue), while another warp's last dot may still read it:
`end_staged_reads` closes such a loop's reads with a barrier, as the
allocator's contract asks (`shared_memory.py`). `ctx.staged` maps the tile-IR value to its `wgmma_dot.SharedOperand`
or `StagedFragment`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.ir.core import Operation, Value

from ..mma import mma_plan
from .mma_operands import LdmatrixPlan, ldmatrix_plan, read_fragment, store_swizzled

ROW_KEYED_MAX_BYTES = 256      # the widest rows given the row-keyed swizzle (`pipeline_plan.ROW_KEYED_MAX_BYTES`)
from .values import Regs
from .wgmma_dot import SharedOperand, await_operands, store_operand


@dataclass(frozen=True)
class StagedFragment:
    """An mma.sync operand stored once in swizzled shared memory at `buf`, read as `plan` says."""

    buf: Value
    plan: LdmatrixPlan

    def read(self, ctx, dtype) -> Regs:
        return read_fragment(ctx, self.buf, self.plan, dtype)


def stage_invariant_operands(ctx, loop: Operation, await_landing: bool = True) -> bool:
    """Before `loop`: store the tensor-core operands its dots take from before the loop (see the module
    docstring), then fence the async proxy (wgmma) and a barrier; and wait for those a TMA load is filling
    (`ctx.landing`) unless not `await_landing` (before a warp-specialized loop's split: the consumers wait).
    Returns whether it stored any (for `end_staged_reads`)."""
    stored = []
    for op in loop.walk():
        plan = mma_plan(op, ctx.target, ctx.num_threads // ctx.warp_size) if op.name == "dot" else None
        if plan is None:
            continue
        if await_landing:
            await_operands(ctx, op)
        for index, want in ((0, plan.a), (1, plan.b)):
            value = op.operands[index]
            if value in ctx.staged or not isinstance(ctx.env.get(value), Regs):
                continue                    # staged already, or computed in the loop (not lowered yet)
            staged = _stage(ctx, op, index, want, plan.instruction.n)
            if staged is not None:
                ctx.staged[value] = staged
                stored.append(staged)
    if any(isinstance(s, SharedOperand) for s in stored):
        ctx.create("fence_proxy_async")     # generic-proxy stores -> wgmma's async-proxy reads
    if stored:
        ctx.threads.barrier()
    return bool(stored)


def end_staged_reads(ctx, loop: Operation, staged: bool) -> None:
    """After lowered `loop`, for which `stage_invariant_operands` stored operands (`staged`): a barrier where
    the loop sits in another loop, so no thread writes the staged bytes (the next iteration's staging, or a
    later buffer the allocator placed there) while another still reads them."""
    holder = loop.parent.parent if loop.parent is not None else None
    while isinstance(holder, Operation):
        if holder.name == "for":
            if staged:
                ctx.threads.barrier()
            return
        holder = holder.parent.parent if holder.parent is not None else None


def await_loop_operands(ctx, loop: Operation) -> None:
    """Wait for the operands of `loop`'s dots a TMA load is still filling (`ctx.landing`), once each: a
    pipelined loop calls this after issuing its first fills, so that they are in flight together."""
    for op in loop.walk():
        if op.name == "dot":
            await_operands(ctx, op)


def _stage(ctx, op: Operation, index: int, want, n: int):
    """Operand `index` of dot `op` (its instruction's N: `n`) stored where its instruction reads it, or None
    where it stays as it is."""
    if want is None:                                        # wgmma: a K-major (or MN-major B) tile
        return store_operand(ctx, op, index, ctx.operand(op, index), n)
    regs = ctx.lookup(op.operands[index])
    if regs.layout == want or not ctx.target.has("ldmatrix"):
        return None                                         # resident in its fragment (or no ldmatrix)
    element_bytes = regs.element.dtype.bits // 8
    # Rows of 256 bytes (head dim 128) take the row-keyed swizzle, as the cp.async ring's do: the threads fill
    # this buffer, and the 128-byte swizzle leaves its ldmatrix reads 8-way conflicted (decode's staged Q).
    row_keyed = want.shape[1] * element_bytes <= ROW_KEYED_MAX_BYTES
    plan = ldmatrix_plan(want, index == 1, ctx.warp_size, element_bytes, row_keyed)
    if plan is None:
        return None
    return StagedFragment(store_swizzled(ctx, regs, plan.smem), plan)
