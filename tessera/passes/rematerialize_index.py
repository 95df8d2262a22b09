"""Rematerialize thread-index math inside `while` loops, and in an `if` holding a loop after a loop: recompute it
where it is used, from a fresh thread id.

Input: thread IR whose index math (what pure ops compute from `thread_id` and constants) the lowering hoisted
to the kernel's prologue, computed once per kernel (`lowering/thread_index.py`). Job: for every use of such a
value by an op nested in a `while` loop, clone the chain that computes it, starting from a new
`thread_id {reread = true}`, into the user's block just before its first user there, and use the clone.
What the prologue no longer feeds is left for DCE.

Why: a persistent kernel runs all its work items in one `while` loop (a ticket loop). Hoisted to the prologue,
the index math of every phase (routing, alignment, both GEMMs, the combine) stays live across the whole loop,
and the kernel needs their sum of registers instead of their maximum: the one-launch MoE layer took 255
registers and spilled 260-372 bytes on sm_80 where each GEMM kernel alone takes 166. Recomputed per item it
costs a few integer ops, and the kernel fits (128 registers at the decode plan, 168 at the middle one, no
spills). A reread `thread_id` is a volatile read of %tid.x on NVIDIA, so LLVM cannot hoist the clones back
out of the loop (its loop-invariant code motion would: the usual read is a pure intrinsic).
Loops other than `while` (K loops, static loops) keep the hoisted values: there they are the point.

The same holds for a top-level `if` that holds a loop and follows a loop (a `for` or `while`, or an op holding
one, such as an `if` around a K loop): index math that only the `if` needs would be live through the whole
loop, in registers the loop wanted, and what the loop needs too would stay live past it, through the `if`'s
loops.
Every use in such an `if` is rewritten the same way, so no prologue value lives past the last loop that uses
it. The split-KV decode kernel merges the splits in such an `if` after its key loops (before this rule it
wrapped the merge in a `while` run at most once; with the values the key loop uses left hoisted, sm_80's
online head-dim-128 tile spilled 4 bytes). As in a `while`, a clone goes into its user's block, also inside a
`for` nested in the `if` (the merge's loop over splits; the unified-max kernel's fallback key loop, in an `if`
after the first key loop): cloned before that `for` instead, the merge's index math spilled sm_80's online
head-dim-128 32-row tile. An `if` without a loop of its own keeps the hoisted values: its uses are one
straight run, where a chain recomputed from a volatile reread (which LLVM cannot share with the prologue's)
costs registers at the very point it would free them: rewriting MoE's align_kernel's `if chunk == 0` (one
store of the offsets after its padding loops) spilled 4 bytes at 80 registers on sm_80 with 128 experts.
"""

from __future__ import annotations

from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.ops import OPS


def rematerialize_thread_index(fn: Function) -> int:
    """Rewrite `fn` in place (see the module docstring); returns how many operands now use a clone."""
    derived = _index_math(fn)
    if not derived:
        return 0
    rewritten, after_loop = 0, False
    for op in fn.body.ops:
        for region in op.regions:
            rewritten += _rewrite_block(region, derived, op.name == "while" or (after_loop and op.name == "if"
                                                                                and _holds_loop(op)))
        after_loop = after_loop or _holds_loop(op)
    return rewritten


def _holds_loop(op: Operation) -> bool:
    """Whether `op` is a loop or has one nested in its regions."""
    return any(inner.name in ("for", "while") for inner in op.walk())


def _index_math(fn: Function) -> set[Value]:
    """The prologue's values computed from `thread_id` by pure ops (constants are not included: they cost no
    register and fold into instructions)."""
    derived: set[Value] = set()
    for op in fn.body.ops:
        if op.regions or not op.results:
            continue
        if op.name == "thread_id" or (OPS[op.name].pure and any(v in derived for v in op.operands)):
            derived.update(op.results)
    return derived


def _rewrite_block(block: Block, derived: set[Value], active: bool) -> int:
    """Rewrite the uses of `derived` values in `block` and the blocks nested in it, once `active` (inside a
    `while`, or a top-level `if` holding a loop after a loop)."""
    clones: dict[Value, Value] = {}        # per block: a clone dominates the rest of its block
    rewritten, i = 0, 0
    while i < len(block.ops):
        op = block.ops[i]
        if active:
            for k, value in enumerate(op.operands):
                if value in derived:
                    op.operands[k], added = _materialize(value, block, i, derived, clones)
                    i += added
                    rewritten += 1
        for region in op.regions:
            rewritten += _rewrite_block(region, derived, active or op.name == "while")
        i += 1
    return rewritten


def _materialize(value: Value, block: Block, at: int, derived: set[Value],
                 clones: dict[Value, Value]) -> tuple[Value, int]:
    """`value` recomputed in `block` before position `at` (reusing earlier clones); and how many ops it added."""
    if value in clones:
        return clones[value], 0
    source: Operation = value.owner
    added, operands = 0, []
    for operand in source.operands:
        if operand in derived:
            operand, more = _materialize(operand, block, at + added, derived, clones)
            added += more
        operands.append(operand)
    attrs = {**source.attrs, "reread": True} if source.name == "thread_id" else dict(source.attrs)
    clone = Operation(source.name, operands, [r.type for r in source.results], attrs, loc=source.loc)
    clone.parent = block
    block.ops.insert(at + added, clone)
    clones[value] = clone.results[value.index]
    return clones[value], added + 1
