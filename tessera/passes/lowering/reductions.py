"""Reductions (reduce, arg_reduce) and scans.

Reduce. The reduced dim's coordinate is a mixed-radix number whose digits
the layout reads from registers (local digits) or from the thread index
(spatial digits: lanes of a warp, or warps). The reduction folds one digit
at a time:

* a local digit: a pairwise tree over the registers that differ in it;
* a lane digit (inside a warp): `shuffle` bfly with distance stride * 2^b
  for each bit b, so every lane ends up with the combined value;
* a warp digit (or a digit of a size that shuffles cannot split): every
  thread writes its partial registers to shared memory, a barrier, every
  thread reads the partials of the threads that differ in the digit and
  folds them in coordinate order, and a barrier.

Threads that differed only in reduced spatial digits now hold the same
result: they are the replicas of `layout.reduce(axis)`, so every thread
holding a result element has it. Registers with nonzero reduced local
digits are dropped.

Order. For the built-in kinds (sum, prod, max, min, and, or, xor), which
are commutative, digits go registers first, then lanes, then warps (the
cheap order: each thread folds its own registers before talking). A custom
combine needs its operands in index order: digits then go
from the least to the most significant, and in each shuffle step the lane
with the lower coordinate supplies the left operand. With power-of-two
sizes this order is exactly the tile interpreter's pairwise tree, so
custom (and float) results match it bit for bit; the built-in float sums
and products use the cheap order and may differ from the interpreter in
the last bits (tests allow a few ulps).

arg_reduce carries (value, index) pairs and breaks ties by the index (see
`arg_combine`), so it folds in the cheap order too, and ties and all-NaN
rows keep the smallest index, as the interpreter does.

Scan goes through shared memory: the tile is stored row-major, then each
register starts from the first element of its row and folds the row's
elements one by one in a thread-level `for` loop, keeping the fold only
up to its own coordinate (`select`), which is exactly the interpreter's
sequential order. Simple, O(n) per register; a warp-shuffle scan can
replace it later.
"""

from __future__ import annotations

from typing import Callable, Sequence

from tessera.ir import dtypes as dt
from tessera.ir.core import Block, Operation, Value
from tessera.ir.layouts import RegisterLayout
from tessera.ir.ops import is_lanewise_region
from tessera.ir.types import RegsType, ScalarType, TileType

from . import lowering
from .layout_math import Digit, layout_digits, row_major_strides, shared_dtype
from .values import Regs

BUILTIN_COMBINES = {"sum": "add", "prod": "mul", "max": "max", "min": "min", "and": "and", "or": "or", "xor": "xor"}

Items = tuple  # the values one register carries through a reduction: (value,) or (value, index)
Combine = Callable[[Items, Items], Items]


# -- combines ------------------------------------------------------------------------


def combine_op(kind: str, dtype: dt.DType) -> str:
    """The binary op of a built-in kind (max/min of bool are or/and: bool is not a number to `max`)."""
    if dtype.is_bool and kind in ("max", "min"):
        return "or" if kind == "max" else "and"
    return BUILTIN_COMBINES[kind]


def builtin_combine(ctx, kind: str, dtype: dt.DType) -> Combine:
    name = combine_op(kind, dtype)
    return lambda a, b: (ctx.emit(name, a[0], b[0]),)


def region_combine(ctx, region: Block) -> Combine:
    return lambda a, b: (clone_combine(ctx, region, a[0], b[0]),)


def arg_combine(ctx, kind: str, dtype: dt.DType) -> Combine:
    """(value, index) pairs, folded in any order: b wins if it is strictly better, if a is NaN and b is not,
    or if they tie (equal, or both NaN) and b's index is lower. So the best value's smallest index wins
    whichever registers, lanes and warps meet first, and arg_reduce folds in the cheap order (registers
    first), not index order: an argmax down a (4096, 1) tile at one warp took 1,280 shuffles in index order
    and ptxas more than 30 s."""
    better = "gt" if kind == "argmax" else "lt"

    def combine(a, b):
        take = ctx.emit("cmp", b[0], a[0], attrs={"pred": better})
        tie = ctx.emit("cmp", b[0], a[0], attrs={"pred": "eq"})
        if dtype.is_float:
            a_nan = ctx.emit("cmp", a[0], a[0], attrs={"pred": "ne"})
            b_nan = ctx.emit("cmp", b[0], b[0], attrs={"pred": "ne"})
            b_num = ctx.emit("cmp", b[0], b[0], attrs={"pred": "eq"})
            take = ctx.emit("or", take, ctx.emit("and", a_nan, b_num))
            tie = ctx.emit("or", tie, ctx.emit("and", a_nan, b_nan))
        lower = ctx.emit("cmp", b[1], a[1], attrs={"pred": "lt"})
        take = ctx.emit("or", take, ctx.emit("and", tie, lower))
        return (ctx.emit("select", take, b[0], a[0]), ctx.emit("select", take, b[1], a[1]))
    return combine


def clone_combine(ctx, region: Block, a: Value, b: Value) -> Value:
    """The combine region applied to `a` and `b` (scalars, or registers lane by lane)."""
    count = a.type.count if isinstance(a.type, RegsType) else None
    if count is not None and not is_lanewise_region(region):
        parts = [clone_combine(ctx, region, x, y) for x, y in zip(ctx.unpack(a), ctx.unpack(b))]
        return ctx.pack(parts)
    mapping = {region.args[0]: a, region.args[1]: b}
    return _clone_ops(ctx, region, mapping, count)


def _clone_ops(ctx, block: Block, mapping: dict, count: int | None) -> Value | list[Value]:
    """Clone `block`'s ops; return what its terminator yields (one value, or a list when several)."""
    def get(v):
        if v in mapping:
            return mapping[v]
        outer = ctx.thread_value(ctx.lookup(v))
        return ctx.splat(outer, count) if count is not None and not isinstance(outer.type, RegsType) else outer

    for op in block.ops:
        if op.name == "yield":
            values = [get(v) for v in op.operands]
            return values[0] if len(values) == 1 else values
        if op.name == "constant" and count is not None:
            mapping[op.result] = ctx.const_regs([op.attrs["value"]] * count, op.result.type.dtype)
            continue
        regions = []
        for region in op.regions:
            new = Block([a.type for a in region.args])
            for old_arg, new_arg in zip(region.args, new.args):
                mapping[old_arg] = new_arg
            with ctx.b.at(new):
                yielded = _clone_ops(ctx, region, mapping, count)
                ctx.create("yield", yielded if isinstance(yielded, list) else [yielded])
            regions.append(new)
        types = [RegsType(r.type, count) if count is not None else r.type for r in op.results]
        new_op = ctx.create(op.name, [get(v) for v in op.operands], op.attrs, types, regions)
        for old, new in zip(op.results, new_op.results):
            mapping[old] = new
    raise ctx.error(None, "combine region has no yield")


def tree(items: Sequence[Items], combine: Combine) -> Items:
    """The tile interpreter's order: combine neighbours (0,1), (2,3), ..., carry an odd last one up."""
    level = list(items)
    while len(level) > 1:
        paired = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        level = paired + ([level[-1]] if len(level) % 2 else [])
    return level[0]


# -- reduce ---------------------------------------------------------------------------


def reduce_registers(ctx, layout: RegisterLayout, axis: int, items: list[Items], combine: Combine,
                     ordered: bool) -> list[Items]:
    """Fold `items` (one per register of `layout`) along `axis`; the kept registers in order.

    ordered: fold digits from least to most significant, left operand lower (see the module docstring).
    """
    warp = ctx.warp_size
    digits = []
    for d in layout_digits(layout):
        if d.dim != axis:
            continue
        if d.spatial and d.stride < warp < d.stride * d.size and warp % d.stride == 0 \
                and d.size % (warp // d.stride) == 0:
            inner = warp // d.stride         # split a digit that spans lanes and warps
            digits.append(Digit(True, axis, inner, d.stride, d.dim_stride))
            digits.append(Digit(True, axis, d.size // inner, warp, d.dim_stride * inner))
        else:
            digits.append(d)
    if ordered:
        digits.sort(key=lambda d: d.dim_stride)
    else:
        digits.sort(key=lambda d: (d.spatial, d.stride if d.spatial else d.dim_stride))
    live = dict(enumerate(items))
    for d in digits:
        if not d.spatial:
            live = _fold_registers(live, d, combine)
        elif d.stride * d.size <= warp and d.size & (d.size - 1) == 0:
            live = _fold_lanes(ctx, live, d, combine, ordered)
        else:
            live = _fold_through_shared(ctx, live, d, combine)
    return [live[i] for i in sorted(live)]


def _fold_registers(live: dict, d: Digit, combine: Combine) -> dict:
    out = {}
    for i in sorted(live):
        if (i // d.stride) % d.size == 0:
            out[i] = tree([live[i + k * d.stride] for k in range(d.size)], combine)
    return out


def _fold_lanes(ctx, live: dict, d: Digit, combine: Combine, ordered: bool) -> dict:
    for bit in range(d.size.bit_length() - 1):
        distance = d.stride << bit
        lane = ctx.const(distance)
        upper = None
        if ordered:   # this thread holds the higher coordinate of the pair
            upper = ctx.hoist("cmp", [ctx.hoist("and", [ctx.index.thread_id, lane]), ctx.const(0)], {"pred": "ne"})
        out = {}
        for i, mine in live.items():
            other = tuple(ctx.emit("shuffle", x, lane, attrs={"mode": "bfly"}) for x in mine)
            if ordered:
                low = tuple(ctx.emit("select", upper, o, m) for m, o in zip(mine, other))
                high = tuple(ctx.emit("select", upper, m, o) for m, o in zip(mine, other))
                out[i] = combine(low, high)
            else:
                out[i] = combine(mine, other)
        live = out
    return live


def _fold_through_shared(ctx, live: dict, d: Digit, combine: Combine) -> dict:
    """Every thread publishes its registers; each folds those of the threads that differ in digit `d`."""
    keys = sorted(live)
    n = len(keys)
    width = len(live[keys[0]])
    threads = ctx.num_threads
    row_of_thread = ctx.index.affine(ctx.index.thread_id, n)
    buffers = []
    for c in range(width):
        dtype = live[keys[0]][c].type.dtype
        sdtype = shared_dtype(dtype)
        buf = ctx.smem.alloc(sdtype, threads * n)
        registers = ctx.cast(ctx.pack([live[i][c] for i in keys]), sdtype)
        ctx.create("store", [_row_pointers(ctx, buf, row_of_thread, n), registers], _row_vector(ctx, n, sdtype))
        buffers.append((buf, dtype, sdtype))
    ctx.threads.barrier()
    mine = ctx.index.digit(d.stride, d.size)
    first = ctx.hoist("sub", [ctx.index.thread_id, ctx.index.affine(mine, d.stride)])
    partials = []           # partials[j][r]: register r of the thread with digit j
    for j in range(d.size):
        row = ctx.index.affine(ctx.index.affine(first, 1, j * d.stride), n)
        columns = []
        for buf, dtype, sdtype in buffers:
            loaded = ctx.emit("load", _row_pointers(ctx, buf, row, n), attrs=_row_vector(ctx, n, sdtype))
            columns.append(ctx.unpack(ctx.cast(loaded, dtype)))
        partials.append([tuple(col[r] for col in columns) for r in range(n)])
    ctx.threads.barrier()
    return {key: tree([partials[j][r] for j in range(d.size)], combine) for r, key in enumerate(keys)}


def _row_pointers(ctx, buf: Value, row: Value, n: int) -> Value:
    index = ctx.emit("add", ctx.splat(row, n), ctx.const_regs(list(range(n)), dt.i32)) if n > 1 else ctx.splat(row, 1)
    return ctx.emit("addptr", ctx.splat(buf, n), index)


def _row_vector(ctx, n: int, dtype: dt.DType) -> dict | None:
    k = max(1, ctx.target.max_vector_bits // max(dtype.bits, 8))
    k = min(k, n & -n)
    return {"vector": k} if k > 1 else None


def _reduce_common(ctx, op: Operation, items_of: Callable[[Regs], list[Items]], combine: Combine,
                   ordered: bool, component: int) -> None:
    src = ctx.operand(op, 0)
    axis = op.attrs["axis"]
    kept = reduce_registers(ctx, src.layout, axis, items_of(src), combine, ordered)
    values = [item[component] for item in kept]
    if not isinstance(op.result.type, TileType):
        ctx.define(op.result, values[0], op)
        return
    layout = src.layout.reduce(axis, keepdims=False)
    ctx.define(op.result, Regs(ctx.pack(values), layout), op)


@lowering("reduce")
def _reduce(ctx, op):
    kind = op.attrs["kind"]
    if kind == "custom":
        combine, ordered = region_combine(ctx, op.regions[0]), True
    else:
        combine, ordered = builtin_combine(ctx, kind, op.operands[0].type.element.dtype), False
    _reduce_common(ctx, op, lambda src: [(v,) for v in ctx.unpack(src.value)], combine, ordered, 0)


@lowering("arg_reduce")
def _arg_reduce(ctx, op):
    dtype = op.operands[0].type.element.dtype
    axis = op.attrs["axis"]

    def items(src: Regs) -> list[Items]:
        rank = src.layout.rank
        index = ctx.index.regs(src.layout, [1 if d == axis else 0 for d in range(rank)])
        return list(zip(ctx.unpack(src.value), ctx.unpack(index)))
    _reduce_common(ctx, op, items, arg_combine(ctx, op.attrs["kind"], dtype), False, 1)


# -- scan ---------------------------------------------------------------------------------


@lowering("scan")
def _scan(ctx, op):
    src = ctx.operand(op, 0)
    layout = src.layout
    shape = layout.shape
    axis, kind, reverse = op.attrs["axis"], op.attrs["kind"], op.attrs.get("reverse", False)
    n = shape[axis]
    if n == 1:
        ctx.define(op.result, src, op)
        return
    dtype = src.element.dtype
    count = layout.local_size
    strides = row_major_strides(shape)
    buf = ctx.smem.to_shared(src)
    row_weights = [0 if d == axis else s for d, s in enumerate(strides)]
    row_start = ctx.index.regs(layout, row_weights)
    coord = ctx.index.regs(layout, [1 if d == axis else 0 for d in range(len(shape))])

    def element(k: Value | int) -> Value:
        step = ctx.const(k * strides[axis]) if isinstance(k, int) else ctx.emit("mul", k, ctx.const(strides[axis]))
        ptrs = ctx.emit("addptr", ctx.splat(buf, count), ctx.emit("add", row_start, ctx.splat(step, count)))
        return ctx.cast(ctx.emit("load", ptrs), dtype)

    if kind == "custom":
        region = op.regions[0]
        combine = lambda a, b: clone_combine(ctx, region, a, b)   # noqa: E731
    else:
        name = combine_op(kind, dtype)
        combine = lambda a, b: ctx.emit(name, a, b)                # noqa: E731
    first = element(n - 1 if reverse else 0)
    t = first.type
    body = Block([ScalarType(dt.i32), t], ["j", "acc"])
    with ctx.b.at(body):
        j, acc = body.args
        k = ctx.emit("sub", ctx.const(n - 1), j) if reverse else j
        x = element(k)
        folded = combine(x, acc) if reverse else combine(acc, x)
        keep = ctx.emit("cmp", ctx.splat(k, count), coord, attrs={"pred": "ge" if reverse else "le"})
        ctx.create("yield", [ctx.emit("select", keep, folded, acc)])
    loop = ctx.create("for", [ctx.const(1), ctx.const(n), ctx.const(1), first], None, [t], [body])
    ctx.threads.barrier()
    ctx.define(op.result, Regs(loop.result, layout), op)
