"""Block stores of a view through shared memory and one TMA store (sm_90+), instead of per-thread stores.

Input: a `view_store` of a 2-D register tile (already in the output dtype:
the tile IR casts before it stores). Job: when the target has TMA, the
block is big enough to be worth it, and the host can build a tensor map of
the view from the kernel's specialization (`tma_fill.view_block_box`, the
rules TMA loads follow: a 16-byte aligned pointer argument, 16-byte row
strides, sizes from arguments or constants), emit

    buf = shared_alloc (rows x cols, row-major, 128-byte aligned)
    st.shared of each element by its owner (vectorized where registers are contiguous)
    fence_proxy_async                  every writer: its writes become visible to the async proxy
    barrier
    if thread 0:
        tma_store buf, map, <block offsets>      (cp.async.bulk.tensor ... global.shared::cta ... bulk_group)
        bulk_commit_group
        bulk_wait_group_read {pending = 0}       the buffer has been read
    barrier                            no thread reuses the bytes (the allocator may) before that

Guarantees: TMA clips the box at the tensor's edges, so the view's bounds
mask holds by construction (elements outside are not written); the buffer
is read before anyone may overwrite it or the block exits. Kept out: warp
specialized epilogues (thread 0 is a producer there; their stores stay
per-thread), kernels with atomics or ordered accesses (their programs may publish what they
store, and the read-wait does not order the global writes), views offset from their pointer argument by batch/head
indices (`TmaBox.leading`, see `tma_store_box`), blocks under
`TMA_STORE_MIN_BYTES`, and every target without TMA (sm_80, AMD), where
`view_store` lowers as before.
"""

from __future__ import annotations

from tessera.ir.ops import OPS
from tessera.ir.smem_layouts import SmemLayout
from tessera.ir.types import TileType

from ..lowering.memory import VIEW_STORE_STRATEGIES
from .tma_fill import map_parameter, view_block_box

TMA_STORE_MIN_BYTES = 4096      # smaller blocks: a few vector stores per thread beat the fence, barriers and wait
TMA_STORE_ALIGN = 128           # a box without swizzle must start 128-byte aligned in shared memory


def tma_store_box(ctx, op):
    """The TMA box that stores `view_store` `op`'s block whole, or None when it takes the threads' stores."""
    tile = op.operands[-1].type
    if not ctx.target.has("tma") or not isinstance(tile, TileType) or len(tile.shape) != 2:
        return None
    if ctx.threads.consumers is not None:
        return None
    # A kernel whose programs hand data to each other (atomics, release stores, acquire loads: MoE's one-launch
    # tickets) may publish the rows it stores; wait_group.read does not wait for the global writes, so those keep
    # the threads' stores.
    if any(OPS[o.name].orders_programs for o in ctx.src.walk()):
        return None
    rows, cols = tile.shape
    dtype = tile.element.dtype
    if dtype.bits % 8 or rows * cols * dtype.bits // 8 < TMA_STORE_MIN_BYTES:
        return None
    box = view_block_box(op.operands[0], tile.shape, dtype, 1, SmemLayout((rows, cols), (cols, 1), None),
                         ctx.target, ctx.facts.facts)
    # A view offset from its pointer argument (attention's O at (batch, head): a rank-4 map with unbounded
    # leading dims) keeps the threads' stores for now: the SIMT simulator reads such maps from a padded copy
    # of the array, so it could not check a store through them.
    return box if box is not None and box.boxes == 1 and not box.leading else None


def _tma_store(ctx, op) -> bool:
    box = tma_store_box(ctx, op)
    if box is None:
        return False
    value = ctx.operand(op, len(op.operands) - 1)
    layout = value.layout
    rows, cols = op.operands[-1].type.shape
    dtype = op.operands[-1].type.element.dtype
    starts = [ctx.operand(op, i) for i in range(1, len(op.operands) - 1)]
    tensor_map = map_parameter(ctx, box.recipe)
    buf = ctx.smem.alloc(dtype, rows * cols, align=TMA_STORE_ALIGN)
    owner = ctx.index.owner_predicate(layout)
    mask = None if owner is None else ctx.splat(owner, layout.local_size)
    ctx.smem.access("store", buf, layout, (cols, 1), value=value.value, mask=mask)
    ctx.create("fence_proxy_async")
    ctx.threads.barrier()
    with ctx.when(ctx.index.first_thread()):
        ctx.create("tma_store", [buf, tensor_map, *box.coordinates(ctx, starts)])
        ctx.create("bulk_commit_group")
        ctx.create("bulk_wait_group_read", attrs={"pending": 0})
    ctx.threads.barrier()
    return True


VIEW_STORE_STRATEGIES.append(_tma_store)
