"""TMA multicast across a thread-block cluster: the blocks of a cluster share one ring operand's loads.

Input: a TMA-filled pipelined loop (`TmaRing`) in a kernel with a cluster
shape (`tessera.cluster_dims`, the tile function's `cluster_dims`) whose
view loads marked `multicast` (`block.load(multicast=True)`: the author's
promise that every block of the cluster loads the same block there, which
the tile interpreter checks) are TMA-filled. Job: let each block issue only
its 1/C share of such a slot, multicast to all C blocks of the cluster, so
the operand crosses L2 -> SM once per cluster instead of once per block.
Guarantee: a slot is written in a block only after that block (and every
other) is done reading its previous content, and no block exits or ends its
mbarriers while a peer may still write into it. The emitted protocol:

    full[s]: the ring's mbarriers (count 1), empty[s]: count C, one per slot
    (after their init and fence)  cluster_arrive; cluster_wait         peers' inits are visible before any
                                                                       multicast or remote arrival reaches them
    fill of slot s (thread 0): mbarrier_arrive_expect_tx full[s], <all the slot's bytes>
                               own loads: tma_load as before
                               multicast load: its share r of the boxes (r = cluster_rank), multicast to
                               every block: tma_load {multicast = 2^C - 1}
    refill of slot s, before the fill (after the loop's barrier that follows wgmma_wait {1}):
                               thread 0: mbarrier_arrive_cluster empty[s], q   for every rank q: "my reads
                                                                      of s are done"
                               all: mbarrier_wait empty[s], phase     every block's reads of s are done
    (after the loop)           cluster_arrive; cluster_wait           then the mbarriers end as before

Each block's full[s] counts every byte of the slot, its own share and its
peers'; a peer's bytes may land before this block announces them (the
tx-count goes negative, which PTX allows), but the phase cannot complete
before this block's own arrival. A peer writes slot s of this block only
after this block arrived on the peer's empty[s], which it does only after
its own reads of s ended (wgmma_wait {1} and the barrier), and after it saw
full[s]'s previous phase complete, so the bytes count toward the next
phase. Refill k of slot s (iteration i = s + 1 + k*S, or k*S for s = S-1,
with the copies S-1 ahead) waits for parity k & 1 = (i // S) & 1: the loop's
own phase parity. The prologue's fills need no empty wait (fresh slots).

A share is whole boxes when a slot's boxes divide by C (a wgmma slot of
several column blocks: same map, rank r issues boxes r*b/C .. (r+1)*b/C - 1),
else a 1/C slice of rows of every box through a map of 1/C-high boxes, when
each slice stays a whole number of swizzle periods (`share_of`).

With a producer warpgroup (`warp_specialization.py`) the protocol is
CUTLASS's: the empty barriers count every consumer release of every block
(releasers x C), a consumer releases a slot on every block's empty barrier
(`release_remote`), the producer waits for its own empty barrier before it
issues its share, multicast; the cluster barrier follows the inits of full
and empty, and after the loop the producer and the consumers each arrive on
and wait for it before the barriers end. Inside a persistent tile loop
(`warp_specialized_tiles.py`) nothing changes: the ring is set up once
before the role split, both blocks' producers walk the same tiles and fill
the same slots in the same order, so each empty barrier's phases count the
same releases in every block.

In a persistent kernel's tile loop (`persistent.py`: one ring for all of a
program's tiles, its mbarriers, full and empty, set up once in the prologue,
with the cluster barrier after them) the blocks of a cluster run the same
tiles (the kernel walks cluster-tiles: `kernels_lib/gemm.py`), so they fill
the same slots in the same order. The empty barriers' phases count across
tiles: every fill of program-wide iteration f >= S-1 releases its slot as
the refill of an unbroken pipeline in iteration g = f - (S-1) would, with
parity (g div S) mod 2, also a tile's first S-1 fills, which come before its
loop or after the tile before's (`software_pipeline._prologue_release`).
The cluster barrier that ends a lone loop runs once, after the tile loop
(CUTLASS's persistent cluster kernels sync the cluster once at the end
too), not after each tile's loop: between tiles nothing needs it. A peer
writes a slot of this block (its multicast share) only after this block
released the slot on the peer's empty barrier, the next tile's first fills
included, and each tile's loop waits for every byte of its own fills, so
once a tile's loop has drained no peer write into its rings is pending; the
epilogue's buffers (which may share bytes with a ring that is not
`whole_kernel`) stay this block's alone until its next release, which its
own program order puts after the epilogue. (The per-tile barrier used to
run before the epilogue, so it never guarded those buffers anyway.)

Not multicast (the load is issued by every block, as without the hint, and a
lowering note says why): copies that are not S-1 ahead, cp.async-filled
loads, and slots no share divides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera.ir.tensor_map import TensorMapRecipe

from ..lowering import copy_scalar_op, lowering


@dataclass(frozen=True)
class Share:
    """How a block issues its share of one multicast load's slot."""

    by_boxes: bool          # whole boxes (else a slice of rows of every box, through `recipe`'s map)
    recipe: TensorMapRecipe  # the boxes' map (the load's own, or one of 1/C-high boxes)
    rows: int               # rows of a share's box (row slices)


def cluster_size(fn) -> int:
    """Blocks per cluster of tile function `fn` (`cluster_dims`; 1 without)."""
    return math.prod(int(d) for d in fn.attrs.get("cluster_dims") or (1,))


def share_of(box, size: int) -> Share | None:
    """How a block issues 1/`size` of a slot filled by `box` (a `tma_fill.TmaBox`), or None when neither boxes
    nor rows divide."""
    if box.boxes % size == 0:
        return Share(True, box.recipe, box.recipe.box_shape[-2])
    rows, width = box.recipe.box_shape[-2:]
    element = box.recipe.dtype.bits // 8
    if rows % size or (rows // size) * width * element % box.slot_align:      # a slice: whole swizzle periods
        return None
    r = box.recipe
    half = TensorMapRecipe(r.param, r.pointer, r.dtype, r.shape, r.strides, (*r.box_shape[:-2], rows // size, width),
                           r.swizzle)
    return Share(False, half, rows // size)


def why_not(ctx, multicast_loads, *, specialized: bool, prefetch: int, stages: int) -> str | None:
    """Why this loop's multicast loads stay per block (None: they are multicast). A producer warpgroup
    (`specialized`) runs ahead by its empty barriers, not by a prefetch distance."""
    if not specialized and prefetch != stages - 1:
        return f"its copies run {prefetch} iterations ahead of a {stages}-stage ring, not {stages - 1}"
    size = cluster_size(ctx.src)
    for load in multicast_loads:
        if share_of(load.tma, size) is None:
            return (f"a {load.tma.recipe.box_shape} box ({load.tma.boxes} per slot) splits into neither whole "
                    f"boxes nor whole swizzle periods of rows among {size} blocks")
    return None


class ClusterMulticast:
    """The cluster side of one TMA ring (see the module docstring): empty mbarriers, shares, the barriers."""

    def __init__(self, ctx, ring, multicast_loads, size: int, specialized: bool = False, once: bool = False):
        """`ring`'s `maps` hold each shared load's share map (`share_of(...).recipe`). `specialized`: the warp-
        specialized loop makes its own empty barriers (one arrival per releaser and block: `release_remote`)
        and then the cluster barrier that publishes them (`sync`). `once`: a persistent kernel's ring, whose
        empty barriers, like its full ones, are set up once in the kernel's prologue (see the module docstring)."""
        self.size = size
        self.mask = (1 << size) - 1
        self.shares = {load.load: share_of(load.tma, size) for load in multicast_loads}
        self.maps = {op: ring.maps[op] for op in self.shares}
        if specialized:
            self.rank = ctx.emit("cluster_rank")
        elif once:
            with ctx.in_prologue():
                self.rank = ctx.emit("cluster_rank")
                self.empty = ctx.smem.mbarriers(ring.stages, size, whole_kernel=True)
                self.sync(ctx)          # the full and empty barriers' inits, cluster-wide
        else:
            self.rank = ctx.emit("cluster_rank")
            self.empty = ctx.smem.mbarriers(ring.stages, size)
            self.sync(ctx)              # the full and empty barriers' inits, cluster-wide

    @staticmethod
    def sync(ctx) -> None:
        ctx.create("cluster_arrive")
        ctx.create("cluster_wait")

    def release_remote(self, ctx, bar) -> None:
        """A consumer's release of a slot in a warp-specialized loop: an arrival on the empty mbarrier `bar`'s
        offset in every block of the cluster, whose producers all write the slot (their multicast shares)."""
        for q in range(self.size):
            ctx.create("mbarrier_arrive_cluster", [bar, ctx.const(q)])

    def release_slot(self, ctx, slot, phase, live, fence: bool) -> None:
        """Before refilling `slot` (where `live`): thread 0 arrives on every block's empty[slot] (after a proxy
        fence when `fence`: ldmatrix read the slot), then every thread waits for all of their arrivals. Every
        thread, not thread 0 alone (nor warp 0): a spin loop under a thread-dependent branch makes ptxas move
        the K loop's slot and descriptor arithmetic off the uniform datapath (R2UR and IMAD for UIADD3: the
        128 x 128 cluster loop took 120 SASS instructions that way, 90 so, its unclustered twin 87). The wait
        costs little more: the loop's next barrier waits for thread 0's warp anyway."""
        bar = ctx.emit("addptr", self.empty, slot)
        with ctx.when(ctx.emit("and", ctx.index.first_thread(), live)):
            if fence:                           # this block's generic reads before the peers' async writes
                ctx.create("fence_proxy_async")
            for q in range(self.size):
                ctx.create("mbarrier_arrive_cluster", [bar, ctx.const(q)])
        with ctx.when(live):
            ctx.create("mbarrier_wait", [bar, phase])

    def issue_share(self, ctx, load, ring_slot, starts, bar) -> None:
        """This block's share of `load`'s slot at `ring_slot` (its first element), multicast to the cluster."""
        box, share = load.tma, self.shares[load.load]
        tensor_map = self.maps[load.load]
        if share.by_boxes:
            per_block = box.boxes // self.size
            first = ctx.emit("mul", self.rank, ctx.const(per_block))
            for jj in range(per_block):
                j = ctx.emit("add", first, ctx.const(jj)) if jj else first
                dst = ctx.emit("addptr", ring_slot, ctx.emit("mul", j, ctx.const(box.box_elements)))
                coords = box.coordinates(ctx, starts)
                coords[-1] = ctx.emit("add", coords[-1], ctx.emit("mul", j, ctx.const(box.recipe.box_shape[-1])))
                ctx.create("tma_load", [dst, tensor_map, *coords, bar], {"multicast": self.mask})
            return
        width = box.recipe.box_shape[-1]
        row = ctx.emit("mul", self.rank, ctx.const(share.rows))
        slice_offset = ctx.emit("mul", row, ctx.const(width))
        for j in range(box.boxes):
            dst = ctx.emit("addptr", ring_slot, ctx.emit("add", slice_offset, ctx.const(j * box.box_elements)))
            coords = box.coordinates(ctx, starts, j)
            coords[-2] = ctx.emit("add", coords[-2], row)
            ctx.create("tma_load", [dst, tensor_map, *coords, bar], {"multicast": self.mask})


# `tessera.cluster_rank()` / `cluster_id(axis)` in a kernel without clusters (or along an axis the cluster does
# not span) are 0 / program_id(axis): lowered so, they run on every target; with a cluster they stay the
# special registers (%cluster_ctarank, %clusterid), which need sm_90+.
@lowering("cluster_rank")
def _cluster_rank(ctx, op):
    if cluster_size(ctx.src) == 1:
        ctx.define(op.result, ctx.const(0))
    else:
        copy_scalar_op(ctx, op)


@lowering("cluster_id")
def _cluster_id(ctx, op):
    axis = op.attrs["axis"]
    dims = tuple(ctx.src.attrs.get("cluster_dims") or ()) + (1, 1, 1)
    if dims[axis] == 1:
        ctx.define(op.result, ctx.emit("program_id", attrs={"axis": axis}))
    else:
        copy_scalar_op(ctx, op)
