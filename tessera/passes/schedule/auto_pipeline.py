"""Software pipelining of plain `range` loops that feed a tensor-core dot, with nobody asking for it.

Input: a tile-IR `for` without a `stages` attribute (a `range` loop:
`tessera.pipeline(..., stages=S)` records S, and `stages=1` is the way to
say "keep it plain"), or a `while`. Job: decide whether the compiler may
pipeline it on its own, and how deep. It does, Triton-style, when

* the body has a `dot` on the tensor cores (`mma.mma_plan`) whose A or B a
  load of the body makes (the loop "feeds a dot"; other loops are left
  alone without a word, and so is a loop that moves data through shared
  memory itself with the `tessera.smem_*` ops: its author wrote the
  schedule, and its async groups would mix with the ring's);
* the target has cp.async (sm_80 and newer): the default depth is
  `DEFAULT_STAGES`, shrunk without a word to what shared memory holds; on
  targets without it (AMD) the loop stays single-stage, as an explicit
  `tessera.pipeline` would;
* reading iterations ahead cannot change what the loop computes: the loads'
  views and offsets come from the induction variable and loop-invariant
  values only (`pipeline_plan`'s address slice), and nothing in the body
  writes global memory a pipelined load may read (`may_alias`: each write
  reaches memory through kernel parameters other than the load's, all of
  them `noalias`, i.e. the launch found their memory disjoint);
* the trip count is known when the loop starts: a `for`'s bounds are read
  once, on entry (from registers or memory alike), so every `for`
  qualifies; a `while` (or a `for` with `break`) decides at every iteration
  and is never pipelined.

Guarantee: a loop this module pipelines is lowered exactly like
`tessera.pipeline(..., stages=DEFAULT_STAGES)` (`software_pipeline.py`),
and a loop that feeds a dot but is not pipelined gets an
`UnpipelinedLoopWarning` at its line naming why and the fix: kept in the
kernel's `lowering_notes`, raised as a `CompileError` in strict mode only
(a plain loop is a valid program, so outside strict mode nothing is shown).
"""

from __future__ import annotations

import warnings

from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.ops import OPS
from tessera.ir.types import PointerType, TileType, ViewType

from ..errors import UnpipelinedLoopWarning
from ..mma import mma_plan
from .pipeline_plan import NO_BLOCK_LOAD, PipelinePlan, pipeline_plan
from .shortfalls import place

DEFAULT_STAGES = 3          # Triton's default num_stages; two blocks of 128x64 f16 per stage fit 3 deep on sm_80
WRITE_WORDS = {"view_store": "store", "atomic_rmw": "atomic", "atomic_cas": "atomic compare-and-swap"}
OPT_OUT = "write tessera.pipeline(start, stop, step, stages=1) to keep it a plain loop and silence this"


def auto_plan(ctx, loop: Operation) -> PipelinePlan | None:
    """The plan of an unannotated `for` the compiler pipelines on its own; None: it stays plain (with a
    strict-mode notice saying why when it feeds a dot)."""
    num_warps = ctx.num_threads // ctx.warp_size
    if not feeds_dot(loop.regions[0], ctx.target, num_warps) or not default_stages(ctx.target) > 1 \
            or any(op.name.startswith("smem_") for op in loop.walk()):
        return None
    why: list[str] = []
    plan = pipeline_plan(loop, ctx.target, num_warps, ctx.facts.facts, why, stages=default_stages(ctx.target))
    if plan is None:
        if why == [NO_BLOCK_LOAD]:          # say which operand comes from which load, and what keeps it out
            why = _unplanned_reasons(loop.regions[0], ctx.target, num_warps) or why
        not_pipelined(ctx, loop, "; ".join(why))
        return None
    aliased = aliasing_write(loop, plan, ctx.src)
    if aliased is not None:
        write, load = aliased
        what = WRITE_WORDS.get(write.name, write.name)
        not_pipelined(ctx, loop, f"the {what} at {place(write)} may write memory the block load at {place(load)} "
                                 f"reads, so that load cannot be issued iterations ahead (pass tensors whose memory "
                                 f"does not overlap, or store after the loop)")
        return None
    for reason in why:
        not_pipelined(ctx, loop, f"not every block load is pipelined: {reason}", partly=True)
    return plan


def default_stages(target) -> int:
    """The depth an unannotated loop gets: `DEFAULT_STAGES` with cp.async and ldmatrix, else 1 (no ring)."""
    return DEFAULT_STAGES if target.has("cp.async") and target.has("ldmatrix") else 1


def feeds_dot(body: Block, target, num_warps: int) -> bool:
    """Whether a tensor-core dot of `body` (not of a nested region) takes operand A or B from a load of the body
    (directly or through other ops of it)."""
    return bool(_fed_operands(body, target, num_warps))


def _fed_operands(body: Block, target, num_warps: int) -> list[tuple[Operation, int, Operation]]:
    """(dot, operand index, a load of the body it is computed from) for each tensor-core dot operand of `body`
    that a load of the body feeds."""
    made = {r: op for op in body.ops for r in op.results}
    fed = []
    for dot in body.ops:
        if dot.name != "dot" or mma_plan(dot, target, num_warps) is None:
            continue
        for index in (0, 1):
            load = _load_behind(dot.operands[index], made)
            if load is not None:
                fed.append((dot, index, load))
    return fed


def _load_behind(value: Value, made: dict) -> Operation | None:
    """A load of the body that `value` is computed from by ops of the body, or None."""
    work, seen = [value], set()
    while work:
        op = made.get(work.pop())
        if op is None or op in seen:
            continue
        seen.add(op)
        if op.name in ("view_load", "load"):
            return op
        work.extend(op.operands)
    return None


def _unplanned_reasons(body: Block, target, num_warps: int) -> list[str]:
    """Why no load feeding a dot of `body` is a block load pipeline_plan can take, one reason per operand."""
    reasons = []
    for dot, index, load in _fed_operands(body, target, num_warps):
        operand = f"operand {'AB'[index]} of the dot at {place(dot)}"
        if load.name == "load":
            reasons.append(f"{operand} is read through a tile of pointers (at {place(load)}); only block loads of "
                           f"views (tessera.view(...).block(...).load()) are copied ahead")
        else:
            reasons.append(f"{operand} is computed from the block load at {place(load)} by other ops; only a "
                           f"block load the dot takes as it is can be copied ahead")
    return reasons


def while_refusal(ctx, op: Operation) -> None:
    """The strict-mode notice of a `while` whose body feeds a tensor-core dot: it is never pipelined."""
    if not default_stages(ctx.target) > 1:
        return
    if feeds_dot(op.regions[1], ctx.target, ctx.num_threads // ctx.warp_size):
        not_pipelined(ctx, op, "its trip count is not known when it starts (a `while`, or a `for` with `break`, "
                               "decides at every iteration, here from values the body computes or loads), so no "
                               "copy can be issued iterations ahead; loop over range(start, stop, step) with "
                               "bounds computed before the loop", fix=False)


def not_pipelined(ctx, loop: Operation, reason: str, partly: bool = False, fix: bool = True) -> None:
    """Record why a loop feeding a dot is not (or `partly`) pipelined: a note, and a strict-mode error."""
    what = "is pipelined only in part" if partly else "is not software-pipelined"
    message = f"this loop feeds a tensor-core dot but {what}: {reason}" + (f"; {OPT_OUT}" if fix else "")
    ctx.notes.append(f"{loop.name}{f' at {loop.loc}' if loop.loc else ''}: {message}")
    warnings.warn(UnpipelinedLoopWarning(message, loop.loc), stacklevel=2)


# -- aliasing -------------------------------------------------------------------------------------------------

def aliasing_write(loop: Operation, plan: PipelinePlan, fn: Function) -> tuple[Operation, Operation] | None:
    """(a write of the body, a pipelined load it may alias), or None when no write of the body may alias one."""
    noalias = set(fn.attrs.get("noalias", ()))
    writes = [op for top in loop.regions[0].ops for op in top.walk() if _writes_global(op)]
    for load in plan.loads:
        read = pointer_roots(load.load.operands[0], fn)
        for write in writes:
            if may_alias(read, pointer_roots(write.operands[0], fn), noalias):
                return write, load.load
    return None


def may_alias(a: frozenset[int] | None, b: frozenset[int] | None, noalias: set[int]) -> bool:
    """Whether memory reached through parameters `a` may overlap memory reached through parameters `b`
    (None: through a pointer of unknown origin, e.g. one loaded from memory)."""
    if a is None or b is None:
        return True
    return any(x == y or x not in noalias or y not in noalias for x in a for y in b)


def pointer_roots(value: Value, fn: Function) -> frozenset[int] | None:
    """The indices of the kernel's pointer parameters `value` (a pointer, pointer tile or view) derives from
    through pure ops; None when it derives from something else (a loaded pointer, a loop-carried one)."""
    params = {arg: i for i, arg in enumerate(fn.args)}
    roots: set[int] = set()
    work, seen = [value], set()
    while work:
        v = work.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in params:
            if is_address(v):
                roots.add(params[v])
            continue
        owner = v.owner
        if isinstance(owner, Block):            # an induction variable is an index; a carried pointer is unknown
            if is_address(v):
                return None
            continue
        if owner is None or owner.regions or not OPS[owner.name].pure:
            if is_address(v):
                return None
            continue
        work.extend(owner.operands)
    return frozenset(roots)


def is_address(value: Value) -> bool:
    t = value.type
    return isinstance(t, (PointerType, ViewType)) or (isinstance(t, TileType) and isinstance(t.element, PointerType))


def _writes_global(op: Operation) -> bool:
    """A write to global memory through a pointer or view (operand 0): stores, view stores and atomics.
    (The body's other writes, barriers and shared memory, cannot change what a global load reads.)"""
    return OPS[op.name].writes_memory and bool(op.operands) and is_address(op.operands[0])
