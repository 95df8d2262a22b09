"""wave_pingpong: two programs share a workgroup, their waves one phase apart around a `pingpong` loop (AMD).

Input: thread IR with shared memory placed, lowered for `num_warps / 2` waves, whose one `for {pingpong}`
(`tessera.pipeline(..., stages=1, pingpong=True)` on AMD: `schedule/loops.py`) is a statement of the kernel
itself. Job: HipKittens' 8-wave ping-pong. The block gets twice the threads, in two *groups* (group g: threads
g*N .. g*N+N-1), each running program `2 * program_id(0) + g` on its own copy of shared memory. Around the loop
group 1 executes one extra `phase_barrier` (s_barrier) up front, so from then on the groups are one phase
apart: the loop body's barriers (each a fenced `phase_barrier` now) cut it into phases, and while one group
issues the MFMAs of a phase the other runs the loads and LDS traffic of the phase before. `set_priority 1`
(s_setprio) brackets each phase's MFMAs, so the arbiter issues them ahead of the other group's memory
instructions, and `sched_fence` (sched_barrier) at each barrier and priority change keeps LLVM from moving
instructions across the phases. Every `if` is on `wave_uniform` group ids (readfirstlane), so it branches
whole waves, as the barriers inside need.

What orders what, and why it cannot deadlock. s_barrier counts waves, not program points: round r completes
when every wave has executed its r-th barrier, wherever. Each group's own shared-memory exchanges (store,
barrier, load) are ordered by its own barriers, which stay fenced; the other group is then at another phase,
but it touches only its own copy of shared memory, so the skew cannot race. What remains is that every wave
executes the same number of barriers, or the last round never completes (a hang on the GPU; a DEADLOCK or an
unfinished round on the SIMT simulator). Barriers are allowed only as statements of the kernel or of the loop
body (checked), so a group executes P + T*B + its extras, with P the kernel's barriers outside the loop (the
same for both), B the body's, T the group's trip count. Extras: group 1 the stagger barrier (1); group 0 the
closing barrier after its loop (1; it meets group 1's last phase, after which both run in step again); and the
group with fewer iterations (causal rows see fewer key blocks) max(0, T_other - T_mine) * B balancing
barriers, T_other computed from the other program's loop bounds. Both totals are P + max(T0, T1) * B + 1.

Limits: the kernel must tolerate program `2 * program_id(0) + 1` past its grid's end (the launch rounds the
programs up to whole workgroups: `programs_per_block`), as bounds-checked views do; each group stages its own
K/V blocks (HipKittens' groups share them, through an LDS ring read one phase late, which needs asynchronous
global->LDS copies that Tessera does not emit on AMD yet), so the LDS a program uses doubles. The phases are the
plain loop's (its LDS exchanges), not clusters chosen for balance: an MFMA phase also issues the next block's
global loads and LDS writes that the body places there, only the MFMAs are under s_setprio 1. What LLVM does
with it (`bench/attention_amd_pingpong.py`): every MFMA stays in its phase's priority window (LLVM treats
s_setprio as a scheduling boundary, so at the shipped tiles the sched_barriers change nothing; they keep the
guarantee where a window's edge has no s_setprio), where the plain kernel's fenced s_barriers let MFMAs move
into the neighbouring phase.
"""

from __future__ import annotations

from tessera.ir import dtypes as dt
from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.ops import OPS
from tessera.ir.types import ScalarType

from .errors import LoweringError
from .rewrite import clone_op, replace_uses

GROUPS = 2
MAX_BLOCK_THREADS = 1024
SHARED_COPY_ALIGN = 16          # each group's copy of shared memory starts at a multiple of this
I32 = ScalarType(dt.i32)


def pingpong_loop(fn: Function) -> Operation | None:
    """The `for {pingpong}` of `fn` that this pass staggers around (None when there is none)."""
    loops = [op for op in fn.walk()
             if op.name == "for" and op.attrs.get("pingpong") and "pingpong_turn" not in op.attrs]
    if len(loops) > 1:
        raise LoweringError("one tessera.pipeline(pingpong=True) loop per kernel: the wave groups are staggered "
                            "around one loop; drop pingpong=True from the others", loops[1], fn.name)
    return loops[0] if loops else None


def stagger_wave_groups(fn: Function, shared_memory_bytes: int) -> bool:
    """Run `fn`'s `pingpong` loop as two staggered wave groups (see the module docstring), in place; False when
    it has none. `shared_memory_bytes`: the target's per-block limit, which both copies must fit."""
    loop = pingpong_loop(fn)
    if loop is None:
        return False
    _check_barrier_placement(fn, loop)
    threads = int(fn.attrs["num_threads"])
    if GROUPS * threads > MAX_BLOCK_THREADS:
        raise LoweringError(f"the wave-group ping-pong doubles the block to {GROUPS * threads} threads, more than "
                            f"{MAX_BLOCK_THREADS}; launch fewer warps", loop, fn.name)
    b = _Builder(fn.body, at=0)
    group = b.emit("wave_uniform", [b.emit("div", [b.emit("thread_id", []), b.const(threads)])])
    programs = _split_ids(fn, b, group, threads)
    _split_shared_memory(fn, b, group, loop, shared_memory_bytes)
    _stagger(fn, b, loop, group, programs)
    fn.attrs["num_threads"] = GROUPS * threads
    fn.attrs["programs_per_block"] = GROUPS
    return True


def _check_barrier_placement(fn: Function, loop: Operation) -> None:
    """Barriers only as statements of the kernel or of the loop body, and no early return: then each group's
    barrier count is P + T * B (module docstring)."""
    if loop.parent is not fn.body:
        raise LoweringError("a tessera.pipeline(pingpong=True) loop on AMD must be a statement of the kernel "
                            "itself, not nested in a loop or an `if`", loop, fn.name)
    body = loop.regions[0]
    for op in fn.walk():
        if op.name in ("barrier", "phase_barrier", "named_barrier") and op.parent not in (fn.body, body):
            raise LoweringError(f"a {op.name} nested in control flow around the wave-group ping-pong: the groups "
                                "run it a data-dependent number of times, so their s_barrier counts could differ "
                                "(a hang); keep barriers out of `if`s and inner loops", op, fn.name)
        if op.name == "return" and op is not fn.body.ops[-1]:
            raise LoweringError("an early return in a kernel with the wave-group ping-pong: the returning group "
                                "would skip barriers the other still waits at; end the kernel once", op, fn.name)
    step = loop.operands[2].owner
    if not (isinstance(step, Operation) and step.name == "constant" and step.attrs["value"] > 0):
        raise LoweringError("the wave-group ping-pong balances the groups' iterations, which needs a positive "
                            "compile-time step; loop with step 1", loop, fn.name)


def _split_ids(fn: Function, b: "_Builder", group: Value, threads: int) -> dict[Value, Value]:
    """thread_id becomes the id within the group; program_id(0) 2 * pid + group, num_programs(0) twice it.
    Returns {each new program id: its value with `group` replaced by the other group's}."""
    mapping: dict[Value, Value] = {}
    others: dict[Value, Value] = {}
    for op in list(fn.walk()):
        if id(op) in b.made:
            continue
        if op.name == "thread_id":
            mapping[op.result] = b.after(op, lambda op=op: b.emit("rem", [op.result, b.const(threads)]))
        elif op.name == "program_id" and op.attrs["axis"] == 0:
            def ids(op=op):
                twice = b.emit("mul", [op.result, b.const(GROUPS)])
                mine = b.emit("add", [twice, group])
                others[mine] = b.emit("add", [twice, b.emit("sub", [b.const(GROUPS - 1), group])])
                return mine
            mapping[op.result] = b.after(op, ids)
        elif op.name == "num_programs" and op.attrs["axis"] == 0:
            mapping[op.result] = b.after(op, lambda op=op: b.emit("mul", [op.result, b.const(GROUPS)]))
    b.replace(fn, mapping)
    return others


def _split_shared_memory(fn: Function, b: "_Builder", group: Value, loop: Operation, limit: int) -> None:
    """Each group's shared memory is its own copy: every buffer moves by group * (the kernel's bytes)."""
    used = int(fn.attrs.get("shared_bytes", 0))
    if not used:
        return
    allocs = [op for op in fn.walk() if op.name == "shared_alloc"]
    align = max([SHARED_COPY_ALIGN] + [int(op.attrs.get("align", 16)) for op in allocs])
    copy = -(-used // align) * align
    if GROUPS * copy > limit:
        raise LoweringError(f"the wave-group ping-pong gives each group its own shared memory: {GROUPS} x {copy} "
                            f"bytes, more than the target's {limit}; use smaller blocks (BN, or a head dim whose "
                            f"tiles fit) or drop pingpong=True", loop, fn.name)
    mapping = {}
    for op in allocs:       # its bytes now span both copies, so group 1's accesses stay inside the buffer
        op.attrs["bytes"] += copy
        elements = copy * 8 // op.result.type.pointee.bits
        mapping[op.result] = b.after(op, lambda op=op, n=elements: b.emit(
            "addptr", [op.result, b.emit("mul", [group, b.const(n)])], op.result.type))
    b.replace(fn, mapping)
    fn.attrs["shared_bytes"] = GROUPS * copy


def _stagger(fn: Function, b: "_Builder", loop: Operation, group: Value, programs: dict[Value, Value]) -> None:
    """Replace `loop` by `if group == 0 {loop; balance; closing barrier} else {stagger barrier; loop; balance}`."""
    barriers = sum(op.name == "barrier" for op in loop.regions[0].ops)
    lb, ub, step = loop.operands[:3]
    b.block, b.index = fn.body, fn.body.ops.index(loop)
    mine = _trip_count(b, lb, ub, step)
    other = _trip_count(b, *_clone_bounds(fn, b, loop, programs), step)
    behind = b.emit("mul", [b.emit("max", [b.emit("sub", [other, mine]), b.const(0)]), b.const(barriers)])
    is_first = b.emit("cmp", [group, b.const(0)], attrs={"pred": "eq"})
    branches = []
    for first in (True, False):
        inner = _Builder(Block(), b.made)
        if not first:
            inner.phase_barrier(fenced=False)           # the stagger: group 1 starts one phase behind
        copy = inner.insert(clone_op(loop, {}))
        _phases(copy)
        _balance(inner, behind)
        if first:
            inner.phase_barrier(fenced=False)           # closing: meets group 1's last phase
        inner.insert(Operation("yield", list(copy.results), []))
        branches.append(inner.block)
    split = Operation("if", [is_first], [r.type for r in loop.results], None, branches)
    assert fn.body.ops[b.index] is loop
    split.parent = fn.body
    fn.body.ops[b.index] = split
    replace_uses(fn, dict(zip(loop.results, split.results)))


def _phases(loop: Operation) -> None:
    """In one group's copy of the loop: each barrier a fenced phase_barrier between sched_fences, and each
    phase's MFMAs bracketed by set_priority 1 / 0 (inside sched_fences, so the priority covers them)."""
    body = loop.regions[0]
    ops: list[Operation] = []
    phase: list[Operation] = []

    def close_phase():
        mfmas = [i for i, op in enumerate(phase) if op.name == "mfma"]
        if mfmas:
            first, last = mfmas[0], mfmas[-1]
            phase[last + 1:last + 1] = [Operation("set_priority", [], [], {"level": 0}),
                                        Operation("sched_fence", [], [])]
            phase[first:first] = [Operation("sched_fence", [], []), Operation("set_priority", [], [], {"level": 1})]
        ops.extend(phase)
        phase.clear()

    for op in body.ops:
        if op.name == "barrier":
            close_phase()
            ops.extend([Operation("sched_fence", [], []), Operation("phase_barrier", [], [], {"fenced": True}),
                        Operation("sched_fence", [], [])])
        else:
            phase.append(op)
    terminator = phase.pop()            # the yield stays last
    close_phase()
    ops.append(terminator)
    for op in ops:
        op.parent = body
    body.ops = ops


def _balance(b: "_Builder", count: Value) -> None:
    """`count` unfenced phase barriers: the iterations the other group runs beyond this one's."""
    body = Block([I32], ["i"])
    inner = _Builder(body)
    inner.phase_barrier(fenced=False)
    body.append(Operation("yield", [], []))
    b.insert(Operation("for", [b.const(0), count, b.const(1)], [], None, [body]))


def _trip_count(b: "_Builder", lb: Value, ub: Value, step: Value) -> Value:
    """max(0, ceil((ub - lb) / step)) for a positive step, as i32."""
    span = b.emit("add", [b.emit("sub", [ub, lb]), b.emit("sub", [step, b.const(1, lb.type)])])
    count = b.emit("max", [b.emit("div", [span, step]), b.const(0, lb.type)])
    return count if lb.type == I32 else b.emit("cast", [count], I32)


def _clone_bounds(fn: Function, b: "_Builder", loop: Operation, programs: dict[Value, Value]) -> list[Value]:
    """The loop's lower and upper bounds as the other group's program computes them: their defining ops cloned
    (before the loop) with each program id replaced by the other group's."""
    needed: list[Operation] = []
    seen: set[int] = set()

    def visit(value: Value) -> None:
        if value in programs or not isinstance(value.owner, Operation) or id(value.owner) in seen:
            return
        op = value.owner
        seen.add(id(op))
        if op.regions or op.name == "thread_id" or OPS[op.name].writes_memory:
            raise LoweringError(f"the loop's bounds depend on '{op.name}', which the wave-group ping-pong cannot "
                                "recompute for the other group's program (it balances their barrier counts by "
                                "the trip counts); compute the bounds from scalars and program ids", loop, fn.name)
        for operand in op.operands:
            visit(operand)
        needed.append(op)

    for bound in loop.operands[:2]:
        visit(bound)
    mapping = dict(programs)
    if not any(v in mapping for op in needed for v in op.operands):
        return list(loop.operands[:2])          # the bounds do not depend on the program: the same trip count
    order = {id(op): i for i, op in enumerate(fn.walk())}
    for op in sorted(needed, key=lambda op: order[id(op)]):
        b.insert(clone_op(op, mapping))
    return [mapping.get(v, v) for v in loop.operands[:2]]


class _Builder:
    """Inserts thread ops into a block at a moving position, remembering every op it made (`made`)."""

    def __init__(self, block: Block, made: set[int] | None = None, at: int | None = None):
        self.block = block
        self.index = len(block.ops) if at is None else at
        self.made = made if made is not None else set()

    def insert(self, op: Operation) -> Operation:
        op.parent = self.block
        self.block.ops.insert(self.index, op)
        self.index += 1
        self.made.add(id(op))
        return op

    def emit(self, name: str, operands: list[Value], type=None, attrs: dict | None = None) -> Value:
        if type is None:
            type = OPS[name].infer([v.type for v in operands], attrs or {})[0]
        return self.insert(Operation(name, operands, [type], attrs)).result

    def const(self, value: int, type=I32) -> Value:
        return self.insert(Operation("constant", [], [type], {"value": value})).result

    def phase_barrier(self, fenced: bool) -> None:
        for op in (Operation("sched_fence", [], []), Operation("phase_barrier", [], [], {"fenced": fenced}),
                   Operation("sched_fence", [], [])):
            self.insert(op)

    def after(self, op: Operation, build) -> Value:
        """What `build()` emits, inserted just after `op` in op's block (the builder's position is kept)."""
        saved = self.block, self.index
        self.block, self.index = op.parent, op.parent.ops.index(op) + 1
        try:
            return build()
        finally:
            self.block, self.index = saved

    def replace(self, fn: Function, mapping: dict[Value, Value]) -> None:
        """Uses of each old value become its new one, except in the ops this builder made (which compute the
        new values from the old)."""
        for op in fn.walk():
            if id(op) not in self.made and any(v in mapping for v in op.operands):
                op.operands = [mapping.get(v, v) for v in op.operands]
