"""The schedule of each loop: warp-specialized, software-pipelined, or plain.

Input: a tile-IR `for` and its attributes, `stages = S` (from
`tessera.pipeline(..., stages=S)`; absent on a `range` loop, which
`auto_pipeline.py` pipelines on its own where that is safe and the loop
feeds a dot, and where not says why in strict mode; `while` loops are never
pipelined, and say so the same way) and `warp_specialize`. A loop with
`warp_specialize` gets a producer warpgroup filling its rings by TMA
(`warp_specialization.py`; inside a persistent kernel's tile loop the
producer walks the tiles too, `warp_specialized_tiles.py`; where it
cannot, a warning says why and the loop is scheduled as if it had not
asked); a loop with
S > 1 whose tensor-core dot operands qualify (`pipeline_plan.py`) gets
ring buffers filled S - 1 iterations ahead (`software_pipeline.py`);
anything else is the plain loop of `lowering/control_flow.py`. Guarantee:
every schedule computes what the plain loop computes (the SIMT simulator
checks it), and a request that is not honoured fully -- fewer stages, a
load left out, cp.async where TMA was possible, no warp specialization --
is a `PipelineWarning` at the loop saying why (`shortfalls.py`).
"""

from __future__ import annotations

from tessera.ir.core import Operation

from ..lowering import lowering
from ..lowering.control_flow import lower_plain_for, lower_while
from ..lowering.invariant_operands import await_loop_operands, end_staged_reads, stage_invariant_operands
from .consumer_prologue import lower_deferred, specialized_in
from .auto_pipeline import auto_plan, while_refusal
from .pipeline_plan import PipelinePlan, pipeline_plan
from .shortfalls import place, shortfall
from .software_pipeline import lower_pipelined_for
from .tma_store import finish_overlapped_stores
from .warp_specialization import lower_warp_specialized_for, warp_specialization_refusal
from .warp_specialized_tiles import lower_specialized_tile_loop


@lowering("for")
def _for(ctx, op):
    _schedule_for(ctx, op)
    finish_overlapped_stores(ctx, op)          # TMA stores in the body still reading: wait before what follows


def _schedule_for(ctx, op):
    inner = specialized_in(op) if op.parent is ctx.src.body and ctx.threads.consumers is None else None
    if inner is not None:               # a persistent tile loop around a warp-specialized K loop
        refusal = warp_specialization_refusal(ctx, inner)
        if refusal is None:
            lower_specialized_tile_loop(ctx, op, inner)
            return
        # refused: the K loop says why when it is lowered, in the plain tile loop (after the held-back reads,
        # which the refusal may have been about)
        ctx.refused_specializations[inner] = refusal
        lower_deferred(ctx)
    if op.attrs.get("pingpong") and not op.attrs.get("warp_specialize"):
        _lower_wave_pingpong_for(ctx, op)
        return
    if op.attrs.get("warp_specialize"):
        refusal = ctx.refused_specializations.pop(op, None) or warp_specialization_refusal(ctx, op)
        if refusal is None:
            stage_invariant_operands(ctx, op, await_landing=False)     # the consumers wait, after the split
            lower_warp_specialized_for(ctx, op)
            return
        lower_deferred(ctx)             # the reads `consumer_prologue` held back for the consumers: here after all
        where, reason = refusal
        shortfall(ctx, where, f"no warp specialization: {reason} (without it, the loop is pipelined as below)")
    # operands a TMA load is filling: waited for after a pipelined loop's first fills (`lower_pipelined_for`)
    staged = stage_invariant_operands(ctx, op, await_landing=False)
    _lower_staged_for(ctx, op)
    end_staged_reads(ctx, op, staged)           # in a tile loop: the next tile stages its operands again


def _lower_staged_for(ctx, op):
    """A loop that is not warp-specialized, its invariant operands staged: pipelined or plain."""
    if "stages" not in op.attrs and not op.attrs.get("warp_specialize"):
        plan = auto_plan(ctx, op)
        if plan is not None:
            lower_pipelined_for(ctx, op, plan)
        else:
            _lower_plain_for(ctx, op)
        return
    stages = op.attrs.get("stages", 1)
    if stages > 1:
        why: list[str] = []
        plan = pipeline_plan(op, ctx.target, ctx.num_threads // ctx.warp_size, ctx.facts.facts, why)
        if plan is None:
            shortfall(ctx, op, f"tessera.pipeline(stages={stages}) runs as a plain loop on {ctx.target.name} (no "
                               f"asynchronous copies): {'; '.join(why)}")
        else:
            report_partial_plan(ctx, op, plan, why)
            lower_pipelined_for(ctx, op, plan)
            return
    _lower_plain_for(ctx, op)


def _lower_plain_for(ctx, op: Operation) -> Operation:
    await_loop_operands(ctx, op)
    return lower_plain_for(ctx, op)


def _lower_wave_pingpong_for(ctx, op: Operation) -> None:
    """`tessera.pipeline(..., stages=1, pingpong=True)` without warp specialization: AMD's wave-group ping-pong.
    The loop is lowered plainly, marked `pingpong`, for `passes/wave_pingpong.py` to stagger the two groups of
    waves around it once shared memory is placed. Elsewhere (NVIDIA takes turns between warp-specialized
    warpgroups) and with stages > 1 (its ring would be shared by groups one phase apart) it is refused."""
    if ctx.target.vendor != "amd":
        raise ctx.error(op, f"tessera.pipeline(pingpong=True) without warp_specialize=True is AMD's wave-group "
                            f"ping-pong, which {ctx.target.name} does not run; on sm_90a pass "
                            f"warp_specialize=True too (two consumer warpgroups take turns)")
    if op.attrs.get("stages", 1) != 1:
        raise ctx.error(op, f"the wave-group ping-pong on {ctx.target.name} needs tessera.pipeline(stages=1): its "
                            f"two groups run one phase apart, each staging its own blocks, so there is no ring "
                            f"to fill ahead; pass stages=1")
    _lower_plain_for(ctx, op).attrs["pingpong"] = True


@lowering("while")
def _while(ctx, op):
    while_refusal(ctx, op)
    lower_while(ctx, op)


def report_partial_plan(ctx, op: Operation, plan: PipelinePlan, why: list[str]) -> None:
    """Warn of what a pipelined loop lacks: stages that do not fit, block loads left out, cp.async for TMA."""
    if plan.stages < plan.requested_stages:
        shortfall(ctx, op, f"{plan.stages} of the {plan.requested_stages} stages fit in {ctx.target.name}'s shared "
                           f"memory ({plan.shared_bytes // plan.stages} bytes per stage); use smaller blocks or "
                           f"fewer stages")
    for reason in why:
        shortfall(ctx, op, f"not every block load is pipelined: {reason}")
    for load in plan.copy_loads:
        if load.no_tma is not None:
            shortfall(ctx, op, f"cp.async instead of TMA for the block load at {place(load.load)}: {load.no_tma}")
