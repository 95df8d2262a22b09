"""Lower a tile-IR function to thread IR: what each thread of a block does.

    assignment = assign_layouts(fn, target, num_warps=4)
    module = lower_to_threads(fn, assignment, target)

Every tile value becomes the registers (`regs<N x T>`) one thread holds of
it under the layout `layout_assignment` chose; scalars stay scalars (every
thread computes the same value). The result is a new module with one
function of the same name and parameters, with the attributes
`num_threads`, `warp_size` and `target` (plus the tile function's own, such
as `divisible_by_16`). Shared-memory buffers come out unplaced
(`shared_alloc {offset = -1}`): run `shared_memory.allocate_shared_memory`
next. `thread_passes.lower` runs the whole sequence.

What each op becomes is in `lowering/` (one module per op family; their
docstrings give the rules), and for loops and explicit shared memory in
`schedule/` (software pipelining, TMA fills, warp specialization):

| ops                                   | per thread                                                    |
| ------------------------------------- | ------------------------------------------------------------- |
| constant, splat, arange               | register constants; splat; thread part + register constants   |
| elementwise, cast, select, addptr     | the same op on registers                                      |
| broadcast, expand_dims, reshape, permute, convert_layout | register renaming, or through shared memory (pointer tiles: rebuilt) |
| load, store, atomics (pointer tiles)  | per-register pointers, `vector = k` where proven; replicas masked |
| make_view, view_load, view_store      | per-register offsets and bounds masks; vectorized where proven |
|                                       | (sm_90+: block stores by TMA, 16-bit accumulators via stmatrix) |
| reduce, arg_reduce                    | registers, then shuffles (bfly), then shared memory across warps |
| scan                                  | through shared memory, a sequential fold per register          |
| dot                                   | mma.sync (ldmatrix), wgmma (sm_90a) or MFMA; else FMA over k  |
| for, if, while                        | the same, carrying registers                                   |
| for {stages = S} (tessera.pipeline)   | dot operands copied ahead into rings: cp.async, or TMA (sm_90+) |
| for {warp_specialize} (sm_90+)        | + a producer warpgroup issuing the TMA fills; consumers behind mbarriers |
| smem_* (tessera.shared, async_copy)   | swizzled shared_alloc; cp.async chunks (else load + st.shared); ld.shared or ldmatrix |
| assert, print / breakpoint            | kept per thread in debug builds, else dropped / dropped, with a |
|                                       | note (`lowering_notes`)                                         |
| scalar ops                            | unchanged; scalar stores and atomics by thread 0 only          |
"""

from __future__ import annotations

from tessera.ir.core import Function, Module
from tessera.ir.target import Target

from . import schedule  # noqa: F401  (registers the scheduled ops' lowerings: loops, explicit shared memory)
from .errors import LoweringError
from .layout_assignment import LayoutAssignment
from .lowering import Lowering
from .lowering.vector_facts import VectorFacts
from .schedule.consumer_prologue import consumer_prologue


def lower_to_threads(fn: Function, assignment: LayoutAssignment, target: Target, num_warps: int | None = None,
                     facts: VectorFacts | None = None, debug: bool = False, overlap_stores: bool = True,
                     slice_stores: bool = False) -> Module:
    """The thread-IR module of tile function `fn` under `assignment` (see the module docstring); without
    `overlap_stores`, every TMA store waits for its read at once, loops or not; with `slice_stores`, a C stored
    from its registers goes out a column block at a time through a small staging buffer (`schedule/tma_store.py`)."""
    if num_warps is not None and num_warps != assignment.num_warps:
        raise LoweringError(f"the layouts were assigned for {assignment.num_warps} warps, not {num_warps}",
                            kernel=fn.name)
    if assignment.warp_size != target.warp_size:
        raise LoweringError(f"the layouts were assigned for warps of {assignment.warp_size} threads, but "
                            f"{target.name} has {target.warp_size}", kernel=fn.name)
    ctx = Lowering(fn, assignment, target, facts)
    ctx.debug = debug
    ctx.overlap_stores = overlap_stores
    ctx.slice_stores = slice_stores
    ctx.deferred = consumer_prologue(ctx)
    ctx.lower_block(fn.body, ctx.fn.body, [ctx.env[a] for a in fn.args])
    if ctx.after:       # an op whose lowering was to be followed by more was lowered some other way
        raise LoweringError(f"internal: {', '.join(k for m in ctx.after.values() for k in m)} never emitted after "
                            f"{', '.join(op.name for op in ctx.after)}", kernel=fn.name)
    if ctx.notes:
        ctx.fn.attrs["lowering_notes"] = tuple(ctx.notes)
    return ctx.module
