"""defer_wgmma_wait: each `wgmma_wait {pending = 0}` moves down to just before the first read of what it retires.

Input: thread IR, where a dot on wgmma lowers to `wgmma_fence; wgmma...; wgmma_commit; wgmma_wait {pending = 0}`
(`lowering/wgmma_dot.py`) and so waits for its group at once. Job: within each block, move such a wait down past
the ops that do not need its group, so that independent work between the issue and the first use overlaps
the tensor cores: another dot's wgmmas (each `wgmma_commit` passed adds one to `pending`: the later groups may
stay in flight), scalar and register arithmetic that does not read its results, loads. FlashAttention-3's
intra-warpgroup overlap (section 3.2) is then a matter of writing the loop in that order: S_next = Q K^T
issued, then O += P V, then the softmax of S_next after `wgmma_wait {pending = 1}`, then O's rescale after
`wgmma_wait {pending = 0}`.

A wait stops before the first op that
* reads a value the wait retires (the results of the wgmmas between the previous wait of the block, or its
  start, and the wait: with no earlier wait in the block, also the results of wgmmas outside the block and
  the loop-carried arguments a loop that keeps its group in flight may hold in flight: those its yield hands
  a wgmma result not waited for after it);
* writes memory or synchronizes (stores, barriers, mbarrier arrivals, async copies, fences: the wgmmas in
  flight may read the shared memory they would release or overwrite), other than the wgmma protocol's
  `wgmma_fence` and `wgmma_commit`; or ends the block;
* holds a region that does any of these or any wgmma op (a masking `if` over other values is passed);
* is another wait: the two become one, with the smaller `pending`.
A wait that would stop between a `wgmma_fence` and the wgmmas it fences goes before the fence instead (the
fence orders the wait's register reads before those wgmmas). Waits whose segment holds a region with wgmma
ops (a loop whose result may be in flight; a TMA refill's `if` is fine) and waits with `pending` > 0 (a loop
that keeps its group in flight on purpose) stay where they are. Waits are placed from the block's last to its first, so each one that moves meets the
later ones at their new places.

Guarantee: every read of a wgmma result still follows a wait that retires its group, and no shared memory
changes while a group reads it that did not change before: the SIMT simulator, which reports early reads and
operands written in flight, runs the moved code (`tests/passes/test_defer_wgmma_wait.py`).
"""

from __future__ import annotations

from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.ops import OPS

PASSABLE_SYNC = frozenset({"wgmma_fence", "wgmma_commit"})  # the wgmma protocol itself: they touch no memory
GROUP_OPS = frozenset({"wgmma", "wgmma_commit", "wgmma_wait"})  # what changes the count of groups in flight


def defer_wgmma_waits(fn: Function) -> int:
    """Move the waits of every block of `fn` in place (see the module docstring); returns how many moved."""
    return _defer_in_block(fn.body)


def _defer_in_block(block: Block) -> int:
    moved = sum(_defer_in_block(region) for op in list(block.ops) for region in op.regions)
    waits = [op for op in block.ops if op.name == "wgmma_wait"]
    for wait in reversed(waits):
        if wait.parent is block and _defer(block, wait):
            moved += 1
    return moved


def _retired(block: Block, wait: Operation) -> set[Value] | None:
    """The values `wait` makes ready: the wgmma results since the block's previous wait (or its start, and then
    the arguments a loop may carry in flight); None when an op in between issues or waits for wgmmas in a
    region (a loop: its results may be in flight)."""
    at = block.ops.index(wait)
    start = next((i + 1 for i in range(at - 1, -1, -1) if block.ops[i].name == "wgmma_wait"), 0)
    retired = _carried_in_flight(block) | _issued_outside(block) if start == 0 else set()
    for op in block.ops[start:at]:
        if op.regions and any(inner.name in GROUP_OPS for inner in op.walk()):
            return None
        if op.name == "wgmma":
            retired.update(op.results)
    return retired


def _issued_outside(block: Block) -> set[Value]:
    """The results of wgmmas outside `block` that its ops read: a group issued before a region may be retired
    by the region's first wait."""
    inside = {op for top in block.ops for op in top.walk()}
    return {v for top in block.ops for op in top.walk() for v in op.operands
            if isinstance(v.owner, Operation) and v.owner.name == "wgmma" and v.owner not in inside}


def _carried_in_flight(block: Block) -> set[Value]:
    """The block's arguments that may hold a wgmma result still in flight: those of a `for` body whose yield
    hands on a wgmma's result with no `wgmma_wait {pending = 0}` after it in the body (a loop keeping its group
    in flight); all arguments of other nested blocks; none of the kernel's."""
    owner = block.parent
    if not isinstance(owner, Operation):
        return set()
    yielded = block.terminator.operands if block.terminator is not None else []
    if owner.name != "for" or len(block.args) != len(yielded) + 1:
        return set(block.args)
    drained = max((i for i, op in enumerate(block.ops) if op.name == "wgmma_wait" and op.attrs["pending"] == 0),
                  default=-1)
    position = {op: i for i, op in enumerate(block.ops)}
    return {arg for arg, value in zip(block.args[1:], yielded)
            if isinstance(value.owner, Operation) and value.owner.name == "wgmma"
            and position.get(value.owner, drained + 1) > drained}


def _stops(op: Operation, retired: set[Value]) -> bool:
    """Whether a wait retiring `retired` must come before `op` (an op with regions: before any op in them)."""
    if op is op.parent.terminator:
        return True
    for inner in op.walk():
        if any(v in retired for v in inner.operands):
            return True
        if inner is not op and inner.name in GROUP_OPS:
            return True     # a group issued or waited for in a region: how many are pending depends on the branch
        if OPS[inner.name].writes_memory and inner.name not in PASSABLE_SYNC:
            return True
    return False


def _defer(block: Block, wait: Operation) -> bool:
    """Move `wait` down (see the module docstring); whether it moved (or merged into a later wait)."""
    retired = _retired(block, wait) if wait.attrs["pending"] == 0 else None
    if retired is None:
        return False
    ops = block.ops
    at = ops.index(wait)
    pending, fence, i = 0, None, at + 1
    while i < len(ops):
        op = ops[i]
        if op.name == "wgmma_wait":         # the later wait retires at least as much, or is made to
            op.attrs["pending"] = min(op.attrs["pending"], pending)
            ops.remove(wait)
            return True
        if _stops(op, retired):
            break
        if op.name == "wgmma_fence":
            fence = i
        elif op.name == "wgmma_commit":
            pending, fence = pending + 1, None
        i += 1
    target = fence if fence is not None else i
    if target == at + 1:
        return False
    wait.attrs["pending"] = pending
    ops.insert(target, wait)
    del ops[at]
    return True
