"""Block stores of a view through shared memory and one TMA store (sm_90+), instead of per-thread stores.

Input: a `view_store` of a 2-D register tile (already in the output dtype:
the tile IR casts before it stores). Job: when the target has TMA, the
block is big enough to be worth it, and the host can build a tensor map of
the view from the kernel's specialization (`tma_fill.view_block_box`, the
rules TMA loads follow: a 16-byte aligned pointer argument, 16-byte row
strides, sizes from arguments or constants), emit

    buf = shared_alloc (rows x cols, row-major, 128-byte aligned)
    st.shared of each element by its owner (vectorized where registers are contiguous)
      -- or, for a 16-bit tile in a tensor-core accumulator layout on sm_90+ (`stmatrix_store.py`):
    buf = shared_alloc (column blocks of 64 elements, 128B swizzle, 1024-byte aligned)
    stmatrix x4 of each eight registers            (no layout conversion before: `STORE_KEEPS_LAYOUT`)
      -- or, for a 32-bit tile in such a layout (an f32 C; `pair_store.py`):
    buf = shared_alloc (column blocks of 32 elements, 128B swizzle, 1024-byte aligned)
    st.shared.v2 of each register pair             (no layout conversion before either)
    fence_proxy_async                  every writer: its writes become visible to the async proxy
    barrier
    if thread 0:
        tma_store buf, map, <block offsets>      (cp.async.bulk.tensor ... global.shared::cta ... bulk_group;
                                                  one per 64-column block with stmatrix, 32 with pairs:
                                                  a 128B box row)
        bulk_commit_group
        bulk_wait_group_read {pending = 0}       the buffer has been read
    barrier                            no thread reuses the bytes (the allocator may) before that

A store in the body of a `for` loop (a persistent kernel's loop over
tiles; `overlap_loop`) instead lets TMA read the buffer while the next
iteration runs (its K loop):

    buf = shared_alloc {async_reads}   in the kernel's prologue: bytes of its own for the whole loop
    for ... {
        ...                            (the next tile's K loop runs while TMA reads the last tile's buf)
        if thread 0: bulk_wait_group_read {pending = 0}     the previous iteration's store has read buf
        barrier
        <writes of buf>, fence_proxy_async, barrier
        if thread 0: tma_store ...; bulk_commit_group       no wait, no barrier
    }
    if thread 0: bulk_wait_group_read {pending = 0}         before the block exits or buf's bytes are reused
    barrier

Nothing else touches buf (it is this store's alone), so its only hazard
is the next write of it, which the wait before the writes orders. When
the buffer's own bytes do not fit beside what the loop needs (the
persistent warp-specialized 128 x 256 GEMM: 144 KiB of rings for the
whole kernel, 128 KiB of f32 C), `thread_passes.lower` lowers the kernel
again with C sliced (`Lowering.slice_stores`; CUTLASS's epilogue
sub-tiling; a C stored from its registers, by pairs or stmatrix): buf is
`STAGING_SLOTS` slots of one column block (rows x 32 f32, or rows x 64 bf16),
and block j goes through slot j % slots

    if thread 0: bulk_wait_group_read {pending = slots - 1}   the store that last read the slot has
    barrier
    st.shared.v2 (stmatrix) of block j's registers into the slot, fence_proxy_async, barrier
    if thread 0: tma_store slot ...; bulk_commit_group        a bulk group per block

(the first blocks of a store outside a loop skip the wait: no store read
their slot yet); the loop's final wait is as above. If that does not fit
either, it is lowered with the immediate wait (`Lowering.overlap_stores`
off).

The read-wait does not wait for the global writes (PTX: only the wait
without .read completes a bulk group, its writes then visible to the
waiting thread, the completion implying a generic-async proxy fence). So
where the writes must be seen in this launch, thread 0 waits in full
(`bulk_wait_group {pending = 0}`, cp.async.bulk.wait_group 0), then the
barrier:

* a store whose memory an op of the kernel may read (`kernel_may_read`:
  the same pointer argument, or one the launch did not find disjoint)
  waits in full right after its commit, never overlapped with a loop:
  this block's later reads, and another program's after a release, see it;
* before every release (atomic, release store; `complete_before_release`,
  hooked into `lowering/memory.py`) in a kernel that may store by TMA:
  the release then publishes the stores' writes like the threads' stores,
  so a program that acquires it may overwrite them (stream K's tiles, MoE's
  one-launch tickets).

A store nothing reads keeps the read-wait (stream K's C, the persistent
GEMM's overlapped C): no thread of the launch observes it before the
kernel ends.

Guarantees: TMA clips the box at the tensor's edges, so the view's bounds
mask holds by construction (elements outside are not written); the buffer
is read before anyone may overwrite it or the block exits. After a warp-specialized
loop only the consumers run (threads 0 .. consumers-1: thread 0 issues, the
barriers are the consumers' named one). Views offset from their pointer
argument by batch/head indices (attention's O at (b, h)) store through a
map with a dim per index (`TmaBox.leading`). Kept out: blocks under
`TMA_STORE_MIN_BYTES`, and every target without TMA (sm_80, AMD), where
`view_store` lowers as before.
"""

from __future__ import annotations

from tessera.ir.core import Function, Operation, enclosing_function
from tessera.ir.ops import OPS
from tessera.ir.smem_layouts import SmemLayout
from tessera.ir.types import TileType
from tessera.ir.wgmma_layouts import WgmmaTileLayout

from ..layout_assignment import STORE_KEEPS_LAYOUT
from ..lowering.memory import BEFORE_RELEASE, VIEW_STORE_STRATEGIES
from .auto_pipeline import is_address, may_alias, pointer_roots
from .pair_store import PairPlan, pair_plan, store_pairs
from .stmatrix_store import SWIZZLE, StmatrixPlan, stmatrix_plan, store_fragments
from .tma_fill import map_parameter, view_block_box

TMA_STORE_MIN_BYTES = 4096      # smaller blocks: a few vector stores per thread beat the fence, barriers and wait
TMA_STORE_ALIGN = 128           # a box without swizzle must start 128-byte aligned in shared memory
STAGING_SLOTS = 2               # a sliced C's column-block slots: one written while TMA reads the other


def tma_store_box(ctx, op, slot=None):
    """The TMA box that stores `view_store` `op`'s block whole from a shared tile laid out as `slot` (default:
    row-major), or None when it takes the threads' stores."""
    return _store_box(op, ctx.target, ctx.facts.facts, slot)


def _store_box(op, target, facts: dict, slot=None):
    tile = op.operands[-1].type
    if not target.has("tma") or not isinstance(tile, TileType) or len(tile.shape) != 2:
        return None
    if enclosing_function(op) is None:
        return None
    rows, cols = tile.shape
    dtype = tile.element.dtype
    if dtype.bits % 8 or rows * cols * dtype.bits // 8 < TMA_STORE_MIN_BYTES:
        return None
    slot = slot or SmemLayout((rows, cols), (cols, 1), None)
    box = view_block_box(op.operands[0], tile.shape, dtype, 1, slot, target, facts)
    # (A view offset from its pointer argument, attention's O at (batch, head), gets a rank-4 map with unbounded
    # leading dims: the SIMT simulator writes such stores through to the argument, `TensorMapDescription.writeback`.)
    if box is None or box.boxes != (1 if isinstance(slot, SmemLayout) else cols // slot.atom):
        return None
    return box


def register_store(op, layout, target, facts: dict, warp: int = 32):
    """(box, plan) of a TMA store of `view_store` `op` whose value is in register layout `layout`, written to a
    128B-swizzled shared tile straight from its registers: by stmatrix for 16 bits (`stmatrix_store.py`), by
    st.shared.v2 of register pairs for 32 bits (`pair_store.py`); or None."""
    tile = op.operands[-1].type
    if layout is None or not isinstance(tile, TileType):
        return None
    bits = tile.element.dtype.bits
    if bits == 16 and target.has("stmatrix"):
        plan = stmatrix_plan(layout, warp)
    elif bits == 32 and target.has("tma"):
        plan = pair_plan(layout, target.max_vector_bits, warp, target.shared_memory_banks)
    else:
        return None
    if plan is None:
        return None
    box = _store_box(op, target, facts, plan.tile)
    return None if box is None else (box, plan)


def _keeps_accumulator_layout(op, layout, target, facts, num_warps: int) -> bool:
    """`STORE_KEEPS_LAYOUT`: with a layout, whether stmatrix (16-bit) or pair stores (32-bit) write it straight
    into the TMA store's tile; without, whether some layout could be (a 16-bit or 32-bit 2-D block whose
    128B-swizzled column blocks TMA can store). A 32-bit value that then gets a layout the threads store wider
    than pairs (a blocked one) is not kept, and the assignment anchors the store as before."""
    if layout is not None:
        return register_store(op, layout, target, facts.facts, target.warp_size) is not None
    tile = op.operands[-1].type
    if not isinstance(tile, TileType) or len(tile.shape) != 2:
        return False
    size = tile.element.dtype.bits // 8
    if not (size == 2 and target.has("stmatrix") or size == 4 and target.has("tma")) \
            or tile.shape[0] % 8 or tile.shape[1] % (SWIZZLE // size):
        return False
    return _store_box(op, target, facts.facts, WgmmaTileLayout(*tile.shape, size, SWIZZLE)) is not None


def _tma_store(ctx, op) -> bool:
    index = len(op.operands) - 1
    layout = ctx.assignment.conversions.get((op, index)) or ctx.lookup(op.operands[index]).layout   # as read
    fragments = register_store(op, layout, ctx.target, ctx.facts.facts, ctx.warp_size)
    box = fragments[0] if fragments else tma_store_box(ctx, op)
    if box is None:
        return False
    value = ctx.operand(op, index)          # (converts, if the assignment says so: only once a strategy is chosen)
    rows, cols = op.operands[-1].type.shape
    dtype = op.operands[-1].type.element.dtype
    starts = [ctx.operand(op, i) for i in range(1, len(op.operands) - 1)]
    tensor_map = map_parameter(ctx, box.recipe)
    plan: StmatrixPlan | PairPlan | None = fragments[1] if fragments else None
    align = plan.tile.alignment if plan else TMA_STORE_ALIGN
    read_back = kernel_may_read(ctx.src, op)     # its writes must be complete before the block goes on
    loop = None if read_back else overlap_loop(ctx, op)
    slots = staging_slots(ctx, plan, box.boxes)
    elements = rows * cols if slots is None else slots * box.box_elements
    if loop is None:
        buf = ctx.smem.alloc(dtype, elements, align=align)
    else:                                   # its own bytes across the loop: TMA may read them into the next iteration
        with ctx.in_prologue():
            buf = ctx.smem.alloc(dtype, elements, align=align)
        buf.owner.attrs["async_reads"] = True
        ctx.overlapped_stores.add(loop)
        if slots is None:
            wait_for_store_reads(ctx)       # the previous iteration's store has read buf
    if slots is not None:
        _store_slices(ctx, buf, plan, value.value, box, tensor_map, starts, slots, waits_first=loop is not None)
    else:
        if isinstance(plan, StmatrixPlan):
            store_fragments(ctx, buf, plan, value.value)
        elif plan:
            store_pairs(ctx, buf, plan, value.value)
        else:
            owner = ctx.index.owner_predicate(value.layout)
            mask = None if owner is None else ctx.splat(owner, value.layout.local_size)
            ctx.smem.access("store", buf, value.layout, (cols, 1), value=value.value, mask=mask)
        ctx.create("fence_proxy_async")
        ctx.threads.barrier()
    with ctx.when(ctx.index.first_thread()):
        if slots is None:
            for j in range(box.boxes):      # column block j: its own box, j box widths along the rows
                src = buf if j == 0 else ctx.emit("addptr", buf, ctx.const(j * box.box_elements))
                ctx.create("tma_store", [src, tensor_map, *box.coordinates(ctx, starts, j)])
            ctx.create("bulk_commit_group")
        if read_back:
            ctx.create("bulk_wait_group", attrs={"pending": 0})
        elif loop is None:
            ctx.create("bulk_wait_group_read", attrs={"pending": 0})
    if loop is None:
        ctx.threads.barrier()
    return True


def staging_slots(ctx, plan, boxes: int) -> int | None:
    """How many column-block slots the staging buffer of a C stored from its registers (pairs or stmatrix) has
    when the lowering slices stores (`ctx.slice_stores`, `thread_passes.lower` once the whole tile does not
    fit): `STAGING_SLOTS`; None for the whole tile. The blocks divide evenly among the slots (tile dims are
    powers of two), so a block takes the same slot every tile loop iteration, which the read-wait's count needs."""
    if not ctx.slice_stores or plan is None or plan.blocks is None or boxes < STAGING_SLOTS:
        return None
    assert boxes % STAGING_SLOTS == 0, f"{boxes} column blocks do not divide among {STAGING_SLOTS} slots"
    return STAGING_SLOTS


def _store_slices(ctx, buf, plan: PairPlan | StmatrixPlan, value, box, tensor_map, starts, slots: int,
                  waits_first: bool) -> None:
    """C a column block at a time through `slots` block-sized slots of `buf` (CUTLASS's epilogue sub-tiling):
    block j goes to slot j % slots once the store that last read that slot has (thread 0's
    `bulk_wait_group_read {pending = slots - 1}`, then a barrier), then pair stores or stmatrix, fence, barrier,
    and thread 0's TMA store and commit, a bulk group per block. Blocks before the first reuse of a slot wait only where
    an earlier store (the tile loop's previous iteration, `waits_first`) may still read the slot."""
    for j in range(box.boxes):
        slot = buf if j % slots == 0 else ctx.emit("addptr", buf, ctx.const(j % slots * box.box_elements))
        if j >= slots or waits_first:
            with ctx.when(ctx.index.first_thread()):
                ctx.create("bulk_wait_group_read", attrs={"pending": slots - 1})
            ctx.threads.barrier()
        write = store_fragments if isinstance(plan, StmatrixPlan) else store_pairs
        write(ctx, slot, plan, value, block=j)
        ctx.create("fence_proxy_async")
        ctx.threads.barrier()
        with ctx.when(ctx.index.first_thread()):
            ctx.create("tma_store", [slot, tensor_map, *box.coordinates(ctx, starts, j)])
            ctx.create("bulk_commit_group")


def kernel_may_read(fn: Function, store: Operation) -> bool:
    """Whether an op of kernel `fn` may read memory `view_store` `store` writes: an op that reads memory through
    an address (pointer, pointer tile or view) whose parameters may alias the store's (`auto_pipeline.may_alias`:
    the same pointer argument, one the launch did not find disjoint, or one of unknown origin)."""
    noalias = set(fn.attrs.get("noalias", ()))
    written = pointer_roots(store.operands[0], fn)
    return any(may_alias(pointer_roots(v, fn), written, noalias)
               for op in fn.walk() if OPS[op.name].reads_memory
               for v in op.operands if is_address(v))


def complete_before_release(ctx) -> bool:
    """`BEFORE_RELEASE`: in a kernel that may store by TMA, thread 0 waits for every TMA store it issued to
    complete (`bulk_wait_group {pending = 0}`, not .read) before the block's release, which then publishes their
    global writes (module docstring); True (a barrier must follow). Elsewhere nothing: False."""
    if ctx.may_store_by_tma is None:
        facts = ctx.facts.facts
        ctx.may_store_by_tma = ctx.target.has("tma") and any(
            op.name == "view_store" and (_store_box(op, ctx.target, facts) is not None or
                                         _keeps_accumulator_layout(op, None, ctx.target, ctx.facts, 0))
            for op in ctx.src.walk())
    if not ctx.may_store_by_tma:
        return False
    with ctx.when(ctx.index.first_thread()):
        ctx.create("bulk_wait_group", attrs={"pending": 0})
    return True


def overlap_loop(ctx, op: Operation) -> Operation | None:
    """The tile-IR `for` whose next iteration may run while TMA still reads `view_store` `op`'s staging buffer:
    the loop whose body holds the store (directly or under `if`s), a plain loop (no `stages`, not
    warp-specialized: the tile loop of a persistent kernel) with no `return` in it; None where the store waits
    for its read at once (no such loop, or `ctx.overlap_stores` off)."""
    if not ctx.overlap_stores:
        return None
    holder = op.parent.parent
    while isinstance(holder, Operation) and holder.name == "if":
        holder = holder.parent.parent
    if not isinstance(holder, Operation) or holder.name != "for" or "stages" in holder.attrs \
            or holder.attrs.get("warp_specialize") or any(o.name == "return" for o in holder.walk()):
        return None
    return holder


def wait_for_store_reads(ctx) -> None:
    """Thread 0 waits until every TMA store it issued has read its shared memory, then every running thread
    waits for it (the block's barrier, or the consumers' after a warp-specialized loop)."""
    with ctx.when(ctx.index.first_thread()):
        ctx.create("bulk_wait_group_read", attrs={"pending": 0})
    ctx.threads.barrier()


def finish_overlapped_stores(ctx, loop: Operation) -> None:
    """After lowering tile-IR `for` `loop`: if stores in it left TMA reading their buffers (`overlap_loop`),
    the final wait, so that the block exits, or the bytes are reused, only once they are read."""
    if loop in ctx.overlapped_stores:
        ctx.overlapped_stores.discard(loop)
        wait_for_store_reads(ctx)


STORE_KEEPS_LAYOUT.append(_keeps_accumulator_layout)
VIEW_STORE_STRATEGIES.append(_tma_store)
BEFORE_RELEASE.append(complete_before_release)
