"""Lane maps: an elementwise consumer re-indexed onto the tile its producer stores.

A consumer is a lane map over buffer B when each of its lanes computes one
element from index `offs = program_id(0) * BLOCK + arange(0, BLOCK)` alone:
every tile value derives from `offs`, scalars and loads by lane-wise
(`elementwise`) ops; B is read at `offs` under the mask `offs < n`; every
store writes at `offs` under that mask; its grid covers [0, n) and nothing
else uses the program id. What it computes for element e then does not
depend on which program computes it, so it may run wherever B[e] is made.

`absorb(producer, consumer)` does that when the producer stores B by one
top-level `view_store` of a row-major contiguous view of n elements that
the producer writes in full (declared: `Launch.writes_all`, as library ops
do; the IR cannot show a grouped GEMM order covers every tile): the
consumer's ops are cloned after the producer's store with `offs` replaced
by the linear indices of the stored block, the mask by the block's
in-bounds lanes, B's load by the stored tile, and their tiles reshaped to
the block's shape. It returns the fused launch, None when the consumer does
not read what the producer writes, or the reason it cannot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from tessera.ir.builder import Builder
from tessera.ir.core import Operation, Value
from tessera.ir.ops import OPS
from tessera.ir.types import ScalarType, TileType, element_of, shape_of

from ..dce import dce_function
from ..rewrite import resolve
from .accesses import Keys, accesses
from .launches import Launch, scalar_value
from .merge import Merged, Refused, body_ops
from .vertical import NUMERICS_ATTRS, _constant, _spread


@dataclass
class LaneMap:
    buffer: str
    offs: Value                  # the consumer's index tile
    mask: Value                  # offs < n
    n: int
    index_ops: set               # the ops computing offs and the mask (replaced, not cloned)


def absorb(producer: Launch, consumer: Launch, later: set[str], aliased: frozenset[str]) -> Union[Launch, str, None]:
    keys = Keys().bind(producer).bind(consumer)
    made, used = accesses(producer, keys), accesses(consumer, keys)
    written = {a.buffer for a in made if a.writes}
    read = {a.buffer for a in used if a.reads and a.buffer in written}
    if len(read) != 1:
        return None if not read else f"it reads {len(read)} buffers the producer writes"
    (buffer,) = read
    for attr in NUMERICS_ATTRS:         # the consumer's math would be compiled with the producer's options
        if producer.fn.attrs.get(attr) != consumer.fn.attrs.get(attr):
            return f"numerics options differ ({attr})"
    if None in {a.buffer for a in made + used} or (set(aliased) & ({a.buffer for a in made} | {a.buffer for a in used})):
        return "an address is not traced to a parameter, or buffers overlap"
    if any(a.writes and a.buffer in {m.buffer for m in made} for a in used):
        return "it writes a buffer the producer touches"
    lane_map = _lane_map(consumer, buffer, keys)
    if isinstance(lane_map, str):
        return lane_map
    store = _producer_store(producer, buffer, made, lane_map.n)
    if isinstance(store, str):
        return store
    try:
        return _build(producer, consumer, lane_map, store, drop=buffer not in later)
    except Refused as exc:
        return str(exc)


def _lane_map(consumer: Launch, buffer: str, keys: Keys) -> Union[LaneMap, str]:
    """The consumer's index and mask if it is a lane map over `buffer` (module docstring), else the reason."""
    if consumer.grid[1:] != (1, 1):
        return "its grid is not one-dimensional"
    params = dict(zip(consumer.fn.args, consumer.bind))
    loads = [op for op in body_ops(consumer) if op.name == "load" and _base(op.operands[0], params) == buffer]
    if len(loads) != 1 or len(loads[0].operands) < 2:
        return f"it does not read {buffer} by one masked pointer load"
    offs, mask = _offset_of(loads[0].operands[0]), loads[0].operands[1]
    index = _index_pattern(offs)
    if index is None:
        return "its index is not program_id(0) * BLOCK + arange(0, BLOCK)"
    block, index_ops = index
    n = _bound_of(mask, offs, params)
    if n is None:
        return "its mask is not index < n with n known"
    if consumer.grid[0] * block < n:
        return f"its grid covers {consumer.grid[0] * block} of {n} elements"
    reason = _only_lane_ops(consumer, offs, mask, keys, index_ops | {mask.owner})
    return reason or LaneMap(buffer, offs, mask, n, index_ops | {mask.owner})


def _base(pointers: Value, params: dict) -> Optional[str]:
    op = pointers.owner
    if isinstance(op, Operation) and op.name == "addptr":
        splat = op.operands[0].owner
        if isinstance(splat, Operation) and splat.name == "splat" and splat.operands[0] in params:
            return params[splat.operands[0]]
    return None


def _offset_of(pointers: Value) -> Value:
    return pointers.owner.operands[1]


def _index_pattern(offs: Value) -> Optional[tuple[int, set]]:
    """(BLOCK, the ops computing it) when offs = splat(program_id(0) * BLOCK) + arange(0, BLOCK)."""
    add = offs.owner
    if not isinstance(add, Operation) or add.name != "add":
        return None
    for splat, arange in (add.operands, add.operands[::-1]):
        s, a = splat.owner, arange.owner
        if not (isinstance(s, Operation) and s.name == "splat" and isinstance(a, Operation) and a.name == "arange"):
            continue
        mul = s.operands[0].owner
        if a.attrs["start"] != 0 or not isinstance(mul, Operation) or mul.name != "mul":
            continue
        for pid, const in (mul.operands, mul.operands[::-1]):
            if (_is(pid, "program_id") and pid.owner.attrs["axis"] == 0 and _is(const, "constant")
                    and const.owner.attrs["value"] == a.attrs["end"]):
                return a.attrs["end"], {add, s, a, mul, pid.owner, const.owner}
    return None


def _is(value: Value, name: str) -> bool:
    return isinstance(value.owner, Operation) and value.owner.name == name


def _bound_of(mask: Value, offs: Value, params: dict) -> Optional[int]:
    """n when mask = offs < splat(n) and n's value is known."""
    cmp = mask.owner
    if not (_is(mask, "cmp") and cmp.attrs["pred"] == "lt" and cmp.operands[0] is offs and _is(cmp.operands[1], "splat")):
        return None
    n = cmp.operands[1].owner.operands[0]
    value = scalar_value(params[n]) if n in params else n.owner.attrs["value"] if _is(n, "constant") else None
    return value if isinstance(value, int) else None


def _only_lane_ops(consumer: Launch, offs: Value, mask: Value, keys: Keys, index_ops: set) -> str:
    """'' when every op outside the index computes lane by lane (or on scalars) and stores only at offs under
    the mask; else what breaks it."""
    for op in body_ops(consumer):
        if op in index_ops:
            continue
        opdef = OPS[op.name]
        tiles = [v for v in [*op.operands, *op.results] if isinstance(v.type, TileType)]
        if op.name == "store":
            if keys(_offset_of(op.operands[0])) != keys(offs) or len(op.operands) < 3 or keys(op.operands[2]) != keys(mask):
                return f"it stores other than at its index under its mask ({op.name})"
        elif op.name in ("load", "splat", "constant") or opdef.elementwise:
            pass
        elif tiles or op.regions or not opdef.pure or op.name in ("program_id", "num_programs"):
            return f"`{op.name}` is not a lane-wise op"
        if any(v.type.shape != offs.type.shape for v in tiles):
            return "it has tiles of other shapes"
        if any(v.owner in index_ops and v is not offs and v is not mask for v in op.operands):
            return "it uses the program id other than through its index"
    return ""


@dataclass
class BlockStore:
    """The producer's store of B: a block (shape) at block offsets of a row-major view with these sizes."""

    op: Operation
    sizes: list[Value]
    offsets: list[Value]
    shape: tuple[int, ...]


def _producer_store(producer: Launch, buffer: str, made, n: int) -> Union[BlockStore, str]:
    if buffer not in producer.writes_all:
        return f"{producer.name} is not known to write all of {buffer} (the IR cannot show it)"
    stores = [a for a in made if a.buffer == buffer and a.writes]
    if len(stores) != 1 or stores[0].kind != "view_store" or not stores[0].top_level:
        return f"{producer.name} writes {buffer} other than by one block store at the top level"
    op = stores[0].op
    view = op.operands[0].owner
    rank = (len(view.operands) - 1) // 2
    params = dict(zip(producer.fn.args, producer.bind))
    sizes, strides = view.operands[1:1 + rank], view.operands[1 + rank:]
    values = [_static(v, params) for v in sizes + strides]
    if None in values:
        return f"the sizes and strides of {buffer}'s view are not known"
    dims, steps = values[:rank], values[rank:]
    row_major = [1] + [0] * (rank - 1)
    for d in range(rank - 2, -1, -1):
        row_major[rank - 1 - d] = row_major[rank - 2 - d] * dims[d + 1]
    if steps != row_major[::-1] or _product(dims) != n:
        return f"{buffer}'s view is not a row-major run of the consumer's {n} elements"
    return BlockStore(op, list(sizes), list(op.operands[1:-1]), tuple(op.operands[-1].type.shape))


def _static(value: Value, params: dict):
    if value in params:
        return scalar_value(params[value])
    return value.owner.attrs["value"] if _is(value, "constant") else None


def _product(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _build(producer: Launch, consumer: Launch, lane_map: LaneMap, store: BlockStore, drop: bool) -> Launch:
    merged = Merged(f"{producer.name}__{consumer.name}", [producer, consumer])
    produced = merged.mapping(producer)
    merged.clone_body(producer, produced, skip={store.op} if drop else set())
    b = merged.builder
    index_type = element_of(lane_map.offs.type)
    linear, inside = _block_indices(b, store, produced, index_type)
    stored = resolve(produced, store.op.operands[-1])
    consumed = merged.mapping(consumer)
    consumed[lane_map.offs], consumed[lane_map.mask] = linear, inside
    params = dict(zip(consumer.fn.args, consumer.bind))
    for op in body_ops(consumer):
        if op in lane_map.index_ops:
            continue
        if op.name == "load" and _base(op.operands[0], params) == lane_map.buffer:
            consumed[op.result] = b.create("select", [inside, stored, _constant(b, stored.type, 0)]).result
            continue
        _clone_reshaped(b, op, consumed, store.shape, inside)
    fused = merged.launch(producer.grid, [producer, consumer])
    dce_function(fused.fn)
    return fused


def _block_indices(b: Builder, store: BlockStore, mapping: dict, index_type: ScalarType) -> tuple[Value, Value]:
    """The linear element index of each lane of the stored block (row-major), and which lanes are in bounds."""
    shape, rank = store.shape, len(store.shape)
    linear = inside = None
    for axis in range(rank):
        n = shape[axis]
        tile = TileType(index_type, (n,))
        start = _to(b, resolve(mapping, store.offsets[axis]), index_type)      # in elements
        lanes = b.create("arange", attrs={"start": 0, "end": n}).result
        index = b.create("add", [b.create("splat", [start], result_types=[tile]).result, _to(b, lanes, index_type)]).result
        size = _to(b, resolve(mapping, store.sizes[axis]), index_type)
        ok = _spread(b, b.create("cmp", [index, b.create("splat", [size], result_types=[tile]).result],
                                 attrs={"pred": "lt"}).result, axis, shape)
        inside = ok if inside is None else b.create("and", [inside, ok]).result
        spread = _spread(b, index, axis, shape)
        if linear is None:
            linear = spread
        else:
            width = b.create("splat", [size], result_types=[TileType(index_type, shape)]).result
            linear = b.create("add", [b.create("mul", [linear, width]).result, spread]).result
    return linear, inside


def _to(b: Builder, value: Value, dtype: ScalarType) -> Value:
    element = element_of(value.type)
    if element == dtype:
        return value
    return b.create("cast", [value], result_types=[TileType(dtype, shape_of(value.type)) if shape_of(value.type)
                                                   else dtype]).result


def _clone_reshaped(b: Builder, op: Operation, mapping: dict, shape: tuple[int, ...], inside: Value) -> None:
    """`op` with its operands mapped and its tiles made `shape`-shaped; loads and stores also masked to the
    block's in-bounds lanes (the others may alias elements of the next row)."""
    operands = [resolve(mapping, v) for v in op.operands]
    if op.name in ("load", "store"):
        at = 1 if op.name == "load" else 2
        if len(operands) > at:
            if operands[at] is not inside:
                operands[at] = b.create("and", [operands[at], inside]).result
        else:
            operands.append(inside)
    types = [TileType(t.element, shape) if isinstance(t, TileType) else t for t in (r.type for r in op.results)]
    if op.name == "return":
        return
    new = b.create(op.name, operands, dict(op.attrs), result_types=types)
    mapping.update(zip(op.results, new.results))
