"""Horizontal fusion: adjacent independent launches merged into one launch, program ids partitioned.

Launches are independent when no buffer one of them writes is touched by
another (and no buffer any of them touches overlaps another), so running
their programs in any interleaving computes what running them one after
the other does. Their grids must agree on axes 1 and 2; the merged grid
is the sum along axis 0. Program p of the merged launch runs program
p - start of the launch whose range [start, start + grid) holds p: each
body sits in an `if` on that range, with `program_id(0)` and
`num_programs(0)` replaced by the launch's own.
"""

from __future__ import annotations

from typing import Callable, Sequence

from tessera.ir import dtypes
from tessera.ir.core import Block, Value
from tessera.ir.types import ScalarType

from .accesses import Keys, accesses
from .launches import Launch
from ..dce import dce_function
from ..rewrite import remap_operands
from .merge import Merged, Refused

I32 = ScalarType(dtypes.i32)


def refusal(group: Sequence[Launch], candidate: Launch, aliased: frozenset[str]) -> str:
    """Why `candidate` cannot join `group` horizontally ('' when it can)."""
    if candidate.grid[1:] != group[0].grid[1:]:
        return f"grids differ beyond axis 0: {group[0].grid} vs {candidate.grid}"
    if candidate.fn.attrs.get("fast_math") != group[0].fn.attrs.get("fast_math"):
        return "numerics options differ (fast_math)"
    if any(launch.fn.attrs.get("cluster_dims") for launch in (*group, candidate)):
        return "a kernel runs in thread-block clusters (tessera.cluster_dims), whose program ids must stay its own"
    theirs = [_touches(l) for l in group]
    mine = _touches(candidate)
    if None in mine[0] or any(None in t[0] for t in theirs):
        return "a kernel accesses memory through an address not traced to a parameter"
    for touched, written in theirs:
        shared = (written & mine[0]) | (mine[1] & touched)
        if shared:
            return f"not independent: both touch {sorted(shared)[0]}, and one writes it"
    overlapping = sorted(mine[0] & aliased)
    if overlapping:
        return f"buffer {overlapping[0]} overlaps another buffer"
    return ""


def _touches(launch: Launch) -> tuple[set, set]:
    found = accesses(launch, Keys().bind(launch))
    return {a.buffer for a in found}, {a.buffer for a in found if a.writes}


def merge(group: Sequence[Launch]) -> Launch:
    """One launch running every launch of `group` on its own range of program ids along axis 0."""
    merged = Merged("__".join(l.name for l in group), group)
    b = merged.builder
    pid = b.create("program_id", attrs={"axis": 0}).result
    start = 0
    for launch in group:
        size = launch.grid[0]
        lo, hi = _i32(b, start), _i32(b, start + size)
        inside = b.create("and", [b.create("cmp", [pid, lo], attrs={"pred": "ge"}).result,
                                  b.create("cmp", [pid, hi], attrs={"pred": "lt"}).result]).result
        then, otherwise = Block(), Block()
        with b.at(then):
            own_pid, count = b.create("sub", [pid, lo]).result, _i32(b, size)
        merged.clone_body(launch, merged.mapping(launch), into=then)
        _renumber(then, own_pid, count)
        with b.at(then):
            b.create("yield")
        with b.at(otherwise):
            b.create("yield")
        b.create("if", [inside], regions=[then, otherwise], result_types=[])
        start += size
    return merged.launch((start, *group[0].grid[1:]), group)


def _renumber(block: Block, pid: Value, count: Value) -> None:
    """Make the ops in `block` (nested ones too) use `pid` / `count` for program_id(0) / num_programs(0)."""
    mapping = {}
    for top in block.ops:
        for op in top.walk():
            if op.name in ("program_id", "num_programs") and op.attrs["axis"] == 0:
                mapping[op.result] = pid if op.name == "program_id" else count
            remap_operands(op, mapping)


def _i32(b, value: int) -> Value:
    return b.create("constant", attrs={"value": value}, result_types=[I32]).result


def merge_adjacent(launches: Sequence[Launch], aliased: frozenset[str], record: Callable, Decision) -> list[Launch]:
    """Group runs of adjacent independent launches and merge each run of two or more."""
    result, group = [], []
    for launch in launches:
        reason = refusal(group, launch, aliased) if group else ""
        if group and reason:
            record(Decision("horizontal", ("+".join(group[-1].sources), launch.name), False, reason))
            result.extend(_merged(group, record, Decision))
            group = []
        group.append(launch)
    result.extend(_merged(group, record, Decision))
    return result


def _merged(group: list[Launch], record: Callable, Decision) -> list[Launch]:
    """[the merged launch], or the group as it was (one launch, or a merge refused)."""
    if len(group) < 2:
        return list(group)
    names = tuple("+".join(l.sources) for l in group)
    try:
        launch = merge(group)
    except Refused as exc:
        record(Decision("horizontal", names, False, str(exc)))
        return list(group)
    dce_function(launch.fn)
    record(Decision("horizontal", names, True, f"{len(group)} launches -> 1, grid {launch.grid[0]}"))
    return [launch]
