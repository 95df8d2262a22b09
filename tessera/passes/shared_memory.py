"""Shared-memory allocation: give every `shared_alloc` of a thread-IR function a byte offset.

Each allocation is live from its `shared_alloc` to the last use of any
pointer derived from it (addptr, splat, pack, ...). A use inside a region
counts as a use of the whole op that holds the region at the allocation's
level, so a buffer read in a loop stays live for the whole loop. (Except
a warp-specialized split, `if {producer_joins_at = k}`: its branches are
looked into, see `_lifted_end`.) Two
allocations whose live ranges do not overlap may share bytes: the
lowering ends every use of a buffer with a barrier, so the next buffer's
writes cannot race with the last reads of the one before. Explicit buffers
(`tessera.shared`, `whole_kernel = true`) are read and filled by async
copies on the author's schedule, with no closing barrier, so they are live
for the whole kernel and share bytes with nothing. A TMA store's staging
buffer in a loop (`async_reads`, `schedule/tma_store.py`) has no closing
barrier either, but its alloc sits before the loop, so it is live across
it, and the wait and barrier right after the loop come before any later
buffer's first use.

Placement is first-fit, largest allocation first, at 16-byte alignment (the
widest vector access) or the allocation's own `align` (swizzled wgmma tiles:
the swizzle is a function of the absolute address). The function's `shared_bytes` attribute is set to
the bytes used; a function that needs more than the target has raises
`LoweringError`: located at a pipelined loop whose rings (`ring_stages`) are
part of the overflow, naming the most stages that fit beside the other
buffers, else naming the largest buffers.
"""

from __future__ import annotations

from typing import Callable

from tessera.ir.core import Block, Function, Module, Operation, Value
from tessera.ir.target import Target, get_target
from tessera.ir.types import PointerType, element_of

from .errors import LoweringError

ALIGNMENT = 16


def allocate_shared_memory(fn: Function, capacity: int | None = None) -> int:
    """Assign offsets to `fn`'s shared_allocs in place; set and return `fn.attrs["shared_bytes"]`.

    capacity: the most bytes the block may use (default: the function's
    `target` attribute's shared memory per block; no check without one).
    """
    positions, ends = _number_ops(fn)
    allocs = [op for op in fn.walk() if op.name == "shared_alloc"]
    last = len(positions) - 1
    ranges = {op: (0, last) if op.attrs.get("whole_kernel") else (positions[op], _live_end(op, positions, ends))
              for op in allocs}
    offsets, total = _place(allocs, ranges, positions)
    for op, offset in offsets.items():
        op.attrs["offset"] = offset
    fn.attrs["shared_bytes"] = total
    if capacity is None and "target" in fn.attrs:
        capacity = get_target(fn.attrs["target"]).shared_memory_bytes
    if capacity is not None and total > capacity:
        raise _too_much(fn, allocs, ranges, positions, total, capacity)
    return total


def _place(allocs: list[Operation], ranges: dict, positions: dict,
           size: Callable[[Operation], int] = lambda op: op.attrs["bytes"]) -> tuple[dict[Operation, int], int]:
    """First-fit placement, largest first: (each allocation's offset, the bytes used), with `size` bytes each."""
    placed: list[tuple[Operation, int]] = []
    for op in sorted(allocs, key=lambda o: (-size(o), positions[o])):
        start, end = ranges[op]
        busy = sorted((offset, offset + size(other)) for other, offset in placed
                      if ranges[other][0] <= end and start <= ranges[other][1])
        offset = 0
        for lo, hi in busy:
            if offset + size(op) <= lo:
                break
            offset = max(offset, _align(hi, op.attrs.get("align", ALIGNMENT)))
        placed.append((op, offset))
    return dict(placed), max((offset + size(op) for op, offset in placed), default=0)


def _too_much(fn: Function, allocs: list[Operation], ranges: dict, positions: dict, total: int,
              capacity: int) -> LoweringError:
    """The error for a kernel needing `total` bytes of shared memory, more than `capacity`. Where a pipelined
    loop's rings (`ring_stages`) hold part of them, it is located at that loop and names the most stages that
    fit beside the buffers live with them (placed again with the rings that deep), since the ring depth was
    chosen from the rings alone (`schedule/pipeline_plan.py`); otherwise at the largest buffer."""
    on = f" on {fn.attrs['target']}" if "target" in fn.attrs else ""
    need = f"the kernel needs {total} bytes of shared memory, more than the {capacity} a block has{on}"
    rings: dict[object, list[Operation]] = {}
    for op in allocs:
        if op.attrs.get("ring_stages"):
            rings.setdefault((op.loc, op.attrs["ring_stages"]), []).append(op)
    others = sorted((op for op in allocs if not op.attrs.get("ring_stages")), key=lambda o: -o.attrs["bytes"])
    ring: list[Operation] = []
    if rings:
        (_, stages), ring = max(rings.items(), key=lambda item: sum(o.attrs["bytes"] for o in item[1]))

    def used(depth: int) -> int:
        return _place(allocs, ranges, positions,
                      lambda o: o.attrs["bytes"] * depth // stages if o in ring else o.attrs["bytes"])[1]
    if not ring or used(0) > capacity:      # no ring, or the kernel does not fit even without this one
        listed = ", ".join(_described(o) for o in sorted(allocs, key=lambda o: -o.attrs["bytes"])[:3])
        largest = max(allocs, key=lambda o: o.attrs["bytes"])
        return LoweringError(f"{need} (largest buffers: {listed}); use smaller tiles or fewer warps' worth of "
                             f"data per reduction", largest, fn.name)
    ring_bytes = sum(o.attrs["bytes"] for o in ring)
    live = [o for o in allocs if o in ring or any(ranges[o][0] <= ranges[r][1] and ranges[r][0] <= ranges[o][1]
                                                  for r in ring)]
    beside = _place(live, ranges, positions)[1] - ring_bytes        # what the buffers live with the rings add
    fits = next((depth for depth in range(stages - 1, 1, -1) if used(depth) <= capacity), None)
    where = f"line {ring[0].loc.line}" if ring[0].loc is not None else "an unknown line"
    listed = ", ".join(_described(o) for o in [o for o in others if o in live][:2]) or "none"
    if fits is not None:
        fix = f"pass stages={fits} to that tessera.pipeline (the most that fit beside them), or use smaller blocks"
    else:
        fix = ("not even 2 stages fit beside them: pass stages=1 to that tessera.pipeline (no ring), or use "
               "smaller blocks")
    return LoweringError(f"{need}: the pipelined loop at {where} keeps {stages} stages of its ring buffers "
                         f"({ring_bytes} bytes, {ring_bytes // stages} a stage), chosen to fit shared memory on "
                         f"their own, and the buffers live beside them take {beside} more at the peak (largest: "
                         f"{listed}); {fix}", ring[0], fn.name)


def _described(op: Operation) -> str:
    return f"{op.attrs['bytes']} bytes" + (f" at {op.loc}" if op.loc else "")


class SharedMemoryAllocation:
    """The pass object for `PassManager`: allocate every function of a thread-IR module."""

    name = "shared-memory"

    def __init__(self, target: Target | None = None):
        self.target = target

    def run(self, module: Module) -> None:
        for fn in module.functions:
            allocate_shared_memory(fn, self.target.shared_memory_bytes if self.target else None)


def _align(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def _number_ops(fn: Function) -> tuple[dict[Operation, int], dict[Operation, int]]:
    """Pre-order position of every op, and the last position inside each op's regions."""
    positions: dict[Operation, int] = {}
    ends: dict[Operation, int] = {}

    def visit(block: Block) -> None:
        for op in block.ops:
            positions[op] = len(positions)
            for region in op.regions:
                visit(region)
            ends[op] = len(positions) - 1

    visit(fn.body)
    return positions, ends


def _is_shared_pointer(value: Value) -> bool:
    elem = element_of(value.type)
    return isinstance(elem, PointerType) and elem.address_space == "shared"


def _live_end(alloc: Operation, positions: dict, ends: dict) -> int:
    """The last position where a pointer derived from `alloc` is used, lifted to `alloc`'s block."""
    home = alloc.parent
    derived, work, last = {alloc.result}, [alloc.result], positions[alloc]
    users = _users(alloc)
    while work:
        value = work.pop()
        for user in users.get(value, ()):
            last = max(last, _lifted_end(user, home, ends))
            for result in user.results:
                if _is_shared_pointer(result) and result not in derived:
                    derived.add(result)
                    work.append(result)
    return last


def _lifted_end(user: Operation, home: Block, ends: dict) -> int:
    """The last position `user` keeps a buffer of block `home` live: the end of the op of `home` holding it.

    A warp-specialized split (`if {producer_joins_at = k}`) is looked into rather than held whole: a use
    in its else region (the consumers) counts where the op of that region holding it ends, and a use in
    its then region (the producer, running beside them) counts until the consumers' op k, where both
    branches have met and the producer touches shared memory no more."""
    lifted = user
    while lifted.parent is not home and isinstance(lifted.parent.parent, Operation):
        holder = lifted.parent.parent
        if holder.name == "if" and "producer_joins_at" in holder.attrs and holder.parent is home:
            then, consumers = holder.regions
            if lifted.parent is then:
                return ends[consumers.ops[holder.attrs["producer_joins_at"]]]
            return ends[lifted]
        lifted = holder
    return ends[lifted]


def _users(alloc: Operation) -> dict[Value, list[Operation]]:
    block = alloc.parent
    while isinstance(block.parent, Operation):
        block = block.parent.parent
    users: dict[Value, list[Operation]] = {}
    for top in block.ops:
        for op in top.walk():
            for v in op.operands:
                users.setdefault(v, []).append(op)
    return users
