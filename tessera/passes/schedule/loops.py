"""The schedule of each `for` loop: warp-specialized, software-pipelined, or plain.

Input: a tile-IR `for` and its attributes, `stages = S` (from
`tessera.pipeline(..., stages=S)`) and `warp_specialize`. A loop with
`warp_specialize` gets a producer warpgroup filling its rings by TMA
(`warp_specialization.py`; an error says why when it cannot); a loop with
S > 1 whose tensor-core dot operands qualify (`pipeline_plan.py`) gets
ring buffers filled S - 1 iterations ahead (`software_pipeline.py`);
anything else is the plain loop of `lowering/control_flow.py`. Guarantee:
every schedule computes what the plain loop computes (the SIMT simulator
checks it), and a stage request that is not honoured fully leaves a note
in the kernel's `lowering_notes` saying why.
"""

from __future__ import annotations

from ..lowering import lowering
from ..lowering.control_flow import lower_plain_for
from ..lowering.invariant_operands import stage_invariant_operands
from .pipeline_plan import pipeline_plan
from .software_pipeline import lower_pipelined_for
from .warp_specialization import lower_warp_specialized_for


@lowering("for")
def _for(ctx, op):
    stage_invariant_operands(ctx, op)
    stages = op.attrs.get("stages", 1)
    if op.attrs.get("warp_specialize"):
        lower_warp_specialized_for(ctx, op)
        return
    if stages > 1:
        plan = pipeline_plan(op, ctx.target, ctx.num_threads // ctx.warp_size, ctx.facts.facts)
        where = f" at {op.loc}" if op.loc else ""
        if plan is None:
            ctx.notes.append(f"for{where}: stages = {stages}, but no load qualifies for cp.async pipelining on "
                             f"{ctx.target.name}; lowered as a plain loop")
        else:
            if plan.stages < stages:
                ctx.notes.append(f"for{where}: {plan.stages} of the {stages} stages fit in shared memory")
            lower_pipelined_for(ctx, op, plan)
            return
    lower_plain_for(ctx, op)
