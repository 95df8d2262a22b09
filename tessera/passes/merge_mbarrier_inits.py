"""merge_mbarrier_inits: the kernel's top-level mbarrier inits share one fence and one block barrier.

Input: thread IR before shared-memory allocation. Each lowering that sets up mbarriers (a TMA ring's full and
empty ones, a TMA-loaded wgmma operand's, the language's `smem_mbarriers`) emits its own *init group* where it
needs them:

    if %first_thread { (addptr of the array;) mbarrier_init %bar, %count ...; fence_mbarrier_init }
    barrier

so on sm_90a the attention forward (Q by TMA, then the K/V ring) paid two block-wide `bar.sync` before its
loop and three when warp-specialized, a GEMM with a TMA-loaded operand two. Job: move the `mbarrier_init`s of
each later init group of the function body into the first one, before its fence, and delete the later group's
`if`, fence and barrier; the ops their operands come from (the mbarriers' `shared_alloc`, `addptr`s,
constants) move up just before the first group, so the allocator sees the mbarriers live from there and gives
their bytes to no buffer used in between.

A later group is merged only when its barrier does nothing else: from the body's previous barrier to the
group, no op touches shared memory through the threads or synchronizes (pure ops, allocations, global
accesses, and thread 0's TMA issues in a first-thread `if`, whose landing mbarriers order, are fine); and its
operands can move (pure ops and allocations of the body). Groups inside loops and branches (a persistent
kernel re-initializes per tile) and ones with another predicate stay as they are.

Guarantee: every mbarrier is still initialized, fenced for the async proxy, and behind a block barrier before
any thread's first use of it, since the first group comes before every group it absorbs; the SIMT simulator,
which checks exactly that and every shared-memory race, runs the merged kernels
(`tests/passes/test_merge_mbarrier_inits.py`).
"""

from __future__ import annotations

from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.ops import OPS
from tessera.ir.types import PointerType, element_of

TMA_ISSUE = frozenset({"tma_load", "mbarrier_arrive_expect_tx", "mbarrier_expect_tx", "fence_proxy_async"})


def merge_mbarrier_inits(fn: Function) -> int:
    """Merge `fn`'s top-level init groups in place (see the module docstring); returns how many were merged."""
    body = fn.body
    groups = [op for op in body.ops if _is_init_group(body, op)]
    if len(groups) < 2:
        return 0
    first, merged = groups[0], 0
    for group in groups[1:]:
        if _barrier_only_orders_inits(body, group) and _merge(body, first, group):
            merged += 1
    return merged


def _is_init_group(body: Block, op: Operation) -> bool:
    """`if %c { mbarrier_init... (and pure ops); fence_mbarrier_init } {}` followed by a `barrier`."""
    if op.name != "if" or len(op.regions) != 2 or op.results:
        return False
    then, other = op.regions
    names = [o.name for o in then.ops]
    at = body.ops.index(op)
    return (names[-2:] == ["fence_mbarrier_init", "yield"] and "mbarrier_init" in names
            and all(o.name == "mbarrier_init" or (OPS[o.name].pure and not o.regions) for o in then.ops[:-2])
            and [o.name for o in other.ops] == ["yield"]
            and at + 1 < len(body.ops) and body.ops[at + 1].name == "barrier")


def _barrier_only_orders_inits(body: Block, group: Operation) -> bool:
    """Whether nothing between the body's previous barrier and `group` needs the group's barrier."""
    at = body.ops.index(group)
    start = next((i + 1 for i in range(at - 1, -1, -1) if body.ops[i].name == "barrier"), 0)
    return all(_quiet(op) for op in body.ops[start:at])


def _quiet(op: Operation) -> bool:
    """`op` neither touches shared memory through the threads nor synchronizes them."""
    opdef = OPS.get(op.name)
    if op.name == "if":
        return all(_quiet(inner) for region in op.regions for inner in region.ops)
    if op.name in ("yield", "shared_alloc"):
        return True
    if op.name in TMA_ISSUE:          # thread 0's copies: their mbarrier, not a barrier, says when they land
        return True
    if opdef is None or op.regions:
        return False
    if opdef.pure:
        return True
    if opdef.pointer_lanes:           # loads, stores and atomics of global memory only
        return _space(op.operands[0]) == "global"
    return not (opdef.reads_memory or opdef.writes_memory)


def _space(value: Value) -> str | None:
    element = element_of(value.type)
    return element.address_space if isinstance(element, PointerType) else None


def _merge(body: Block, first: Operation, group: Operation) -> bool:
    """Move `group`'s inits (and what defines their operands) into `first`; False, changing nothing, when the
    predicates differ or an operand cannot move."""
    if group.operands[0] is not first.operands[0]:
        return False
    inits = group.regions[0].ops[:-2]         # the inits and the addresses they compute
    movers: list[Operation] = []
    outside = [v for init in inits for v in init.operands if v.owner not in inits]
    if not all(_collect(body, first, value, movers) for value in outside):
        return False
    at = body.ops.index(first)
    for op in sorted(movers, key=body.ops.index):       # in program order, just before the first group
        body.ops.remove(op)
        body.ops.insert(at, op)
        at += 1
    fence = first.regions[0].ops[-2]
    then = first.regions[0]
    for init in inits:
        then.ops.insert(then.ops.index(fence), init)
        init.parent = then
    barrier = body.ops[body.ops.index(group) + 1]
    body.ops.remove(group)
    body.ops.remove(barrier)
    return True


def _collect(body: Block, first: Operation, value: Value, movers: list[Operation]) -> bool:
    """Add to `movers` the body ops after `first` that `value` derives from; False if one cannot move."""
    op = value.owner
    if not isinstance(op, Operation) or op in movers:
        return True                 # a block argument, or already taken
    if op.parent is not body:
        return False
    if body.ops.index(op) < body.ops.index(first):
        return True                 # already defined before the first group
    if not (op.name == "shared_alloc" or (OPS[op.name].pure and not op.regions)):
        return False
    movers.append(op)
    return all(_collect(body, first, v, movers) for v in op.operands)
