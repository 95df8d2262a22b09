"""Which loads of a `for {stages = S}` loop are software-pipelined, and how (analysis only, on tile IR).

`pipeline_plan(loop, target, num_warps, facts)` answers for one loop; the
emission is `async_pipeline.py`. A `view_load` in the loop body is
pipelined when all of these hold (otherwise it stays an ordinary load):

* the target has cp.async and ldmatrix, S >= 2 and the loop step is a
  positive compile-time constant (so iteration i + S - 1 is known);
* its only consumer is operand A or B of one tensor-core `dot` of the body
  (`mma.mma_plan` says yes, on mma.sync: a wgmma dot stores its operands
  into its own swizzled tiles and is not pipelined in this version; not
  inside a region nested in the body),
  directly or through `convert_layout`s, and its dtype is f16/bf16 (ldmatrix
  reads 16-bit elements);
* its fill is 0 (cp.async zero-fills masked chunks; another fill keeps the
  ordinary path);
* its view and offsets are computed in the body from the induction variable
  and loop-invariant values by pure scalar ops (the `slice`, re-evaluated
  for iterations ahead), and they do depend on the induction variable;
* one dim of the view has the constant stride 1 and the alignment analysis
  proves copies of at least 4 bytes along it (`alignment.access_width`):
  16 bytes where contiguity, alignment and bounds allow, else 8 or 4;
* ldmatrix can read the fragment from a row-major buffer whose rows run
  along that contiguous dim (`mma_operands.ldmatrix_plan`; for a dim-0
  contiguous operand the buffer holds the transposed tile and the ldmatrix
  `.trans` flips), and the block's chunks divide evenly among the threads.

On a target with TMA, a load whose tensor map the host can build from the
kernel's specialization fills its slots with TMA instead of cp.async
(`tma_fill.tma_plan` has the conditions; `PipelinedLoad.tma`).

Shared memory: the ring of a load is S slots of its tile. S is lowered
until S x (sum of the slots) fits the target's shared memory per block
(other buffers live during the loop are not counted: should they not fit,
the allocator reports it); below 2 stages nothing is pipelined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera.ir.core import Block, Operation, Value
from tessera.ir.layouts import RegisterLayout, local, spatial
from tessera.ir.ops import OPS
from tessera.ir.target import Target
from tessera.ir.types import TileType

from .. import alignment
from ..mma import mma_plan
from .mma_operands import LDMATRIX_DTYPES, LdmatrixPlan, ldmatrix_plan
from .tma_fill import TmaBox, tma_plan

MIN_COPY_BYTES = 4
MAX_COPY_BYTES = 16
SHARED_ALIGNMENT = 16


@dataclass(frozen=True)
class PipelinedLoad:
    """One view_load turned into a ring of shared-memory slots filled by cp.async."""

    load: Operation                     # the tile-IR view_load
    slice: tuple[Operation, ...]        # body ops computing its view and offsets, in body order
    dot: Operation                      # the dot it feeds
    operand: int                        # 0 (A) or 1 (B)
    want: RegisterLayout                # the fragment layout the dot takes it in (tile orientation)
    contiguous_dim: int                 # the tile dim with unit stride: slot rows run along it
    width: int                          # elements per async_copy
    copies: RegisterLayout              # tile-orientation layout of the copy chunks (contiguous dim / width)
    fragment: LdmatrixPlan              # ldmatrix reads of a slot (in slot orientation)
    tma: TmaBox | None = None           # the slots are filled by TMA (else by cp.async with `copies`)

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
    def slot_align(self) -> int | None:
        """The ring's alignment in bytes when TMA fills it (the swizzle's period); None: the allocator's."""
        return self.tma.slot_align if self.tma is not None else None

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

    @property
    def shared_bytes(self) -> int:
        return self.stages * sum(_align(load.slot_bytes) for load in self.loads)

    @property
    def tma_loads(self) -> tuple[PipelinedLoad, ...]:
        return tuple(load for load in self.loads if load.tma is not None)

    @property
    def copy_loads(self) -> tuple[PipelinedLoad, ...]:
        """The loads filled by cp.async."""
        return tuple(load for load in self.loads if load.tma is None)


def pipeline_plan(loop: Operation, target: Target, num_warps: int, facts: dict) -> PipelinePlan | None:
    """How `loop` is pipelined on `target`; None: it is lowered as a plain loop."""
    requested = loop.attrs.get("stages", 1)
    if requested < 2 or not (target.has("cp.async") and target.has("ldmatrix")):
        return None
    step = getattr(facts.get(loop.operands[2]), "constant", None)
    if step is None or step <= 0:
        return None
    body = loop.regions[0]
    users = _users(body)
    loads = []
    for op in body.ops:
        if op.name == "view_load":
            planned = _plan_load(op, body, users, target, num_warps, facts)
            if planned is not None:
                loads.append(planned)
    if not loads:
        return None
    per_stage = sum(_align(load.slot_bytes) for load in loads)
    stages = min(requested, target.shared_memory_bytes // per_stage)
    if stages < 2:
        return None
    return PipelinePlan(loop, stages, requested, step, tuple(loads))


def _plan_load(load: Operation, body: Block, users, target: Target, num_warps: int,
               facts: dict) -> PipelinedLoad | None:
    tile = load.result.type
    dtype = tile.element.dtype
    if len(tile.shape) != 2 or dtype not in LDMATRIX_DTYPES or load.attrs.get("fill", 0) != 0:
        return None
    consumer = _dot_consumer(load.result, users, body)
    if consumer is None:
        return None
    dot, operand = consumer
    mma = mma_plan(dot, target, num_warps)
    if mma is None or mma.a is None:    # wgmma reads its own shared tiles; not pipelined (yet)
        return None
    slice_ops = _address_slice(load, body)
    if slice_ops is None:
        return None
    view_facts = facts.get(load.operands[0])
    if view_facts is None or not any(view_facts.unit_stride):
        return None
    dim = 1 if view_facts.unit_stride[1] else 0
    width = alignment.access_width(facts, load, MAX_COPY_BYTES * 8, dim=dim)
    want = mma.a if operand == 0 else mma.b
    trans = operand == 1
    slot_want = want if dim == 1 else want.permute((1, 0))
    fragment = ldmatrix_plan(slot_want, trans if dim == 1 else not trans, target.warp_size)
    if fragment is None:
        return None
    num_threads = num_warps * target.warp_size
    while width * dtype.bits >= MIN_COPY_BYTES * 8:
        copies = _copy_layout(slot_want.shape, width, num_threads)
        if copies is not None:
            if dim == 0:
                copies = copies.permute((1, 0))
            tma = tma_plan(load, dim, fragment.smem, target, facts)
            return PipelinedLoad(load, slice_ops, dot, operand, want, dim, width, copies, fragment, tma)
        width //= 2
    return None


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
        if op.regions or not OPS[op.name].pure or any(isinstance(r.type, TileType) for r in op.results):
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


def _align(n: int) -> int:
    return (n + SHARED_ALIGNMENT - 1) // SHARED_ALIGNMENT * SHARED_ALIGNMENT
