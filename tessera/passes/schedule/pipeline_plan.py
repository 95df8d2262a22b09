"""Which loads of a `for {stages = S}` loop are software-pipelined, and in which slot layout (analysis only).

Input: a tile-IR `for` with `stages = S`, the target, the warp count and
the alignment facts. Job: find the view loads that feed a tensor-core dot
and can be copied ahead (cp.async, or TMA where `tma_fill.tma_plan`
allows), choose the layout of their ring slots (the one place that says
where each element of a block lives in its slot: the fill and the reads
follow it), and lower S until the rings fit in shared memory. Guarantee: a
returned `PipelinePlan` is one `software_pipeline.py` can emit and the dot
can read; None means the loop stays plain. The conditions are the
comment above `pipeline_plan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera.ir.core import Block, Operation, Value
from tessera.ir.layouts import RegisterLayout, local, spatial
from tessera.ir.ops import OPS
from tessera.ir.smem_layouts import SmemLayout
from tessera.ir.target import Target, lds_dma_bytes
from tessera.ir.types import TileType, scalar_dtype
from tessera.ir.wgmma_layouts import WGMMA_M, WgmmaTileLayout, wgmma_tile_swizzle

from .. import alignment
from ..mma import MmaPlan, fma_reason, mma_plan
from ..lowering.mma_operands import LDMATRIX_DTYPES, LdmatrixPlan, is_wide_row_swizzle, ldmatrix_plan
from .shared_buffers import lanes_consecutive
from .tma_fill import NO_BOX, TmaBox, tma_plan
from .shortfalls import place, refuse

# ldmatrix reads 16-bit elements plain or transposed, 8-bit and tf32 (f32) ones plain only (`_slot_layout`).
PIPELINED_DTYPES = LDMATRIX_DTYPES
MIN_COPY_BYTES = 4
MAX_COPY_BYTES = 16
SHARED_ALIGNMENT = 16
NO_BLOCK_LOAD = "no block load of the body feeds a tensor-core dot"


@dataclass(frozen=True)
class PipelinedLoad:
    """One view_load turned into a ring of shared-memory slots filled by cp.async or (`tma`) by TMA."""

    load: Operation                     # the tile-IR view_load
    slice: tuple[Operation, ...]        # body ops computing its view and offsets, in body order
    dot: Operation                      # the dot it feeds
    operand: int                        # 0 (A) or 1 (B)
    want: RegisterLayout | None         # the fragment layout the dot takes it in (None: wgmma reads shared)
    contiguous_dim: int                 # the tile dim with unit stride: slot rows run along it
    width: int                          # elements per async_copy
    copies: RegisterLayout              # tile-orientation layout of the copy chunks (contiguous dim / width)
    slot_layout: SmemLayout | WgmmaTileLayout   # where each element lives in a slot (slot orientation)
    fragment: LdmatrixPlan | None       # ldmatrix reads of a slot (mma.sync); None: wgmma descriptors
    tma: TmaBox | None = None           # the slots are filled by TMA (else by cp.async with `copies`)
    no_tma: str | None = None           # on a target with TMA: why TMA does not fill them

    @property
    def on_wgmma(self) -> bool:
        return isinstance(self.slot_layout, WgmmaTileLayout)

    @property
    def slot_alignment(self) -> int:
        """The ring's alignment in bytes: the swizzle period of a wgmma slot or of a TMA-filled slot's boxes
        (128 for unswizzled boxes), else 16."""
        wgmma = self.slot_layout.alignment if self.on_wgmma else SHARED_ALIGNMENT
        return max(wgmma, self.tma.slot_align if self.tma is not None else SHARED_ALIGNMENT)

    @property
    def dtype(self):
        return self.load.result.type.element.dtype

    @property
    def slot_elements(self) -> int:
        return math.prod(self.load.result.type.shape)

    @property
    def slot_bytes(self) -> int:
        return self.slot_elements * self.dtype.bits // 8

    @property
    def copy_bytes(self) -> int:
        return self.width * self.dtype.bits // 8


@dataclass(frozen=True)
class PipelinePlan:
    loop: Operation
    stages: int                         # after the shared-memory budget (>= 2)
    requested_stages: int
    step: int
    loads: tuple[PipelinedLoad, ...]
    in_flight: int = 0                  # wgmma groups left in flight at the end of an iteration (0 or 1)

    @property
    def prefetch(self) -> int:
        """How many iterations ahead the copies run: S - 1 (with a wgmma group in flight too, since the refill
        then waits for the previous group: `software_pipeline.lower_pipelined_for`)."""
        return self.stages - 1

    @property
    def on_wgmma(self) -> bool:
        return any(load.on_wgmma for load in self.loads)

    @property
    def shared_bytes(self) -> int:
        return self.stages * sum(_align(load.slot_bytes, load.slot_alignment) for load in self.loads)

    @property
    def tma_loads(self) -> tuple[PipelinedLoad, ...]:
        return tuple(load for load in self.loads if load.tma is not None)

    @property
    def copy_loads(self) -> tuple[PipelinedLoad, ...]:
        """The loads filled by cp.async."""
        return tuple(load for load in self.loads if load.tma is None)


# `pipeline_plan(loop, target, num_warps, facts)` answers for one loop; the
# emission is `software_pipeline.py`. A `view_load` in the loop body is
# pipelined when all of these hold (otherwise it stays an ordinary load):
#
# * the target has cp.async and ldmatrix, S >= 2 and the loop step is a
#   positive compile-time constant (so iteration i + S - 1 is known);
# * its only consumer is operand A or B of one tensor-core `dot` of the body
#   (`mma.mma_plan` says yes: mma.sync, or wgmma on sm_90a; not inside a
#   region nested in the body), directly or through `convert_layout`s, and its
#   dtype is one the instruction reads from its slot: f16/bf16 along either
#   dim; i8/u8, e4m3/e5m2 and f32 (a tf32 dot) only when the contiguous dim
#   is K (A row-major, B column-major). ldmatrix moves 16-bit words, so its
#   `.trans` cannot transpose 8- or 32-bit elements, and wgmma transposes
#   16-bit operands only: an 8-bit / tf32 operand contiguous along M or N keeps
#   the ordinary load (global -> registers in every iteration);
# * its fill is 0 (cp.async zero-fills masked chunks; another fill keeps the
#   ordinary path);
# * its view and offsets are computed in the body from the induction variable
#   and loop-invariant values by pure scalar ops (the `slice`, re-evaluated
#   for iterations ahead), and they do depend on the induction variable;
#   scalar loads count as pure when nothing in the body writes memory (a
#   paged KV cache's block table: the page of a block ahead is read ahead;
#   for an iteration past the end the read is masked off, `_issue`);
# * one dim of the view has the constant stride 1 and the alignment analysis
#   proves copies of at least 4 bytes along it (`alignment.access_width`):
#   16 bytes where contiguity, alignment and bounds allow, else 8 or 4;
# * its slot can be read by the dot (`slot_layout`), and the block's chunks
#   divide evenly among the threads.
#
# The slot layout (`PipelinedLoad.slot_layout`, chosen by `_slot_layout`) is the
# one place that says where each element of a block lives in its slot; the
# fill (`software_pipeline._copy_block`) and the reads follow it. Slots are
# described in *slot orientation*: rows x the contiguous dim.
#
# * mma.sync: a row-major buffer whose rows run along the contiguous dim,
#   16-byte chunks XOR-swizzled so that the ldmatrix row reads are conflict
#   free (`mma_operands.ldmatrix_plan`; for a dim-0 contiguous operand the
#   buffer holds the transposed tile and the ldmatrix `.trans` flips). The
#   layout is an `SmemLayout`; `fragment` holds the ldmatrix plan. A 16-byte
#   row is 8 16-bit, 16 8-bit or 4 tf32 elements; for K-contiguous 8-bit and
#   tf32 blocks the plain ldmatrix x4 gives the m16n8k32 / m16n8k8 fragments
#   (`mma_layouts` docstring).
# * wgmma: a `WgmmaTileLayout`, K-major when the contiguous dim is K (A: dim 1,
#   B: dim 0), MN-major otherwise (a row-major B, a column-major A: read with
#   imm-trans = 1), with the widest swizzle whose atom row divides the block
#   and where descriptors start (`wgmma_tile_swizzle`). wgmma reads the slot
#   through descriptors; `fragment` is None.
#
# Keeping a wgmma group in flight (`PipelinePlan.in_flight`): when the loop's
# one pipelined dot is a wgmma with both operands pipelined, whose
# accumulator is carried straight from the body's block argument to its
# `yield`, the dot leaves its group in flight (`wgmma_wait {pending = 1}`)
# and the iteration refills its ring slot only after that wait, so the copies
# still run S - 1 iterations ahead (`prefetch`): see
# `software_pipeline.lower_pipelined_for` for why no slot is refilled while a
# wgmma may read it. A warpgroup with several fragments (a 256 x 128 tile on
# two warpgroups) keeps them as one stack that its wgmmas update in place
# (`wgmma` `offset`), so nothing unpacks them in flight. (Anything else
# reading the accumulator in the body would read it in flight; those dots
# wait for their group, pending = 0, and refill at the top of the iteration.)
#
# On a target with TMA, a load whose tensor map the host can build from the
# kernel's specialization fills its slots with TMA instead of cp.async
# (`tma_fill.tma_plan` has the conditions; `PipelinedLoad.tma`): an mma.sync
# slot as one box, a wgmma slot as one box per column block, so on sm_90a
# the ring runs TMA -> wgmma. The slot layout is chosen first and the fill
# follows it, never the other way round.
#
# Shared memory: the ring of a load is S slots of its tile (wgmma slots start
# on their swizzle pattern: 1024 bytes for 128B). S is lowered
# until S x (sum of the slots) fits the target's shared memory per block
# (other buffers live during the loop are not counted: they are placed
# later; should they not fit beside the rings, the allocator's error names
# this loop and the most stages that fit, `passes/shared_memory.py`, via the
# rings' `ring_stages`); below 2 stages nothing is pipelined.
def pipeline_plan(loop: Operation, target: Target, num_warps: int, facts: dict,
                  why: list[str] | None = None, stages: int | None = None) -> PipelinePlan | None:
    """How `loop` is pipelined on `target` (the conditions are in the comment above); None: a plain loop.
    `why`, when given, collects why a block load of the body is not pipelined, or the loop is not at all;
    `stages` stands for the loop's own `stages` (the depth `auto_pipeline.py` picks for a plain loop)."""
    why = [] if why is None else why
    requested = loop.attrs.get("stages", 1) if stages is None else stages
    if requested < 2:
        return None
    if not (target.has("cp.async") and target.has("ldmatrix") or target.has("lds.dma") and target.has("mfma")):
        return refuse(why, f"{target.name} has no asynchronous copies into shared memory that Tessera uses yet "
                            f"(cp.async and ldmatrix: sm_80 and newer; direct-to-LDS loads and MFMA: gfx942, "
                            f"gfx950)")
    step = getattr(facts.get(loop.operands[2]), "constant", None)
    if step is None or step <= 0:
        return refuse(why, "the loop's step is not a positive compile-time constant")
    body = loop.regions[0]
    users = _users(body)
    loads = []
    for op in body.ops:
        if op.name == "view_load":
            refusals: list[str] = []
            planned = _plan_load(op, body, users, target, num_warps, facts, refusals)
            if planned is not None:
                loads.append(planned)
            elif refusals:
                why.append(f"the block load at {place(op)} {refusals[0]}")
    if not loads:
        return refuse(why, NO_BLOCK_LOAD) if not why else None
    per_stage = sum(_align(load.slot_bytes, load.slot_alignment) for load in loads)
    stages = min(requested, target.shared_memory_bytes // per_stage)
    if stages < 2:
        return refuse(why, f"two stages of its rings need {2 * per_stage} bytes of shared memory, more than "
                            f"{target.name}'s {target.shared_memory_bytes}; use smaller blocks")
    in_flight = int(_keeps_group_in_flight(loads, body))
    return PipelinePlan(loop, stages, requested, step, tuple(loads), in_flight)


def _keeps_group_in_flight(loads: list[PipelinedLoad], body: Block) -> bool:
    """Whether the loop's one dot, a wgmma reading both operands from the rings, may leave its group in
    flight: its accumulator (one fragment per warpgroup, or a stack of them) is taken from a block argument
    and handed straight to the yield that carries it (nothing else reads it before the wait after the
    loop)."""
    dots = {load.dot for load in loads}
    if len(dots) != 1 or not all(load.on_wgmma for load in loads) or len(loads) != 2:
        return False
    (dot,) = dots
    if dot.operands[2] not in body.args[1:]:
        return False
    carried = body.args.index(dot.operands[2]) - 1
    terminator = body.ops[-1]
    users = _users(body).get(dot.result, [])
    return users == [(terminator, carried)] and terminator.name == "yield"


def _plan_load(load: Operation, body: Block, users, target: Target, num_warps: int,
               facts: dict, why: list[str]) -> PipelinedLoad | None:
    """The plan of one block load of the body, or None with the reason in `why` when it feeds a dot but
    cannot be pipelined (loads that feed no dot are left alone without a word)."""
    tile = load.result.type
    dtype = tile.element.dtype
    consumer = _dot_consumer(load.result, users, body)
    if consumer is None:
        return None
    dot, operand = consumer
    if len(tile.shape) != 2 or dtype not in PIPELINED_DTYPES:
        return refuse(why, f"is {tile}; pipelined blocks are 2-D tiles of "
                            f"{', '.join(sorted(d.name for d in PIPELINED_DTYPES))}")
    if load.attrs.get("fill", 0) != 0:
        return refuse(why, f"fills out-of-bounds lanes with {load.attrs['fill']}; cp.async zero-fills them "
                            f"(drop the fill, or pick it with tessera.where after the dot)")
    mma = mma_plan(dot, target, num_warps)
    if mma is None:
        inputs = (scalar_dtype(v.type) for v in dot.operands[:2])
        return refuse(why, f"feeds a dot that does not run on {target.name}'s tensor cores"
                           f"{fma_reason(target, *inputs)}")
    slice_ops = _address_slice(load, body)
    if slice_ops is None:
        return refuse(why, "has a view or offsets the loop cannot compute for iterations ahead (they must "
                            "come from the loop variable and loop-invariant values)")
    view_facts = facts.get(load.operands[0])
    if view_facts is None or not any(view_facts.unit_stride):
        return refuse(why, "reads a view with no dimension of stride 1")
    dim = 1 if view_facts.unit_stride[1] else 0
    width = alignment.access_width(facts, load, MAX_COPY_BYTES * 8, dim=dim)
    slot_shape = tile.shape if dim == 1 else tile.shape[::-1]
    if target.has("lds.dma"):
        return _plan_lds_load(load, slice_ops, dot, operand, mma, dim, width, slot_shape, target, num_warps, why)
    slot = _slot_layout(mma, operand, dim, slot_shape, dtype.bits // 8, target.warp_size)
    if slot is None:
        return refuse(why, f"is contiguous along a dim the dot cannot read {dtype.name} from shared memory in "
                            f"(8-bit and tf32 operands must be contiguous along K)")
    want, slot_layout, fragment = slot
    num_threads = num_warps * target.warp_size
    if width * dtype.bits < MIN_COPY_BYTES * 8:
        return refuse(why, f"cannot be copied in chunks of {MIN_COPY_BYTES} bytes or more: the alignment "
                            f"analysis proves runs of only {width} aligned element(s) along its contiguous dim "
                            f"(the view's base, sizes, strides and block offsets must be multiples of 16 bytes; "
                            f"state what it cannot see with tessera.multiple_of or tessera.assume)")
    while width * dtype.bits >= MIN_COPY_BYTES * 8:
        copies = _copy_layout(slot_shape, width, num_threads)
        if copies is not None:
            if dim == 0:
                copies = copies.permute((1, 0))
            no_tma: list[str] = []
            tma = tma_plan(load, dim, slot_layout, target, facts, no_tma)
            if tma is None and fragment is not None and is_wide_row_swizzle(slot_layout.swizzle) and \
                    no_tma and no_tma[0].endswith(NO_BOX):
                # TMA writes no row-keyed swizzle: where it could fill the slot under one it writes, keep TMA
                # (as before the ring took that swizzle) over conflict-free reads
                plain = ldmatrix_plan(fragment.want, fragment.trans, target.warp_size, dtype.bits // 8)
                retried = tma_plan(load, dim, plain.smem, target, facts, []) if plain is not None else None
                if retried is not None:
                    fragment, slot_layout, tma, no_tma = plain, plain.smem, retried, []
            return PipelinedLoad(load, slice_ops, dot, operand, want, dim, width, copies, slot_layout, fragment, tma,
                                 no_tma[0] if no_tma and target.has("tma") else None)
        width //= 2
    return refuse(why, f"is too small to deal its copies evenly to {num_threads} threads")



# On gfx942 / gfx950 the slots are filled by direct-to-LDS loads (`global_load_lds`): each wave's lanes write
# consecutive chunks of 4 bytes (16 on gfx950) from one base in M0, so a slot is the block row-major along its
# contiguous dim with no swizzle (a swizzle would break that rule), its chunks dealt round-robin as on NVIDIA
# (`_copy_layout`), and the dot reads its MFMA fragments from it with plain LDS loads (`fragment` None,
# `dot._fragment`).
def _plan_lds_load(load: Operation, slice_ops, dot: Operation, operand: int, mma: MmaPlan, dim: int, width: int,
                   slot_shape: tuple[int, int], target: Target, num_warps: int,
                   why: list[str]) -> PipelinedLoad | None:
    """The plan of a block load whose ring direct-to-LDS loads fill (see above), or None with the reason."""
    if mma.a is None or mma.instruction.op != "mfma":
        return refuse(why, f"feeds a dot that does not run on {target.name}'s matrix cores (MFMA)")
    dtype = load.result.type.element.dtype
    num_threads = num_warps * target.warp_size
    for nbytes in lds_dma_bytes(target):
        elements = nbytes * 8 // dtype.bits
        if nbytes * 8 % dtype.bits or elements > width:
            continue
        copies = _copy_layout(slot_shape, elements, num_threads)
        chunk_grid = (slot_shape[0], slot_shape[1] // elements)      # `copies` numbers chunks, not elements
        if copies is None or not lanes_consecutive(copies, chunk_grid, 1, target.warp_size):
            continue
        if dim == 0:
            copies = copies.permute((1, 0))
        want = mma.a if operand == 0 else mma.b
        return PipelinedLoad(load, slice_ops, dot, operand, want, dim, elements, copies, SmemLayout(
            slot_shape, (slot_shape[1], 1)), None)
    return refuse(why, f"cannot be copied by {target.name}'s direct-to-LDS loads "
                       f"({', '.join(map(str, lds_dma_bytes(target)))} bytes a lane, consecutive per wave): the "
                       f"alignment analysis proves runs of {width} aligned element(s) along its contiguous dim, "
                       f"or the block's chunks do not fill whole waves")


# A cp.async ring's ldmatrix slots with rows up to this wide take the row-keyed swizzle (conflict-free reads of a
# 64 x 128 bf16 K or V block: 8-way conflicted before, which held paged decode to 18% of HBM bandwidth on an H100,
# bench/results/2026-11-26-h100-run9). Wider rows (head dim 256) stay off it: their reads need twice the
# distinct swizzled offsets, which LLVM hoists out of the loop, and the decode plan of head dim 256 then spills.
ROW_KEYED_MAX_BYTES = 256


def _slot_layout(mma: MmaPlan, operand: int, dim: int, slot_shape: tuple[int, int], element_bytes: int,
                 warp_size: int):
    """(fragment layout, slot layout, ldmatrix plan) of operand `operand` of a dot planned as `mma` whose
    block is contiguous along tile dim `dim`, its slot `slot_shape` (rows, contiguous dim); None: no slot
    the dot can read. See `pipeline_plan`."""
    if mma.a is None:                               # wgmma: descriptors read the slot
        k_major = dim == 1 - operand                # A (M x K) K-contiguous along dim 1; B (K x N) along dim 0
        if element_bytes != 2 and not k_major:      # wgmma transposes 16-bit operands only
            return None
        rows, cols = slot_shape
        granule = cols if k_major else (WGMMA_M if operand == 0 else mma.instruction.n)
        swizzle = wgmma_tile_swizzle(cols, element_bytes, granule)
        return None, WgmmaTileLayout(rows, cols, element_bytes, swizzle, "K" if k_major else "MN"), None
    want = mma.a if operand == 0 else mma.b
    trans = operand == 1
    slot_want = want if dim == 1 else want.permute((1, 0))
    row_keyed = slot_want.shape[1] * element_bytes <= ROW_KEYED_MAX_BYTES
    fragment = ldmatrix_plan(slot_want, trans if dim == 1 else not trans, warp_size, element_bytes, row_keyed)
    if fragment is None:
        return None
    return want, fragment.smem, fragment


def _copy_layout(shape: tuple[int, int], width: int, num_threads: int) -> RegisterLayout | None:
    """Chunks of `width` elements of a (rows, cols) slot, row-major, dealt to the threads round-robin:
    neighbouring threads copy neighbouring chunks of a row (coalesced). None: they do not divide evenly."""
    rows, cols = shape
    if cols % width:
        return None
    per_row = cols // width
    threads_per_row = math.gcd(per_row, num_threads)
    thread_rows = num_threads // threads_per_row
    if rows % thread_rows:
        return None
    return local(rows // thread_rows, per_row // threads_per_row) * spatial(thread_rows, threads_per_row)


def _dot_consumer(value: Value, users, body: Block) -> tuple[Operation, int] | None:
    """(dot, operand index) when `value`'s only use is that operand, directly or through convert_layouts,
    all of them ops of the loop body itself (not of regions nested in it)."""
    uses = users.get(value, [])
    if len(uses) != 1 or uses[0][0].parent is not body:
        return None
    user, index = uses[0]
    if user.name == "dot" and index in (0, 1):
        return user, index
    if user.name == "convert_layout":
        return _dot_consumer(user.result, users, body)
    return None


def _address_slice(load: Operation, body: Block) -> tuple[Operation, ...] | None:
    """The body ops `load`'s view and offsets come from (pure scalar ops), if they depend on the induction
    variable and on no other block argument; None otherwise."""
    iv = body.args[0]
    in_body = {r: op for op in body.ops for r in op.results}
    read_only = not any(OPS[op.name].writes_memory for top in body.ops for op in top.walk())
    needed: set[Operation] = set()
    uses_iv = False
    work = list(load.operands)
    while work:
        value = work.pop()
        if value is iv:
            uses_iv = True
            continue
        if value in body.args:
            return None                     # a carried value: unknown for iterations ahead
        op = in_body.get(value)
        if op is None or op in needed:
            continue                        # defined outside the loop (or already taken)
        scalar_load = op.name == "load" and read_only
        if op.regions or not (OPS[op.name].pure or scalar_load) or any(isinstance(r.type, TileType)
                                                                      for r in op.results):
            return None
        needed.add(op)
        work.extend(op.operands)
    if not uses_iv:
        return None
    return tuple(op for op in body.ops if op in needed)


def _users(body: Block) -> dict[Value, list[tuple[Operation, int]]]:
    users: dict[Value, list[tuple[Operation, int]]] = {}
    for top in body.ops:
        for op in top.walk():
            for i, v in enumerate(op.operands):
                users.setdefault(v, []).append((op, i))
    return users


def _align(n: int, alignment: int = SHARED_ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment
