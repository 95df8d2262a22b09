"""The tile -> thread passes, in order: layouts, lowering, low-bit unpacking, shared memory, verification.

    module = lower(tile_module, "sm_90", num_warps=4)

For each function: the alignment analysis, `layout_assignment` (with the
layouts its `convert_layout` ops pin, plus any `overrides`, which win),
the `register_budget` check (a tile one thread cannot hold is refused here,
before any per-thread code exists), `lower_to_threads`, `rematerialize_index` (index math used in `while`
loops, or in an `if` holding a loop after a loop, recomputed there, then DCE), `defer_wgmma_wait` (each
wgmma wait moved down to the first read of its results), `pingpong` (the turn-taking barriers of a
`pingpong` loop), `low_bit` (sub-byte loads and stores become byte accesses), `merge_mbarrier_inits`
(the top-level mbarrier inits behind one fence and one barrier), `shared_memory` allocation (lowering
again when the staging buffers that loops overlap with the next iteration do not fit: first with C
tiles stored from their registers staged a column block at a time through two block-sized slots, then
with every TMA store waiting for its read at once), `wave_pingpong` (AMD: a `pingpong` loop without warp
specialization runs two programs per block, their wave groups staggered; layouts are then assigned for half
the warps), and the verifier on the result. Returns a new module of thread-IR functions; the input is not
changed.
"""

from __future__ import annotations

from typing import Mapping

from tessera.ir.core import Function, Module, Value
from tessera.ir.layouts import RegisterLayout
from tessera.ir.target import Target, get_target
from tessera.ir.verifier import verify_function

from .dce import dce_function
from .errors import LoweringError
from .defer_wgmma_wait import defer_wgmma_waits
from .pingpong import insert_pingpong_barriers
from .layout_assignment import assign_layouts, pinned_layouts
from .low_bit import unpack_low_bit
from .lower_to_threads import lower_to_threads
from .lowering.vector_facts import VectorFacts
from .merge_mbarrier_inits import merge_mbarrier_inits
from .register_budget import check_register_budget
from .rematerialize_index import rematerialize_thread_index
from .shared_memory import allocate_shared_memory
from .wave_pingpong import GROUPS, pingpong_loop, stagger_wave_groups


def lower(module_or_fn: Module | Function, target: Target | str, num_warps: int = 4,
          overrides: Mapping[Value, RegisterLayout] | None = None, debug: bool = False,
          slice_stores: bool | None = None) -> Module:
    """Thread IR for every function of `module_or_fn` on `target` with `num_warps` warps per block; `debug`
    keeps device-side print and assert (dropped otherwise). `slice_stores` stages every C stored from its
    registers (pairs, stmatrix) a column block at a time (True), never (False), or where a whole tile's
    overlapped buffer does not fit (None)."""
    if isinstance(target, str):
        target = get_target(target)
    functions = module_or_fn.functions if isinstance(module_or_fn, Module) else [module_or_fn]
    out = Module()
    for fn in functions:
        facts = VectorFacts(fn)
        pins = {**pinned_layouts(fn), **(overrides or {})}
        warps = _warps_per_program(fn, target, num_warps)
        assignment = assign_layouts(fn, target, warps, pins, facts)
        check_register_budget(assignment, target)
        lowered = _to_threads(fn, assignment, target, warps, facts, debug, True, bool(slice_stores))
        if slice_stores is None and _overlapped_stores_overflow(lowered, target):   # C a block at a time
            lowered = _to_threads(fn, assignment, target, warps, facts, debug, True, slice_stores=True)
        if _overlapped_stores_overflow(lowered, target):
            lowered = _to_threads(fn, assignment, target, warps, facts, debug, False, bool(slice_stores))
        allocate_shared_memory(lowered, target.shared_memory_bytes)
        if warps != num_warps:
            stagger_wave_groups(lowered, target.shared_memory_bytes)
        verify_function(lowered)
        out.functions.append(lowered)
    return out


def _to_threads(fn, assignment, target: Target, num_warps: int, facts, debug: bool, overlap_stores: bool,
                slice_stores: bool = False) -> Function:
    """`lower_to_threads` and the thread-IR passes after it, up to shared-memory allocation."""
    lowered = lower_to_threads(fn, assignment, target, num_warps, facts, debug, overlap_stores,
                               slice_stores).functions[0]
    if rematerialize_thread_index(lowered):
        dce_function(lowered)
    defer_wgmma_waits(lowered)
    insert_pingpong_barriers(lowered)
    unpack_low_bit(lowered, target.max_vector_bits)
    merge_mbarrier_inits(lowered)
    return lowered


def _overlapped_stores_overflow(lowered: Function, target: Target) -> bool:
    """Whether `lowered` gave TMA stores' staging buffers bytes of their own across a loop (`async_reads`,
    `schedule/tma_store.py`) and so needs more shared memory than `target` has: then the kernel is lowered
    again with every store waiting for its read at once, whose buffers may share bytes."""
    if not any(op.name == "shared_alloc" and op.attrs.get("async_reads") for op in lowered.walk()):
        return False
    try:
        allocate_shared_memory(lowered, target.shared_memory_bytes)
    except LoweringError:           # (the allocator's only error: more bytes than the target has)
        return True
    return False


def _warps_per_program(fn: Function, target: Target, num_warps: int) -> int:
    """`num_warps`, or half of it for AMD's wave-group ping-pong (a `pingpong` loop without warp specialization):
    the block's waves are two groups, each running one program (`wave_pingpong.py`)."""
    loop = pingpong_loop(fn) if target.vendor == "amd" else None
    if loop is None or loop.attrs.get("warp_specialize"):
        return num_warps
    if num_warps % GROUPS:
        raise LoweringError(f"the wave-group ping-pong splits the block's waves into {GROUPS} groups, so num_warps "
                            f"must be even, got {num_warps}; launch num_warps=8 (two groups of 4 waves)", loop, fn.name)
    return num_warps // GROUPS
