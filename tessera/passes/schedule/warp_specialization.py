"""Warp-specialized pipelined loops: `for {stages = S, warp_specialize = true}` on TMA targets (sm_90, sm_90a).

Input: a tile-IR `for` from `tessera.pipeline(..., warp_specialize=True)`
whose pipelined loads can all be filled by TMA. Job: add a producer
warpgroup (128 threads beyond `num_warps * 32`) that only issues the TMA
fills of the ring, while the kernel's warps, the consumers, run the body
behind "full" and "empty" mbarriers, with `setmaxnreg` register hand-over
where it pays; the rest of the kernel runs in the consumers' branch.
Guarantees: the producer runs at most S fills ahead of the slowest
consumer; the two branches meet only at one named barrier after the loop;
what cannot be warp-specialized (no TMA, a loop in an `if`, a memory write
before the loop, ...) is a LoweringError saying what to change. Inside a
persistent kernel's loop over tiles, `warp_specialized_tiles.py` lowers the
tile loop with the same pieces. The emitted code
is the comment above `lower_warp_specialized_for`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.ir.core import Block, Operation, Value
from tessera.ir.types import TileType

from ..lowering.invariant_operands import stage_invariant_operands
from ..lowering.values import I32, Regs, RingOperand
from .persistent import specialized_tile_loop_refusal, tile_loop_of
from .pipeline_plan import PipelinePlan, pipeline_plan
from .software_pipeline import lower_body_op, next_slot_and_phase, slot_ahead
from . import tail_operands
from .consumer_prologue import lower_deferred, producer_may_run, producer_reads_deferred
from .tma_fill import TmaRing
from .shortfalls import shortfall

PRODUCER_THREADS = 128                  # one warpgroup
PRODUCER_REGISTERS = 40                 # setmaxnreg dec: a loop issuing TMA needs few
MAX_CONSUMER_REGISTERS = 240
MAX_REGISTERS = 255                     # per thread
REGISTER_FILE = 65536
EXIT_BARRIER_ID = 2                     # producer and consumers, once, after the loop (1: the consumers')
PINGPONG_BARRIERS = (3, 4)              # warpgroup 0's turn, warpgroup 1's (`pingpong=True`)


# `tessera.pipeline(lo, hi, stages=S, warp_specialize=True)` asks for the
# ring of `software_pipeline.py` (S slots per pipelined A / B load, chosen by
# `pipeline_plan`) to be filled by a warpgroup of its own, the *producer*,
# while the kernel's `num_warps` warps, the *consumers*, run the loop body.
# The kernel gets 128 threads more than `num_warps * 32` (its `num_threads`
# attribute, hence `.maxntid`, the metadata and the launch block size);
# layouts and everything tile-level still use the consumer threads 0 .. C-1,
# and the producer is threads C .. C+127:
#
#     rings, full = TmaRing (one mbarrier per slot, count 1)   as the TMA-filled pipeline
#     empty = S mbarriers, count W: the consumers' releases   thread 0 inits them; fence_mbarrier_init; barrier
#                                                              (W: C / 128 warpgroups for wgmma, else C threads)
#     if thread_id >= C {producer_joins_at = k}                the producer
#         [setmaxnreg dec 40]                                  sm_90a, C a multiple of 128 (>= 256: below,
#                                                              every thread has 255 registers at entry)
#         if thread_id == C {                                  one thread issues
#             for iv = lo .. hi, slot, phase:
#                 if iv >= lo + S*step: mbarrier_wait empty[slot], 1 - phase   (the previous use's release;
#                                                              skipped on the first round through the ring)
#                 [fence_proxy_async]; arrive_expect_tx full[slot], <bytes of a slot's boxes>
#                 tma_load ring[slot], map, <block offsets>, full[slot]        (each box of each load:
#                                                              `TmaRing.start`; the fence only when ldmatrix
#                                                              read the slot through the generic proxy)
#             [arrive_expect_tx bar; tma_load tile ... bar]    the blocks read only after the loop
#         }                                                    (`tail_operands.py`: the overlapped last V block)
#         named_barrier {id = 2, count = C + 128}              (the mbarriers may be invalidated after it)
#     } else {                                                 the consumers
#         [setmaxnreg inc R]                                   R: what 64K registers leave them, at most 240
#         %acc... = for iv = lo .. hi, carried..., slot, phase:
#             mbarrier_wait full[slot], phase
#             ... body, the pipelined loads read from ring[slot] (ldmatrix, or wgmma descriptors) ...
#             wgmma (group in flight):  ... wgmma_wait {pending = 1}
#                 if iv > lo and thread_id % 128 == 0: mbarrier_arrive empty[slot - 1]
#             otherwise:  mbarrier_arrive empty[slot]  (thread 0 of each warpgroup for wgmma, else every thread)
#         [wgmma_wait {pending = 0}]
#         named_barrier {id = 2, count = C + 128}; thread 0 invalidates full[] and empty[]
#         named_barrier {id = 1, count = C}                    op k: the branches have met
#         ...                                                  the rest of the kernel, consumers only; each
#                                                              barrier is a `named_barrier {id = 1, count = C}`
#     }
#     return
#
# The rest of the kernel runs in the consumers' branch, so that their
# `setmaxnreg inc` covers it too (ptxas gives code outside it only what every
# thread has at entry: 168 registers with 384 threads, too few for a 128 x
# 128 epilogue). `producer_joins_at = k` tells the shared-memory allocator
# that the producer's accesses are over at the consumers' op k, so the rings'
# bytes go to the buffers after the loop (such as the epilogue's layout
# change), as they do after a plain pipeline.
#
# The producer runs ahead on its own, at most S fills ahead of the slowest
# consumer, limited only by the empty barriers: no prefetch distance. A wgmma
# dot whose plan allows it (`PipelinePlan.in_flight`) leaves its group in
# flight, and each warpgroup releases the slot of the iteration before once
# `wgmma_wait {pending = 1}` has retired that iteration's group (CUTLASS's
# mainloop): a wgmma-group is the warpgroup's, so one arrival by its first
# thread after the wait covers the reads of all 128 threads (the SIMT
# simulator models wgmma reads as the warpgroup's: `SharedMemory.
# record_warpgroup_read`). The last iteration's slot is never released: no
# fill waits for it. ldmatrix reads are each thread's own, so mma.sync
# consumers (sm_90) arrive from every thread, after their reads.
#
# Before the loop every thread, the producer included, runs the kernel's
# code, so that code may only compute (scalar ops, views, register-only tile
# ops such as `zeros`): no memory write, no shared-memory exchange, no
# nested region (`_prologue_refusal`). Reads there that only the consumers
# need (attention's Q block) are lowered at the top of the consumers' branch
# instead, and the loop's invariant dot operands among them staged there
# (`consumer_prologue.py`); a loop bound or block address the producer needs
# may not be read from memory. The loop must be an op of the kernel's
# body itself, or of the body of a loop over tiles that is (a persistent
# kernel: both roles then walk the tiles, `warp_specialized_tiles.py`; the
# nestings it takes are `persistent.specialized_tile_loop_refusal`'s), not
# in an `if`; one per kernel, and every pipelined load must be TMA-filled
# (a view load `pipeline_plan` does not pipeline at all stays an ordinary
# load of the consumers' body).
#
# The two branches meet again only at the named barrier 2 after the loop:
# the consumers' waits on full[] say that every fill has been issued and has
# landed, and the barrier orders the producer's last mbarrier accesses before
# thread 0 invalidates them (the SIMT simulator checks both).
@dataclass(frozen=True)
class SpecializedRing:
    """What both warp roles of a warp-specialized loop share: the plan, the rings, their full (TMA) and empty
    mbarriers, and the number of consumer threads."""

    plan: PipelinePlan
    rings: list
    full: TmaRing
    empty: Value
    consumers: int


def specialized_ring(ctx, op: Operation) -> SpecializedRing:
    """Plan `op`'s ring, add the producer warpgroup to the kernel's threads, and allocate and initialize the rings'
    full and empty mbarriers here, before the split (so once per kernel)."""
    plan = pipeline_plan(op, ctx.target, ctx.num_threads // ctx.warp_size, ctx.facts.facts)
    if plan.stages < plan.requested_stages:
        shortfall(ctx, op, f"{plan.stages} of the {plan.requested_stages} stages fit in {ctx.target.name}'s shared "
                           f"memory; use smaller blocks or fewer stages")
    consumers = ctx.num_threads
    ctx.fn.attrs["num_threads"] = consumers + PRODUCER_THREADS
    rings = [ctx.smem.alloc(load.dtype, plan.stages * load.slot_elements, align=load.slot_alignment,
                            ring_stages=plan.stages) for load in plan.loads]
    full = TmaRing(ctx, plan.loads, plan.stages, specialized=True)
    # a phase completes when every consumer warpgroup (wgmma) or thread (ldmatrix) released the slot, of every
    # block of the cluster when the slots are multicast (`multicast.py`)
    cluster = full.cluster
    empty = ctx.smem.mbarriers(plan.stages, _releasers(plan, consumers) * (cluster.size if cluster else 1))
    if cluster is not None:
        cluster.sync(ctx)                           # the full and empty barriers' inits, cluster-wide
    return SpecializedRing(plan, rings, full, empty, consumers)


def split_roles(ctx, ring: SpecializedRing, producer: Block, consumer: Block) -> None:
    """Close the two branches (the producer's ends at the exit barrier, the consumers' after the mbarriers'
    end) into `if thread_id >= consumers {producer} else {consumers}`, and go on in the consumers' branch."""
    is_producer = ctx.emit("cmp", ctx.index.thread_id, ctx.const(ring.consumers), attrs={"pred": "ge"})
    # The producer's shared-memory accesses are over once the consumers are past the named barrier both
    # branches meet at (the last op so far): the allocator may give the rings' bytes to later buffers.
    ctx.create("if", [is_producer], {"producer_joins_at": len(consumer.ops) - 1}, [], [producer, consumer])
    # The rest of the kernel runs in the consumers' branch, under their setmaxnreg; the kernel's return closes
    # it (`ThreadGroups.end_kernel`).
    ctx.b.block = consumer


def producer_entry(ctx, ring: SpecializedRing) -> None:
    """The producer branch's first op: give registers back where the consumers take more."""
    if _consumer_registers(ctx, ring.consumers):
        ctx.create("setmaxnreg", attrs={"action": "dec", "count": PRODUCER_REGISTERS})


def producer_exit(ctx, ring: SpecializedRing) -> None:
    """The producer branch's last ops: meet the consumers once (the mbarriers may be invalidated after it)."""
    _all_threads_barrier(ctx, ring.consumers)      # the producer's last barrier accesses come first
    if ring.full.cluster is not None:               # its part of the cluster barrier before the mbarriers end
        ring.full.cluster.sync(ctx)
    ctx.create("yield")


def consumer_entry(ctx, ring: SpecializedRing) -> None:
    """The consumers' branch's first ops: take the registers, and lower the reads held back for them."""
    ctx.threads.keep_only_consumers(ring.consumers)
    inc = _consumer_registers(ctx, ring.consumers)
    if inc:
        ctx.create("setmaxnreg", attrs={"action": "inc", "count": inc})
    lower_deferred(ctx)                             # the reads before the loop only the consumers need


def lower_warp_specialized_for(ctx, op: Operation) -> None:
    """Lower `op` (a `for {warp_specialize = true}`, which `warp_specialization_refusal` accepted) as the comment
    above says."""
    ring = specialized_ring(ctx, op)
    plan, consumers = ring.plan, ring.consumers
    lb, ub, step = [ctx.thread_value(ctx.operand(op, i)) for i in range(3)]
    tails = tail_operands.tail_operands(ctx, op)    # (before the consumers' entry lowers the deferred reads)

    producer, consumer = Block(), Block()
    with ctx.b.at(producer):
        producer_entry(ctx, ring)
        with ctx.when(ctx.emit("cmp", ctx.index.thread_id, ctx.const(consumers), attrs={"pred": "eq"})):
            producer_fills(ctx, ring, lb, ub, step)
            tail_operands.issue(ctx, tails)         # the blocks read after the loop (the last V block)
        producer_exit(ctx, ring)
    with ctx.b.at(consumer):
        consumer_entry(ctx, ring)
        tail_operands.bind(ctx, tails)
        stage_invariant_operands(ctx, op)           # ... and the dot operands among them, staged once
        if op.attrs.get("pingpong"):
            results = _pingpong_loops(ctx, op, ring, lb, ub, step)
        else:
            results = consumer_loop(ctx, op, ring, lb, ub, step).results
        if plan.in_flight:
            ctx.create("wgmma_wait", attrs={"pending": 0})     # the last group, before the accumulator is read
        end_ring(ctx, ring)
    split_roles(ctx, ring, producer, consumer)
    for old, result in zip(op.results, results):
        result.name_hint = old.name_hint
        ctx.define(old, Regs(result, ctx.assignment.layout(old)) if isinstance(old.type, TileType) else result, op)


def warp_specialization_refusal(ctx, op: Operation) -> tuple[Operation, str] | None:
    """Why `op` (a `for {warp_specialize = true}`) cannot get a producer warpgroup: (the op to point at, the
    reason and what to do), or None when it can (the loop schedule then falls back, with a warning)."""
    target = ctx.target
    if not target.has("tma"):
        return op, (f"warp_specialize=True needs TMA (sm_90, sm_90a), which {target.name} lacks; drop "
                    f"warp_specialize=True (the pipeline stays cp.async) or compile for sm_90")
    if ctx.threads.consumers is not None:
        return op, ("only one tessera.pipeline(warp_specialize=True) loop per kernel is supported (its producer "
                    "warpgroup has exited after the first); drop warp_specialize=True here")
    outer = None
    if op.parent is not ctx.src.body:
        outer = tile_loop_of(op)
        if outer is None or outer.parent is not ctx.src.body:
            return op, ("a tessera.pipeline(warp_specialize=True) loop must be a statement of the kernel, or of the "
                        "body of a loop over tiles that is one (a persistent kernel), not nested in an `if`, a "
                        "`while` or two loops; drop warp_specialize=True or move the loop")
    prologue = _prologue_refusal(ctx, outer or op)
    if prologue is not None:
        return prologue
    plan = pipeline_plan(op, target, ctx.num_threads // ctx.warp_size, ctx.facts.facts)
    if plan is None:
        return op, ("warp_specialize=True: no load of this loop qualifies for pipelining (A and B blocks of a "
                    "tensor-core dot, see passes/schedule/pipeline_plan.py); drop warp_specialize=True")
    if outer is not None:
        nesting = specialized_tile_loop_refusal(ctx, outer, op, plan)
        if nesting is not None:
            return nesting
    if op.attrs.get("pingpong") and (ctx.num_threads != 2 * PRODUCER_THREADS or not plan.on_wgmma):
        return op, (f"pingpong=True takes turns between two consumer warpgroups issuing wgmmas; this loop has "
                    f"{ctx.num_threads // PRODUCER_THREADS if ctx.num_threads % PRODUCER_THREADS == 0 else 'no whole'}"
                    f" warpgroup(s){'' if plan.on_wgmma else ' and no wgmma'}: launch num_warps=8 on sm_90a, or "
                    f"drop pingpong=True")
    if plan.copy_loads:
        where = ", ".join(str(load.load.loc) if load.load.loc else "a block load" for load in plan.copy_loads)
        why = ("its view must be a tessera.view of a pointer parameter with 16-byte aligned rows and a "
               "unit-stride dim (see passes/schedule/tma_fill.py); fix the view or drop warp_specialize=True")
        return op, f"warp_specialize=True needs every pipelined load filled by TMA, but the load at {where} cannot be: {why}"
    needed = producer_reads_deferred(ctx, op, plan, outer)
    if needed is not None:
        return needed.owner, (f"the producer warpgroup needs '{needed.name_hint or needed.owner.name}' (a loop "
                              "bound or a pipelined block's address), which is read from memory before the loop; "
                              "compute it without loads, or drop warp_specialize=True")
    return None


def _prologue_refusal(ctx, loop: Operation) -> tuple[Operation, str] | None:
    """The producer runs what precedes the loop (or the tile loop holding it) too: anything there but pure
    computation, and not deferred to the consumers (`consumer_prologue.py`), is refused."""
    body = ctx.src.body
    for top in body.ops[:body.ops.index(loop)]:
        if top in ctx.deferred:
            continue
        for op in top.walk():
            if not producer_may_run(ctx, op):
                return op, (f"'{op.name}' comes before a tessera.pipeline(warp_specialize=True) loop, where the "
                            "producer warpgroup runs it too; only scalar arithmetic, views, register-only tile "
                            "ops (zeros, arange, elementwise) and, when nothing before the loop writes memory, "
                            "loads may: move it after the loop or into its body, or drop warp_specialize=True")
    return None


def producer_fills(ctx, ring: SpecializedRing, lb, ub, step, start: tuple[Value, Value, Value] | None = None) \
        -> Operation:
    """The issuing thread's loop over iterations lb .. ub: fill slot after slot (returned). From the ring's
    start (slot 0, parity 0; its first S fills wait for no release), or from `start` = (slot, parity, whether
    the ring has been gone round once), carried on as the last three results (a persistent tile loop's
    producer: `warp_specialized_tiles.py`)."""
    stages = ring.plan.stages
    index = lb.type
    if start is None:
        first_reuse = ctx.emit("add", lb, ctx.emit("mul", step, ctx.const(stages, index.dtype)))
    names = ["iv", "slot", "phase"] + (["wrapped"] if start is not None else [])
    body = Block([index] + [I32] * (len(names) - 1), names)
    iv, slot, phase, *wrapped = body.args
    with ctx.b.at(body):
        if start is None:           # skipped on the first round through the ring: nothing to wait for yet
            reused = ctx.emit("cmp", iv, first_reuse, attrs={"pred": "ge"})
            ctx.create("yield", _fill(ctx, ring, iv, slot, phase, reused))
        else:
            ctx.create("yield", _fill(ctx, ring, iv, slot, phase, None, wrapped[0]))
    inits = [ctx.const(0), ctx.const(0)] if start is None else list(start)
    return ctx.create("for", [lb, ub, step, *inits], None, [I32] * len(inits), [body])


def producer_first_fill(ctx, ring: SpecializedRing, lb, ub, start: tuple[Value, Value, Value]) -> list[Value]:
    """A persistent tile loop's producer: the fill of iteration lb alone, where lb < ub, from `start` (as for
    `producer_fills`); returns (slot, parity, wrapped) after it. FlashAttention-3's producer issues a tile's first
    K block before it waits for Q's release (`tile_operands.py`)."""
    then, otherwise = Block(), Block()
    with ctx.b.at(then):
        ctx.create("yield", _fill(ctx, ring, lb, *start[:2], None, start[2]))
    with ctx.b.at(otherwise):
        ctx.create("yield", list(start))
    ran = ctx.emit("cmp", lb, ub, attrs={"pred": "lt"})
    return list(ctx.create("if", [ran], None, [I32] * 3, [then, otherwise]).results)


def _fill(ctx, ring: SpecializedRing, iv: Value, slot: Value, phase: Value, reused: Value | None,
          wrapped: Value | None = None) -> list[Value]:
    """One fill: wait for the slot's previous release where `reused` (or, counting across tiles, `wrapped`: the
    ring has been gone round) holds, issue iteration `iv`'s boxes into `slot`; the next (slot, parity[, wrapped])."""
    stages = ring.plan.stages
    if wrapped is not None:
        reused = ctx.emit("cmp", wrapped, ctx.const(0), attrs={"pred": "ne"})
    with ctx.when(reused):          # the previous use's release
        ctx.create("mbarrier_wait", [_bar(ctx, ring.empty, slot), ctx.emit("sub", ctx.const(1), phase)])
    _issue(ctx, ring.plan, ring.rings, ring.full, iv, slot)
    carried = next_slot_and_phase(ctx, slot, phase, stages)
    if wrapped is not None:
        at_last = ctx.emit("cmp", slot, ctx.const(stages - 1), attrs={"pred": "eq"})
        carried.append(ctx.emit("select", at_last, ctx.const(1), wrapped))
    return carried


def _issue(ctx, plan: PipelinePlan, rings, full: TmaRing, iv: Value, slot: Value) -> None:
    """Start the TMA boxes of iteration `iv` into `slot`, counted on full[slot] (the calling thread only)."""
    region = plan.loop.regions[0]
    ctx.env[region.args[0]] = iv
    order = {op: i for i, op in enumerate(region.ops)}
    for slice_op in sorted({op for load in plan.loads for op in load.slice}, key=order.__getitem__):
        lower_body_op(ctx, slice_op, {})
    offsets = {load.load: ctx.emit("mul", slot, ctx.const(load.slot_elements)) for load in plan.loads}
    full.start(ctx, _bar(ctx, full.bars, slot), {load.load: ring for load, ring in zip(plan.loads, rings)}, offsets)


def consumer_loop(ctx, op: Operation, ring: SpecializedRing, lb, ub, step,
                  start: tuple[Value, Value] | None = None) -> Operation:
    """The loop the consumer warps run (returned): wait for the slot, compute on it, release it (or, with a
    wgmma group in flight, release the slot of the iteration before, whose group the dot's wait retired).
    The ring's slot and parity start at 0, or at `start`, and are its last two results."""
    plan, rings, full, empty, consumers = ring.plan, ring.rings, ring.full, ring.empty, ring.consumers
    inits = [ctx.thread_value(ctx.operand(op, i)) for i in range(3, len(op.operands))]
    region = op.regions[0]
    body = ctx.new_block(region)
    slot, phase = body.add_arg(I32, "slot"), body.add_arg(I32, "phase")
    with ctx.b.at(body):
        full.wait(ctx, slot, phase)
        reads = {load.load: RingOperand(buf, ctx.emit("mul", slot, ctx.const(load.slot_elements)), load,
                                        plan.in_flight) for load, buf in zip(plan.loads, rings)}
        for old, new in zip(region.args, ctx.region_args(region, body)):
            ctx.env[old] = new
        for body_op in region.ops[:-1]:
            lower_body_op(ctx, body_op, reads)
        if plan.in_flight:          # after wgmma_wait {pending = 1}: group i - 1 and its slot are done
            not_first = ctx.emit("cmp", body.args[0], lb, attrs={"pred": "gt"})
            _release(ctx, plan, empty, slot_ahead(ctx, slot, plan.stages - 1, plan.stages), consumers, not_first,
                     full.cluster)
        else:
            _release(ctx, plan, empty, slot, consumers, cluster=full.cluster)
        carried = next_slot_and_phase(ctx, slot, phase, plan.stages)
        lower_body_op(ctx, region.ops[-1], reads)
    body.ops[-1].operands.extend(carried)           # the yield carries the slot and phase too

    result_types = [ctx.thread_type(r) for r in op.results] + [I32, I32]
    starts = list(start) if start is not None else [ctx.const(0), ctx.const(0)]
    return ctx.create("for", [lb, ub, step, *inits, *starts], {"stages": plan.stages}, result_types, [body])


# `pingpong=True` (FlashAttention-3 section 3.1): the two consumer warpgroups take turns issuing their
# wgmmas, so that one's softmax runs while the other's products occupy the tensor cores. Each warpgroup runs
# a copy of the consumer loop of its own (`if warpgroup == 0 {loop} else {loop}`: the SIMT simulator runs
# the two as cooperating paths, where one loop with the barrier ids computed from the warpgroup would run in
# lockstep and deadlock), marked `pingpong_turn = [its barrier, the other's]`; once the waits are placed
# (`passes/pingpong.py`, after `defer_wgmma_wait.py`) each iteration syncs on its barrier before its first
# wgmma and arrives on the other's after its last commit. Warpgroup 1 arrives once before its loop (warpgroup 0
# goes first) and warpgroup 0 syncs once after its loop (warpgroup 1's last turn), so every arrival is
# matched.
def _pingpong_loops(ctx, op: Operation, ring: SpecializedRing, lb, ub, step) -> list[Value]:
    """Both warpgroups' copies of the consumer loop (see the comment above); their results."""
    first, second = PINGPONG_BARRIERS
    consumers = ring.consumers
    warpgroup = ctx.index.digit(PRODUCER_THREADS, consumers // PRODUCER_THREADS)
    is_first = ctx.emit("cmp", warpgroup, ctx.const(0), attrs={"pred": "eq"})
    branches = []
    for mine, other in ((first, second), (second, first)):
        block = Block()
        with ctx.b.at(block):
            if mine == second:
                ctx.create("named_barrier", attrs={"id": first, "count": consumers, "arrive": True})
            loop = consumer_loop(ctx, op, ring, lb, ub, step)
            loop.attrs["pingpong_turn"] = (mine, other)
            if mine == first:
                ctx.create("named_barrier", attrs={"id": first, "count": consumers})
            ctx.create("yield", loop.results)
        branches.append(block)
    return ctx.create("if", [is_first], None, [r.type for r in loop.results], branches).results


def end_ring(ctx, ring: SpecializedRing, more_mbarriers: tuple[Value, ...] = ()) -> None:
    """After the consumers' last loop (its last group retired): the mbarriers (the ring's and `more_mbarriers`
    both roles used) invalidated once every thread, the producer's included, is done with them, and a barrier
    before the rings' bytes are reused."""
    _all_threads_barrier(ctx, ctx.threads.consumers)   # every thread is past its last use of full[] and empty[]
    ring.full.release(ctx)
    with ctx.when(ctx.index.first_thread()):
        for s in range(ring.plan.stages):
            ctx.create("mbarrier_inval", [_bar(ctx, ring.empty, ctx.const(s))])
        for bar in more_mbarriers:
            ctx.create("mbarrier_inval", [bar])
    ctx.threads.barrier()                                   # before later buffers reuse the rings' bytes


def _releasers(plan: PipelinePlan, consumers: int) -> int:
    """Arrivals that release a slot: one per consumer warpgroup when a wgmma reads the slots (its wait is
    warpgroup-wide, as in CUTLASS's consumer_release), else one per consumer thread (each thread's ldmatrix
    reads are its own)."""
    return consumers // PRODUCER_THREADS if plan.on_wgmma and consumers % PRODUCER_THREADS == 0 else consumers


def release(ctx, ring: SpecializedRing, slot: Value, when: Value | None = None) -> None:
    """The consumers release `slot` (where `when` holds): see `_release`."""
    _release(ctx, ring.plan, ring.empty, slot, ring.consumers, when, ring.full.cluster)


def _release(ctx, plan: PipelinePlan, empty: Value, slot: Value, consumers: int, when: Value | None = None,
             cluster=None) -> None:
    """Arrive on empty[slot] (from the first thread of each warpgroup, or from every thread: `_releasers`),
    only where `when` holds; with a multicast `cluster` (`multicast.ClusterMulticast`), on every block's."""
    if _releasers(plan, consumers) != consumers:
        leader = ctx.emit("cmp", ctx.index.digit(1, PRODUCER_THREADS), ctx.const(0), attrs={"pred": "eq"})
        when = leader if when is None else ctx.emit("and", when, leader)

    def arrive():
        if cluster is not None:
            cluster.release_remote(ctx, _bar(ctx, empty, slot))
        else:
            ctx.create("mbarrier_arrive", [_bar(ctx, empty, slot)])
    if when is None:
        arrive()
        return
    with ctx.when(when):
        arrive()


def _all_threads_barrier(ctx, consumers: int) -> None:
    """The producer's last act and the consumers' first after their loop: a named barrier of all threads (a
    plain `barrier` would be executed on two paths of a divergent `if`)."""
    ctx.create("named_barrier", attrs={"id": EXIT_BARRIER_ID, "count": consumers + PRODUCER_THREADS})


def _consumer_registers(ctx, consumers: int) -> int | None:
    """setmaxnreg inc count for the consumers: what the register file leaves them beside the producer's 40
    (at most 240); None where setmaxnreg is not used: without it (before sm_90a), when the consumers are not
    whole warpgroups (it applies to warpgroups), or when it would not raise the consumers' budget above the
    one ptxas gives every thread at entry (.maxntid threads, .minnctapersm 1)."""
    if not ctx.target.has("setmaxnreg") or consumers % PRODUCER_THREADS:
        return None
    spare = (REGISTER_FILE - PRODUCER_THREADS * PRODUCER_REGISTERS) // consumers
    inc = min(MAX_CONSUMER_REGISTERS, spare // 8 * 8)
    at_entry = min(MAX_REGISTERS, REGISTER_FILE // (consumers + PRODUCER_THREADS) // 8 * 8)
    return inc if inc > at_entry else None


def _bar(ctx, bars: Value, slot: Value) -> Value:
    return ctx.emit("addptr", bars, slot)
