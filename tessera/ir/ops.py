"""Every op of the tile IR, defined once: name, operands, attributes, type rule.

An `OpDef` says how many operands an op takes, which attributes it requires
(and of what kind), how many regions it owns, its traits, and its type rule:

* `infer(operand_types, attrs) -> result types` for ops whose result type
  follows from their inputs (the builder calls it; the verifier compares);
* `check(op)` for ops whose result type is chosen by the producer (`cast`,
  `splat`, `constant`, ...) and for region structure. It raises
  `TypeRuleError` with a message that says what is wrong.

Traits say what passes may assume of an op, so that they ask the op instead
of keeping lists of names (`op_names(elementwise=True)`, `OPS[name].shape_op`):
`elementwise`, `numerics` (which `ir/numerics.py` family computes its lanes),
`shape_op`, `commutative`, `pointer_lanes`, `reads_memory`, `writes_memory`,
`orders_programs` and `has_regions`. Adding a lane-wise op is one `define(...)` here, its
numerics, and its LLVM lowering; tests/ir/test_op_traits.py checks the traits
against what the interpreter computes.

Ops are grouped below by family. Interpreter semantics live in
`tessera/backends/interp/`, keyed by the same names.

Conventions shared by the rules:
* Elementwise ops take operands of identical type (the frontend inserts
  casts and broadcasts first), scalars or tiles alike.
* Comparisons return `bool` in the operands' shape.
* Integer `div`/`rem` truncate toward zero (C semantics, like the hardware).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from . import dtypes as dt
from .core import Block, Operation
from .errors import TypeRuleError
from .types import (
    PointerType, RegsType, ScalarType, TileType, Type, ViewType,
    element_of, scalar_dtype, shape_of, with_element, with_shape,
)

# Attribute kinds an op can declare; the verifier and parser check values against them.
ATTR_KINDS = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, float),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "scalar": lambda v: isinstance(v, (int, float, bool)),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "ints": lambda v: isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
    "strs": lambda v: isinstance(v, tuple) and all(isinstance(x, str) for x in v),
}


@dataclass(frozen=True)
class OpDef:
    name: str
    doc: str
    operands: tuple[int, int]            # (min, max) operand count; max -1 = unbounded
    attrs: dict[str, str] = field(default_factory=dict)           # required attribute -> kind
    optional_attrs: dict[str, str] = field(default_factory=dict)  # optional attribute -> kind
    regions: tuple[int, int] = (0, 0)      # (min, max) region count
    infer: Callable[[list[Type], dict[str, Any]], list[Type]] | None = None
    check: Callable[[Operation], None] | None = None
    terminator: bool = False
    pure: bool = True                    # no side effects: may be CSE'd or removed when unused
    level: str = "tile"                  # "tile": tile IR (also valid per thread); "thread": thread IR only
    # Traits (see the module docstring); passes ask them instead of listing op names.
    elementwise: bool = False            # pure; lane i of the result is computed from lane i of each operand
    numerics: str | None = None          # elementwise ops `ir/numerics.py` computes: one of NUMERICS_FAMILIES
    shape_op: bool = False               # moves or repeats its operand's lanes without computing on them
    commutative: bool = False            # f(a, b) == f(b, a)
    pointer_lanes: bool = False          # accesses memory lane by lane: pointer, mask, value and result lanes match
    reads_memory: bool = False           # reads global or shared memory (a synchronization op counts as both,
    writes_memory: bool = False          # so that no access moves across it)
    orders_programs: bool = False        # orders memory against other threads at a scope (atomics, acquire
                                         # loads, release stores): a kernel with one may hand data between its
                                         # programs in one launch (the TMA passes fence the async proxy there)

    @property
    def has_regions(self) -> bool:
        return self.regions[1] > 0


NUMERICS_FAMILIES = ("binary", "unary", "math", "compare")      # numerics.binary / unary / math_function / COMPARE
READS, WRITES = dict(reads_memory=True), dict(writes_memory=True)
SYNCHRONIZES = dict(reads_memory=True, writes_memory=True)      # barriers, waits, fences, mbarrier updates


OPS: dict[str, OpDef] = {}


def check_structure(op: Operation) -> None:
    """Operand count, attributes (presence and kind) and region count against the op's definition."""
    opdef = OPS.get(op.name)
    require(opdef is not None, f"unknown op {op.name!r}")
    lo, hi = opdef.operands
    n = len(op.operands)
    count = str(lo) if lo == hi else f"{lo} to {hi}" if hi >= 0 else f"{lo} or more"
    require(n >= lo and (hi < 0 or n <= hi), f"{op.name} takes {count} operands, got {n}")
    for key, kind in opdef.attrs.items():
        require(key in op.attrs, f"{op.name} needs attribute '{key}'")
    allowed = {**opdef.attrs, **opdef.optional_attrs}
    for key, value in op.attrs.items():
        require(key in allowed, f"{op.name} has no attribute '{key}' (allowed: {', '.join(allowed) or 'none'})")
        require(ATTR_KINDS[allowed[key]](value), f"{op.name} attribute '{key}' must be {allowed[key]}, got {value!r}")
    lo, hi = opdef.regions
    require(lo <= len(op.regions) <= hi, f"{op.name} takes {lo if lo == hi else f'{lo} or {hi}'} regions, got {len(op.regions)}")


def define(name: str, doc: str, operands: int | tuple[int, int], **kw) -> OpDef:
    if name in OPS:
        raise RuntimeError(f"op {name!r} defined twice")
    if isinstance(operands, int):
        operands = (operands, operands)
    regions = kw.pop("regions", 0)
    kw["regions"] = (regions, regions) if isinstance(regions, int) else regions
    opdef = OpDef(name, doc, operands, **kw)
    OPS[name] = opdef
    return opdef


def op_names(**traits) -> tuple[str, ...]:
    """Names of the ops whose traits have the given values, in definition order: `op_names(numerics="math")`."""
    return tuple(name for name, opdef in OPS.items()
                 if all(getattr(opdef, trait) == value for trait, value in traits.items()))


def is_lanewise_region(block: Block) -> bool:
    """Whether every op of `block` (nested ones included) is a constant, an elementwise op on scalars or the
    closing `yield`: the region computes each lane on its own, so it may run on whole register arrays."""
    return all((op.name in ("constant", "yield") or OPS[op.name].elementwise)
               and all(isinstance(r.type, ScalarType) for r in op.results)
               for top in block.ops for op in top.walk())


def require(condition: bool, message: str) -> None:
    if not condition:
        raise TypeRuleError(message)


# ---------------------------------------------------------------------------
# Rule helpers

def _same_types(types: list[Type], what: str) -> Type:
    first = types[0]
    for t in types[1:]:
        require(t == first, f"{what} operands must have the same type, got {', '.join(str(x) for x in types)}")
    return first


def _require_dtype(t: Type, ok: Callable[[dt.DType], bool], what: str) -> dt.DType:
    d = scalar_dtype(t)
    require(d is not None and ok(d), f"{what}, got {t}")
    return d


def _is_int_like(d: dt.DType) -> bool:
    return d.is_int or d.is_bool


def _bool_like(t: Type) -> Type:
    return with_element(t, ScalarType(dt.bool_))


def _check_int_scalar(t: Type, what: str) -> None:
    require(isinstance(t, ScalarType) and t.dtype.is_int, f"{what} must be an integer scalar, got {t}")


def _check_mask(mask: Type, like: Type) -> None:
    require(scalar_dtype(mask) == dt.bool_ and shape_of(mask) == shape_of(like),
            f"mask must be bool with shape {shape_of(like)}, got {mask}")


BITWISE_KINDS = ("and", "or", "xor")
ARITHMETIC_KINDS = ("sum", "prod", "add")


def _check_kind_fits_dtype(what: str, kind: str, dtype: dt.DType) -> None:
    """and/or/xor need integers or bool; sum/prod/add need numbers."""
    if kind in BITWISE_KINDS:
        require(_is_int_like(dtype), f"{what} '{kind}' needs integers or bool, got {dtype.name}")
    if kind in ARITHMETIC_KINDS:
        require(not dtype.is_bool, f"{what} '{kind}' needs numbers, not bool")


def _reduced_shape(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    require(0 <= axis < len(shape), f"axis {axis} out of range for shape {shape}")
    return shape[:axis] + shape[axis + 1:]


def _check_combine_region(op: Operation, elem: ScalarType) -> None:
    """A custom reduce/scan region takes (a, b) of the element type and yields one element."""
    region = op.regions[0]
    require([a.type for a in region.args] == [elem, elem],
            f"combine region must take two {elem} arguments, got ({', '.join(str(a.type) for a in region.args)})")
    term = region.terminator
    require(term is not None and term.name == "yield" and [v.type for v in term.operands] == [elem],
            f"combine region must yield one {elem}")


def _yield_types(block: Block) -> list[Type]:
    term = block.terminator
    return [v.type for v in term.operands] if term is not None else []


# ---------------------------------------------------------------------------
# Constants and program ids

def _check_constant(op: Operation) -> None:
    require(len(op.results) == 1, "constant has one result")
    t = op.results[0].type
    d = scalar_dtype(t)
    require(d is not None, f"constant must be a scalar or tile of scalars, got {t}")
    v = op.attrs["value"]
    if d.is_bool:
        require(isinstance(v, bool), f"bool constant needs a bool value, got {v!r}")
    elif d.is_int:
        require(isinstance(v, int) and not isinstance(v, bool), f"integer constant needs an int value, got {v!r}")
        require(d.min_value <= v <= d.max_value, f"constant {v} does not fit in {d.name}")
    else:
        require(isinstance(v, (int, float)) and not isinstance(v, bool), f"float constant needs a number, got {v!r}")


define("constant", "A scalar, or a tile filled with one value.", 0,
       attrs={"value": "scalar"}, check=_check_constant)

for _name in ("program_id", "num_programs"):
    define(_name, f"`{_name}` along grid axis 0, 1 or 2 (i32).", 0, attrs={"axis": "int"},
           infer=lambda ts, a: (require(a["axis"] in (0, 1, 2), f"axis must be 0, 1 or 2, got {a['axis']}"),
                                [ScalarType(dt.i32)])[1])


def _infer_arange(ts, a):
    n = a["end"] - a["start"]
    require(n > 0, f"arange needs end > start, got [{a['start']}, {a['end']})")
    return [TileType(ScalarType(dt.i32), (n,))]


define("arange", "The i32 tile [start, start+1, ..., end-1].", 0,
       attrs={"start": "int", "end": "int"}, infer=_infer_arange)

# ---------------------------------------------------------------------------
# Shape manipulation


def _check_splat(op):
    src, res = op.operands[0].type, op.results[0].type
    require(not isinstance(src, TileType), f"splat takes a scalar, got {src}")
    require(isinstance(res, (TileType, RegsType)) and res.element == src,
            f"splat of {src} must produce a tile (or registers) of {src}, got {res}")


def _check_broadcast(op):
    src, res = op.operands[0].type, op.results[0].type
    require(isinstance(src, TileType) and isinstance(res, TileType), "broadcast maps a tile to a tile")
    require(src.element == res.element, f"broadcast keeps the element type ({src.element} vs {res.element})")
    require(len(src.shape) == len(res.shape) and all(s in (1, r) for s, r in zip(src.shape, res.shape)),
            f"cannot broadcast shape {src.shape} to {res.shape}: each dimension must match or be 1")


def _infer_expand_dims(ts, a):
    t, axis = ts[0], a["axis"]
    shape = shape_of(t)
    require(0 <= axis <= len(shape), f"expand_dims axis {axis} out of range for rank {len(shape)}")
    return [TileType(element_of(t), shape[:axis] + (1,) + shape[axis:])]


def _check_reshape(op):
    src, res = op.operands[0].type, op.results[0].type
    require(isinstance(src, TileType) and isinstance(res, (TileType, ScalarType, PointerType)), "reshape maps a tile")
    require(element_of(src) == element_of(res), "reshape keeps the element type")
    n = res.numel if isinstance(res, TileType) else 1
    require(src.numel == n, f"reshape cannot change the number of elements ({src.shape} -> {shape_of(res)})")


def _infer_permute(ts, a):
    t, order = ts[0], list(a["order"])
    shape = shape_of(t)
    require(sorted(order) == list(range(len(shape))), f"permute order {order} is not a permutation of 0..{len(shape) - 1}")
    return [TileType(element_of(t), tuple(shape[i] for i in order))]


define("splat", "A tile whose every lane holds the scalar operand.", 1, check=_check_splat, shape_op=True)
define("broadcast", "Repeat size-1 dimensions of a tile to the result shape.", 1, check=_check_broadcast,
       shape_op=True)
define("expand_dims", "Insert a size-1 dimension at `axis`.", 1, attrs={"axis": "int"}, infer=_infer_expand_dims,
       shape_op=True)
define("reshape", "Same elements in row-major order, new shape.", 1, check=_check_reshape, shape_op=True)
define("permute", "Transpose dimensions: result dim i is operand dim order[i].", 1,
       attrs={"order": "ints"}, infer=_infer_permute, shape_op=True)

# ---------------------------------------------------------------------------
# Layouts


def _infer_convert_layout(ts, a):
    from .layouts import LayoutError, parse_layout  # (layouts.py imports nothing of the op table)

    t = ts[0]
    require(isinstance(t, TileType), f"convert_layout needs a tile, got {t}")
    try:
        layout = parse_layout(a["layout"])
    except LayoutError as exc:
        raise TypeRuleError(f"convert_layout: {exc}") from None
    require(layout.shape == t.shape,
            f"convert_layout: layout {layout} covers shape {layout.shape}, but the operand is {t}")
    return [t]


# Pure, so CSE merges identical pins and DCE drops unused ones; no other pass looks through it.
define("convert_layout", "The operand unchanged, pinned to the register layout `layout` (ir/layouts.py text).", 1,
       attrs={"layout": "str"}, infer=_infer_convert_layout)

# ---------------------------------------------------------------------------
# Elementwise arithmetic, comparison, bitwise and math

def _arith(ts, a):
    t = _same_types(ts, "arithmetic")
    _require_dtype(t, lambda d: not d.is_bool, "arithmetic needs numbers, not bool")
    return [t]


def _bitwise(ts, a):
    t = _same_types(ts, "bitwise")
    _require_dtype(t, _is_int_like, "bitwise ops need integers or bool")
    return [t]


def _integer_operands(ts, what: str):
    t = _same_types(ts, what)
    _require_dtype(t, lambda d: d.is_int, f"{what} needs integers")
    return [t]


def _shift(ts, a):
    return _integer_operands(ts, "shift")


def _float_unary(ts, a):
    _require_dtype(ts[0], lambda d: d.is_float, "math functions need floating-point operands")
    return [ts[0]]


def _numeric_unary(ts, a):
    _require_dtype(ts[0], lambda d: not d.is_bool, "needs a number, not bool")
    return [ts[0]]


def _infer_not(ts, a):
    _require_dtype(ts[0], _is_int_like, "`not` needs an integer or bool")
    return [ts[0]]


BINARY_ARITH = {
    "add": "a + b", "sub": "a - b", "mul": "a * b",
    "div": "a / b; integers truncate toward zero",
    "rem": "remainder with the sign of a (C fmod / %)",
    "min": "smaller of a and b (a NaN operand yields the other)",
    "max": "larger of a and b (a NaN operand yields the other)",
}
COMMUTATIVE = ("add", "mul", "min", "max", "and", "or", "xor")
LANEWISE = dict(elementwise=True)       # the traits every lane-by-lane op below has
for _name, _doc in BINARY_ARITH.items():
    define(_name, _doc, 2, infer=_arith, numerics="binary", commutative=_name in COMMUTATIVE, **LANEWISE)
for _name, _doc in {"and": "bitwise/logical and", "or": "bitwise/logical or", "xor": "bitwise/logical xor"}.items():
    define(_name, _doc, 2, infer=_bitwise, numerics="binary", commutative=True, **LANEWISE)
define("umulhi", "the high half of the 2N-bit product of N-bit integers a and b, their bits read as unsigned",
       2, infer=lambda ts, a: _integer_operands(ts, "umulhi"), numerics="binary", commutative=True, **LANEWISE)
define("shl", "a << b (b >= bits gives 0)", 2, infer=_shift, numerics="binary", **LANEWISE)
define("shr", "a >> b: arithmetic for signed, logical for unsigned integers", 2, infer=_shift, numerics="binary",
       **LANEWISE)

COMPARE_PREDICATES = ("eq", "ne", "lt", "le", "gt", "ge")


def _infer_cmp(ts, a):
    t = _same_types(ts, "comparison")
    require(a["pred"] in COMPARE_PREDICATES, f"cmp predicate must be one of {COMPARE_PREDICATES}, got {a['pred']!r}")
    require(scalar_dtype(t) is not None, f"cmp needs scalars or tiles of scalars, got {t}")
    return [_bool_like(t)]


define("cmp", "Elementwise comparison; result is bool.", 2, attrs={"pred": "str"}, infer=_infer_cmp,
       numerics="compare", **LANEWISE)

define("neg", "-a", 1, infer=_numeric_unary, numerics="unary", **LANEWISE)
define("abs", "|a|", 1, infer=_numeric_unary, numerics="unary", **LANEWISE)
define("not", "bitwise not (logical not for bool)", 1, infer=_infer_not, numerics="unary", **LANEWISE)

MATH_FUNCTIONS = {
    "exp": "e**a", "exp2": "2**a", "log": "natural logarithm", "log2": "base-2 logarithm",
    "sqrt": "square root", "rsqrt": "1 / sqrt(a)", "sin": "sine", "cos": "cosine",
    "tanh": "hyperbolic tangent", "erf": "error function", "sigmoid": "1 / (1 + exp(-a))",
    "floor": "round toward -inf", "ceil": "round toward +inf",
}
for _name, _doc in MATH_FUNCTIONS.items():
    define(_name, _doc, 1, infer=_float_unary, numerics="math", **LANEWISE)


def _infer_select(ts, a):
    cond, x, y = ts
    require(x == y, f"select branches must have the same type, got {x} and {y}")
    require(scalar_dtype(cond) == dt.bool_ and shape_of(cond) == shape_of(x),
            f"select condition must be bool with shape {shape_of(x)}, got {cond}")
    return [x]


define("select", "cond ? a : b, lane by lane.", 3, infer=_infer_select, **LANEWISE)


def _check_cast(op):
    src, res = op.operands[0].type, op.results[0].type
    require(shape_of(src) == shape_of(res), f"cast keeps the shape ({src} -> {res})")
    require(scalar_dtype(src) is not None and scalar_dtype(res) is not None,
            f"cast converts between data types, not pointers ({src} -> {res})")


def _check_bitcast(op):
    src, res = op.operands[0].type, op.results[0].type
    require(shape_of(src) == shape_of(res), f"bitcast keeps the shape ({src} -> {res})")
    s, r = scalar_dtype(src), scalar_dtype(res)
    require(s is not None and r is not None and s.bits == r.bits,
            f"bitcast needs data types of equal width ({src} -> {res})")


define("cast", "Convert values to the result dtype (round-to-nearest-even, saturating float->int).", 1,
       check=_check_cast, **LANEWISE)
define("bitcast", "Reinterpret the bits of each lane as the result dtype.", 1, check=_check_bitcast, **LANEWISE)

# ---------------------------------------------------------------------------
# Pointers and memory


def _infer_addptr(ts, a):
    p, off = ts
    require(isinstance(element_of(p), PointerType), f"addptr needs a pointer (or tile of pointers), got {p}")
    _require_dtype(off, lambda d: d.is_int, "addptr offset must be an integer")
    require(shape_of(p) == shape_of(off), f"addptr operands must have the same shape, got {p} and {off}")
    return [p]


def _infer_load(ts, a):
    p = ts[0]
    elem = element_of(p)
    require(isinstance(elem, PointerType), f"load needs a pointer (or tile of pointers), got {p}")
    result = with_element(p, ScalarType(elem.pointee))
    if len(ts) > 1:
        _check_mask(ts[1], p)
    if len(ts) > 2:
        require(ts[2] == result, f"load's `other` must have type {result}, got {ts[2]}")
    return [result]


def _infer_store(ts, a):
    p, v = ts[0], ts[1]
    elem = element_of(p)
    require(isinstance(elem, PointerType), f"store needs a pointer (or tile of pointers), got {p}")
    want = with_element(p, ScalarType(elem.pointee))
    require(v == want, f"store of {v} through {p}: the value must be {want}")
    if len(ts) > 2:
        _check_mask(ts[2], p)
    return []


ATOMIC_KINDS = ("add", "max", "min", "and", "or", "xor", "xchg")


def _infer_atomic_rmw(ts, a):
    require(a["kind"] in ATOMIC_KINDS, f"atomic kind must be one of {ATOMIC_KINDS}, got {a['kind']!r}")
    _infer_store(ts, a)
    _check_kind_fits_dtype("atomic", a["kind"], scalar_dtype(ts[1]))
    return [ts[1]]


def _infer_atomic_cas(ts, a):
    p, cmp, val = ts
    _infer_store([p, val], a)
    require(cmp == val, f"atomic_cas compare and value must have the same type, got {cmp} and {val}")
    return [val]


define("addptr", "Pointer plus element offset, lane by lane.", 2, infer=_infer_addptr, **LANEWISE)
# `vector` (thread IR): registers go in groups of `vector` whose addresses are
# consecutive and aligned to the group's size, with one mask value per group,
# so each group is one wide access.
define("load", "Read through pointers; masked-off lanes yield `other` (zero if absent).", (1, 3),
       optional_attrs={"vector": "int"}, infer=_infer_load, pure=False, pointer_lanes=True, reads_memory=True)
define("store", "Write through pointers; masked-off lanes are not written.", (2, 3),
       optional_attrs={"vector": "int"}, infer=_infer_store, pure=False, pointer_lanes=True, writes_memory=True)
READ_MODIFY_WRITE = dict(pure=False, pointer_lanes=True, reads_memory=True, writes_memory=True, orders_programs=True)
# The scope of an ordered access or atomic: which threads it orders against (and, for an atomic, is atomic
# against). Narrowest first: the block ("cta"), its thread-block cluster, the whole GPU (the default, meant when
# the attribute is absent) and the system (the host and peer GPUs too). An access synchronizes with another only
# when each one's scope holds the other's thread: a "cta" release and acquire of two blocks do not.
SCOPES = ("cta", "cluster", "gpu", "sys")
DEFAULT_SCOPE = "gpu"
SCOPED = {"scope": "str"}


def scope_of(op) -> str:
    """The scope of an ordered access or atomic (`SCOPES`); "gpu" when the op has no `scope` attribute."""
    return op.attrs.get("scope", DEFAULT_SCOPE)


def _check_scope(name: str, a) -> None:
    scope = a.get("scope", DEFAULT_SCOPE)
    require(scope in SCOPES, f"{name} scope must be one of {SCOPES}, got {scope!r}")


def _infer_ordered_load(ts, a):
    _check_whole_bytes("load_acquire", element_of(ts[0]))
    _check_scope("load_acquire", a)
    return _infer_load(ts, a)


def _infer_ordered_store(ts, a):
    _check_whole_bytes("store_release", element_of(ts[0]))
    _check_scope("store_release", a)
    return _infer_store(ts, a)


def _infer_scoped_rmw(ts, a):
    _check_scope("atomic_rmw", a)
    return _infer_atomic_rmw(ts, a)


def _infer_scoped_cas(ts, a):
    _check_scope("atomic_cas", a)
    return _infer_atomic_cas(ts, a)


def _check_whole_bytes(name: str, pointer) -> None:
    require(isinstance(pointer, PointerType), f"{name} needs a pointer (or tile of pointers), got {pointer}")
    require(not pointer.pointee.is_subbyte, f"{name} through a pointer to packed {pointer.pointee.name} elements: "
                                            f"an ordered access is one whole element of 8 bits or more")


# The ordered accesses (`tessera.load(..., sem="acquire")`, `tessera.store(..., sem="release")`) at their `scope`
# (GPU by default), one register at a time (never vectorized): ld.acquire.<scope> / st.release.<scope> on NVIDIA,
# the atomic load and store at the scope's syncscope on AMD. How programs of one launch hand data to each other
# without a read-modify-write.
define("load_acquire", "Read through pointers with acquire ordering at `scope` (default GPU): this program's later "
       "accesses see what another thread of the scope wrote before a release (a release store, an atomic) that "
       "this read observes. Masked-off lanes are not read and yield `other` (zero if absent).", (1, 3),
       optional_attrs=SCOPED, infer=_infer_ordered_load, pure=False, pointer_lanes=True, reads_memory=True,
       orders_programs=True)
define("store_release", "Write through pointers with release ordering at `scope` (default GPU): a thread of the "
       "scope whose acquire (a load_acquire, an atomic) reads the value sees every write made before it. "
       "Masked-off lanes are not written.", (2, 3), optional_attrs=SCOPED, infer=_infer_ordered_store, pure=False,
       pointer_lanes=True, writes_memory=True, orders_programs=True)
define("atomic_rmw", "Atomically combine `value` into memory (acquire-release at `scope`, default GPU); returns the "
       "old values.", (2, 3), attrs={"kind": "str"}, optional_attrs=SCOPED, infer=_infer_scoped_rmw,
       **READ_MODIFY_WRITE)
define("atomic_cas", "Atomic compare-and-swap (acquire-release at `scope`, default GPU); returns the old values.", 3,
       optional_attrs=SCOPED, infer=_infer_scoped_cas, **READ_MODIFY_WRITE)


def _infer_make_view(ts, a):
    require(len(ts) % 2 == 1 and len(ts) >= 3, "make_view takes a base pointer, then a size and a stride per dimension")
    base = ts[0]
    require(isinstance(base, PointerType), f"make_view base must be a scalar pointer, got {base}")
    for t in ts[1:]:
        _check_int_scalar(t, "view sizes and strides")
    return [ViewType(base.pointee, (len(ts) - 1) // 2)]


def _check_view_access(view: Type, offsets: list[Type], op_name: str) -> ViewType:
    require(isinstance(view, ViewType), f"{op_name} needs a view, got {view}")
    require(len(offsets) == view.rank, f"{op_name} on a rank-{view.rank} view needs {view.rank} offsets, got {len(offsets)}")
    for t in offsets:
        _check_int_scalar(t, f"{op_name} offsets")
    return view


def _infer_view_load(ts, a):
    view = _check_view_access(ts[0], ts[1:], "view_load")
    shape = tuple(a["shape"])
    require(len(shape) == view.rank, f"view_load block shape {shape} must have rank {view.rank}")
    fill = a.get("fill", 0)
    require(view.dtype.is_float or float(fill).is_integer(),
            f"view_load fill {fill!r} is not a value of {view.dtype.name}")
    return [TileType(ScalarType(view.dtype), shape)]


def _infer_view_store(ts, a):
    view = _check_view_access(ts[0], ts[1:-1], "view_store")
    value = ts[-1]
    require(isinstance(value, TileType) and value.element == ScalarType(view.dtype) and len(value.shape) == view.rank,
            f"view_store of {value} into {view}: the value must be a rank-{view.rank} tile of {view.dtype.name}")
    return []


define("make_view", "A strided tensor view: base pointer, sizes..., strides... (in elements).", (3, -1),
       infer=_infer_make_view)
define("view_load", "Load the block at element offsets; lanes outside the view read `fill` (default 0). "
       "`multicast`: every block of the kernel's cluster loads this same block here (a promise the interpreter "
       "checks), so a TMA pipeline may load it once per cluster (`passes/schedule/multicast.py`).", (2, -1),
       attrs={"shape": "ints"}, optional_attrs={"fill": "number", "multicast": "bool"}, infer=_infer_view_load,
       pure=False, reads_memory=True)
define("view_store", "Store a block at element offsets; lanes outside the view are not written.", (3, -1),
       infer=_infer_view_store, pure=False, writes_memory=True)

# ---------------------------------------------------------------------------
# Reductions, scans and dot

REDUCE_KINDS = ("sum", "prod", "max", "min", "and", "or", "xor", "custom")
SCAN_KINDS = ("sum", "prod", "max", "min", "custom")
ARG_REDUCE_KINDS = ("argmax", "argmin")


def _check_reduce(op):
    src = op.operands[0].type
    require(isinstance(src, TileType), f"reduce needs a tile, got {src}")
    kind = op.attrs["kind"]
    require(kind in REDUCE_KINDS, f"reduce kind must be one of {REDUCE_KINDS}, got {kind!r}")
    if isinstance(src.element, ScalarType):
        _check_kind_fits_dtype("reduce", kind, src.element.dtype)
    want = with_shape(src.element, _reduced_shape(src.shape, op.attrs["axis"]))
    require([r.type for r in op.results] == [want], f"reduce result must be {want}")
    require(len(op.regions) == (1 if kind == "custom" else 0), "only a custom reduce has a combine region")
    if kind == "custom":
        _check_combine_region(op, src.element)


def _infer_arg_reduce(ts, a):
    src = ts[0]
    require(isinstance(src, TileType), f"arg_reduce needs a tile, got {src}")
    require(a["kind"] in ARG_REDUCE_KINDS, f"arg_reduce kind must be one of {ARG_REDUCE_KINDS}")
    return [with_shape(ScalarType(dt.i32), _reduced_shape(src.shape, a["axis"]))]


def _check_scan(op):
    src = op.operands[0].type
    require(isinstance(src, TileType), f"scan needs a tile, got {src}")
    _reduced_shape(src.shape, op.attrs["axis"])
    kind = op.attrs["kind"]
    require(kind in SCAN_KINDS, f"scan kind must be one of {SCAN_KINDS}, got {kind!r}")
    if isinstance(src.element, ScalarType):
        _check_kind_fits_dtype("scan", kind, src.element.dtype)
    require([r.type for r in op.results] == [src], f"scan result must be {src}")
    require(len(op.regions) == (1 if kind == "custom" else 0), "only a custom scan has a combine region")
    if kind == "custom":
        _check_combine_region(op, src.element)


def _infer_dot(ts, a):
    x, y, acc = ts
    for t in ts:
        require(isinstance(t, TileType) and len(t.shape) == 2 and isinstance(t.element, ScalarType),
                f"dot operands must be 2-D tiles, got {t}")
    require(x.element == y.element, f"dot inputs must have the same dtype, got {x.element} and {y.element}")
    require(not any(t.element.dtype.is_bool for t in ts), f"dot needs numbers, not bool, got {ts}")
    (m, k), (k2, n) = x.shape, y.shape
    require(k == k2, f"dot inner dimensions differ: {x.shape} @ {y.shape}")
    require(acc.shape == (m, n), f"dot accumulator must be {m}x{n}, got {acc.shape}")
    precision = a.get("input_precision")
    require(precision in (None,) + DOT_INPUT_PRECISIONS,
            f"dot input_precision must be one of {DOT_INPUT_PRECISIONS}, got {precision!r}")
    return [acc]


DOT_INPUT_PRECISIONS = ("ieee", "tf32")


define("reduce", "Combine a tile along `axis` (kind sum/prod/max/min/and/or/xor, or a custom region).", 1,
       attrs={"axis": "int", "kind": "str"}, regions=(0, 1), check=_check_reduce)
define("arg_reduce", "Index (i32) of the max/min along `axis`; ties pick the smallest index.", 1,
       attrs={"axis": "int", "kind": "str"}, infer=_infer_arg_reduce)
define("scan", "Inclusive prefix combine along `axis`, optionally from the end.", 1,
       attrs={"axis": "int", "kind": "str"}, optional_attrs={"reverse": "bool"}, regions=(0, 1), check=_check_scan)
define("dot", "acc + a @ b, accumulating in acc's dtype.", 3, optional_attrs={"input_precision": "str"},
       infer=_infer_dot)

# ---------------------------------------------------------------------------
# Structured control flow


def _check_for(op):
    lb, ub, step, *inits = [v.type for v in op.operands]
    for t in (lb, ub, step):
        _check_int_scalar(t, "for bounds and step")
    require(lb == ub == step, f"for bounds and step must share one integer type, got {lb}, {ub}, {step}")
    require(len(op.regions) == 1, "for has one body region")
    body = op.regions[0]
    require([a.type for a in body.args] == [lb, *inits],
            f"for body must take ({', '.join(str(t) for t in [lb, *inits])}): the induction variable, then the carried values")
    require(_yield_types(body) == inits, "for body must yield the carried values' types")
    require([r.type for r in op.results] == inits, "for results must have the carried values' types")
    stages = op.attrs.get("stages", 1)
    require(stages >= 1, f"for stages (software-pipelining depth) must be >= 1, got {stages}")


def _check_if(op):
    cond = op.operands[0].type
    require(cond == ScalarType(dt.bool_), f"if condition must be a bool scalar, got {cond}")
    require(len(op.regions) == 2, "if has a then region and an else region")
    results = [r.type for r in op.results]
    for name, region in zip(("then", "else"), op.regions):
        require(not region.args, f"if {name} region takes no arguments")
        require(_yield_types(region) == results, f"if {name} region must yield ({', '.join(map(str, results))})")


def _check_while(op):
    inits = [v.type for v in op.operands]
    require(len(op.regions) == 2, "while has a before (condition) region and an after (body) region")
    before, after = op.regions
    require([a.type for a in before.args] == inits, "while condition region must take the carried values")
    cond = before.terminator
    require(cond is not None and cond.name == "condition", "while condition region must end in `condition`")
    passed = [v.type for v in cond.operands[1:]]
    require([a.type for a in after.args] == passed, "while body must take the values passed by `condition`")
    require(_yield_types(after) == inits, "while body must yield the carried values' types")
    require([r.type for r in op.results] == passed, "while results are the values passed by `condition`")


def _check_condition(op):
    require(op.operands and op.operands[0].type == ScalarType(dt.bool_), "condition's first operand must be a bool scalar")


define("for", "for iv in range(lb, ub, step), threading carried values through the body; `stages` (>= 1; "
       "1: a plain loop; absent: the lowering's choice, pipelined when it feeds a dot and may be): how deep the "
       "lowering may software-pipeline the body's global -> shared copies; "
       "`warp_specialize`: a producer warpgroup makes those copies (TMA targets); `pingpong` (with it): two "
       "consumer warpgroups take turns issuing their wgmmas; without it (AMD, stages = 1): two programs' wave "
       "groups run the loop one s_barrier apart (`passes/wave_pingpong.py`); `pingpong_turn` (thread IR: [my barrier, the "
       "other's]): this copy of such a loop is one warpgroup's.", (3, -1),
       optional_attrs={"stages": "int", "warp_specialize": "bool", "pingpong": "bool", "pingpong_turn": "ints"},
       regions=1, check=_check_for, pure=False)
define("if", "Run the then or else region; results are what the taken region yields. `producer_joins_at` "
       "(thread IR, warp-specialized kernels): the then region is a producer warpgroup running beside the "
       "else region, and its shared-memory accesses are over once the else region's op of that index is.", 1,
       optional_attrs={"producer_joins_at": "int"}, regions=2, check=_check_if, pure=False)
define("while", "Loop while the condition region's `condition` is true.", (0, -1),
       regions=2, check=_check_while, pure=False)
define("yield", "End a region, passing values to the parent op.", (0, -1), infer=lambda ts, a: [], terminator=True,
       pure=False)
define("condition", "End a while's condition region: (keep going?, values for the body or the results).", (1, -1),
       infer=lambda ts, a: [], check=_check_condition, terminator=True, pure=False)
define("return", "End the kernel.", 0, infer=lambda ts, a: [], terminator=True, pure=False)



def _infer_nanosleep(ts, a):
    require(ts[0] == ScalarType(dt.i32), f"nanosleep takes an i32 scalar (nanoseconds), got {ts[0]}")
    return []


# A hint, as on the hardware: the thread sleeps about that long (NVIDIA: within [0, 2 * ns], at most 1 ms).
define("nanosleep", "Sleep about `ns` nanoseconds (a spin-wait's backoff): nanosleep.u32 on NVIDIA, s_sleep on "
       "AMD, nothing on the CPU.", 1, infer=_infer_nanosleep, pure=False)

# ---------------------------------------------------------------------------
# Debugging

define("print", "Print a prefix and the operands (debug builds; the interpreter prints always).", (0, -1),
       attrs={"prefix": "str"}, infer=lambda ts, a: [], pure=False)
define("assert", "Fail the launch with `message` where any lane of the condition is false.", 1,
       attrs={"message": "str"}, infer=lambda ts, a: (_check_mask(ts[0], ts[0]), [])[1], pure=False)
define("breakpoint", "Stop in the CPU interpreter with the named operands as local variables (no-op on GPUs).",
       (0, -1), attrs={"names": "strs"},
       infer=lambda ts, a: (require(len(a["names"]) == len(ts), "breakpoint needs one name per operand"), [])[1],
       pure=False)


# Thread-level ops live in their own file and register into OPS on import.
from . import thread_ops  # noqa: E402,F401
from . import bulk_async_ops, cluster_ops, warpgroup_ops  # noqa: E402,F401
from . import shared_ops  # noqa: E402,F401
from . import warp_specialization_ops  # noqa: E402,F401
from . import wave_schedule_ops  # noqa: E402,F401
from . import low_bit_ops  # noqa: E402,F401
from . import hint_ops  # noqa: E402,F401
from . import pointer_ops  # noqa: E402,F401
from . import asm_ops  # noqa: E402,F401
