"""Vertical fusion: a consumer launch merged into its producer when it reads exactly the tiles the producer wrote.

`prove(producer, consumer, aliased)` returns the matched (store, loads)
pairs or the reason fusion would be wrong or unprovable. The proof:

* both launches have the same grid, and the same numerics options;
* every buffer is traced to a parameter and none of them overlaps another;
* each buffer the producer writes and the consumer touches is written once,
  at the top level, and the consumer only reads it, at the top level, at
  lanes whose keys (`accesses.Keys`) equal the store's: the same view,
  block offsets and shape, or the same pointers and mask. Keys are built
  from program ids, parameters and pure ops, so equal keys mean the same
  program instance reads what it wrote itself;
* the consumer writes nothing the producer touches, except a tile the
  producer read at the same lanes (in place), and nothing racy (atomics).

`fuse(producer, consumer, proof, drop)` builds the fused launch: the
producer's body, then the consumer's, each load of a matched pair replaced
by the stored value (lanes the load would not read, outside the view or
masked off, get its fill value), and the producer's stores to the buffers
in `drop` left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from tessera.ir.builder import Builder
from tessera.ir import dtypes
from tessera.ir.core import Block, Operation, Value
from tessera.ir.types import ScalarType, TileType, element_of

from ..dce import dce_function
from ..rewrite import clone_op, resolve
from .accesses import Access, Keys, accesses
from .launches import Launch
from .merge import Merged, body_ops

NUMERICS_ATTRS = ("fast_math",)


@dataclass
class Proof:
    """What `fuse` needs: for each buffer forwarded, the producer's store and the consumer's loads of it."""

    stores: dict[str, Access]
    loads: dict[Operation, Access]        # consumer load op -> the producer store it reads


def prove(producer: Launch, consumer: Launch, aliased: frozenset[str] = frozenset()) -> Union[Proof, str]:
    """The forwarding pairs, or the reason the consumer cannot be fused into the producer."""
    if producer.grid != consumer.grid:
        return f"grids differ: {producer.grid} vs {consumer.grid}"
    for attr in NUMERICS_ATTRS:
        if producer.fn.attrs.get(attr) != consumer.fn.attrs.get(attr):
            return f"numerics options differ ({attr})"
    keys = Keys().bind(producer).bind(consumer)
    made, used = accesses(producer, keys), accesses(consumer, keys)
    for access in made + used:
        if access.buffer is None:
            return f"@{_owner(access, producer, consumer)} accesses memory through an address not traced to a parameter"
    touched = {a.buffer for a in made} & {a.buffer for a in used}
    overlapping = sorted(touched & aliased)
    if overlapping:
        return f"buffer {overlapping[0]} overlaps another buffer"
    written = {a.buffer for a in made if a.writes}
    proof = Proof({}, {})
    for buffer in sorted(written & {a.buffer for a in used}):
        reason = _forward(buffer, made, used, proof)
        if reason:
            return reason
    for access in used:
        if access.writes and access.buffer in {a.buffer for a in made}:
            reason = _in_place(access, made)
            if reason:
                return reason
    if not proof.stores:
        return "the consumer reads nothing the producer writes"
    return proof


def _forward(buffer: str, made: list[Access], used: list[Access], proof: Proof) -> str:
    stores = [a for a in made if a.buffer == buffer and a.writes]
    if len(stores) != 1 or stores[0].kind not in ("view_store", "store") or not stores[0].top_level:
        return f"the producer writes {buffer} other than by one store at the top level"
    store = stores[0]
    for access in (a for a in used if a.buffer == buffer):
        if access.writes:
            return f"the consumer writes {buffer}, which the producer writes too"
        if not access.top_level:
            return f"the consumer reads {buffer} inside a loop or branch"
        if access.kind != _load_kind(store.kind) or access.where != store.where:
            return (f"the consumer reads {buffer} at lanes not proven equal to those the producer stored "
                    f"(a different view, block, offsets or mask)")
        proof.loads[access.op] = store
    proof.stores[buffer] = store
    return ""


def _in_place(write: Access, made: list[Access]) -> str:
    """A consumer write of a buffer the producer reads is fine when it is the same tile, at the top level."""
    for access in (a for a in made if a.buffer == write.buffer):
        same_lanes = access.kind == _load_kind(write.kind) and access.where == write.where
        if access.writes or not (same_lanes and access.top_level and write.top_level):
            return (f"the consumer writes {write.buffer}, which the producer reads at other lanes: a program "
                    f"of the fused kernel could overwrite what another has yet to read")
    return ""


def _load_kind(store_kind: str) -> str:
    return {"view_store": "view_load", "store": "load"}.get(store_kind, "")


def _owner(access: Access, producer: Launch, consumer: Launch) -> str:
    root = access.op
    while isinstance(root.parent, Block) and isinstance(root.parent.parent, Operation):
        root = root.parent.parent
    return producer.name if root.parent is producer.fn.body else consumer.name


def fuse(producer: Launch, consumer: Launch, proof: Proof, drop: frozenset[str]) -> Launch:
    """The producer and the consumer as one launch, loads of matched tiles forwarded (module docstring)."""
    merged = Merged(f"{producer.name}__{consumer.name}", [producer, consumer])
    produced = merged.mapping(producer)
    skipped = {proof.stores[buffer].op for buffer in drop}
    merged.clone_body(producer, produced, skip=skipped)
    consumed = merged.mapping(consumer)
    for op in body_ops(consumer):
        store = proof.loads.get(op)
        if store is None:
            merged.fn.body.append(clone_op(op, consumed))
        else:
            stored = store.op.operands[1] if store.kind == "store" else store.op.operands[-1]
            value = resolve(produced, stored)
            consumed[op.result] = forwarded(merged.builder, op, value, consumed)
    fused = merged.launch(producer.grid, [producer, consumer])
    dce_function(fused.fn)
    return fused


def forwarded(b: Builder, load: Operation, value: Value, mapping: dict[Value, Value]) -> Value:
    """What `load` would have read, given the value stored at its lanes: the stored value where the load reads
    memory, its fill (`other`, or the view's fill) where it does not."""
    result_type = load.result.type
    if load.name == "load":
        if len(load.operands) < 2:
            return value
        mask = resolve(mapping, load.operands[1])
        other = resolve(mapping, load.operands[2]) if len(load.operands) > 2 else _constant(b, result_type, 0)
        return b.create("select", [mask, value, other]).result
    inside = _inside_view(b, load, mapping)
    fill = _constant(b, result_type, load.attrs.get("fill", 0))
    return b.create("select", [inside, value, fill]).result


def _constant(b: Builder, type_, value) -> Value:
    dtype = element_of(type_).dtype
    value = float(value) if dtype.is_float else bool(value) if dtype.is_bool else int(value)
    return b.create("constant", attrs={"value": value}, result_types=[type_]).result


def _inside_view(b: Builder, load: Operation, mapping: dict[Value, Value]) -> Value:
    """The bool tile of the lanes of a view_load's block that lie inside its view (the others read the fill)."""
    view_op = resolve(mapping, load.operands[0]).owner
    shape = tuple(load.attrs["shape"])
    rank = len(shape)
    sizes = view_op.operands[1:1 + rank]
    i64 = ScalarType(dtypes.i64)
    inside = None
    for axis, (size, offset) in enumerate(zip(sizes, [resolve(mapping, v) for v in load.operands[1:]])):
        n = shape[axis]
        start = _cast(b, offset, i64)          # view_load's offsets count elements, not blocks
        lanes = b.create("cast", [b.create("arange", attrs={"start": 0, "end": n}).result],
                         result_types=[TileType(i64, (n,))]).result
        index = b.create("add", [b.create("splat", [start], result_types=[TileType(i64, (n,))]).result,
                                 lanes]).result
        limit = b.create("splat", [_cast(b, size, i64)], result_types=[TileType(i64, (n,))]).result
        ok = b.create("cmp", [index, limit], attrs={"pred": "lt"}).result
        ok = _spread(b, ok, axis, shape)
        inside = ok if inside is None else b.create("and", [inside, ok]).result
    return inside


def _spread(b: Builder, lanes: Value, axis: int, shape: tuple[int, ...]) -> Value:
    """A 1-D tile along `axis` broadcast to `shape`."""
    if len(shape) == 1:
        return lanes
    for d in range(len(shape)):
        if d != axis:
            lanes = b.create("expand_dims", [lanes], attrs={"axis": d}).result
    return b.create("broadcast", [lanes], result_types=[TileType(element_of(lanes.type), shape)]).result


def _cast(b: Builder, value: Value, to: ScalarType) -> Value:
    return value if value.type == to else b.create("cast", [value], result_types=[to]).result
