"""Transfer functions of the alignment analysis: sources, shape ops, select, casts and pointers.

A rule maps an op, its operands' facts (`alignment_lattice`) and its result
shape to the result's facts. The rules of integer arithmetic and comparisons
are in `alignment_arith`; `alignment.analyze` uses both tables.

Sources
-------
| value                                | C     | D                       | K   |
| ------------------------------------ | ----- | ----------------------- | --- |
| constant c (exact: `constant`)       | 1     | pow2 divisor of c       | dim |
| kernel arg listed in divisible_by_16 | -     | 16 (pointers: 16 bytes) | -   |
| other args, program_id, load, dot    | 1     | 1                       | 1   |
| arange(s, e)                         | e - s | pow2 divisor of s       | 1   |
| for's iv = lb + k * step             | -     | min(E_lb, E_step)       | -   |
| make_view: a ViewInfo of base bytes, size and stride divisibility, unit strides |   |

(Arguments, loads, dots and induction variables get theirs from the walk in
`alignment.py`.)

Transfer functions, per dim:

| op                          | C                               | D (at C groups)        | K                        |
| --------------------------- | ------------------------------- | ---------------------- | ------------------------ |
| splat; broadcast's new dims | 1                               | E                      | dim                      |
| expand_dims, permute        | moved (new dim: 1)              | moved (new dim: E)     | moved (new dim: 1)       |
| reshape                     | kept if only 1-dims move        | E otherwise            | as C                     |
| select c, x, y              | min(K_c, C_x, C_y)              | min of x and y         | min(K_c, K_x, K_y)       |
| cast, bitcast int -> int    | kept if values are kept         | kept (wraps keep it)   | kept                     |
| addptr p, off               | max(min(K_p,C_o), min(C_p,K_o)) | min(D_p, D_o * bytes)  | min(K_p, K_o)            |
| int_to_ptr, ptr_to_int      | 1 (runs of bytes are not runs   | every lane's (bytes =  | kept                     |
|                             | of elements)                    | address units)         |                          |
"""

from __future__ import annotations

from typing import Callable

from tessera.ir.core import Operation
from tessera.ir.dtypes import DType
from tessera.ir.types import element_of, shape_of

from .alignment_lattice import (
    MAX_DIVISIBILITY, AxisInfo, ViewInfo, constant_info, group_cap, make_info, pow2_divisor, unknown,
)

# ---------------------------------------------------------------------------
# The tables of rules: rule(op, operand facts, result shape) -> AxisInfo

Rule = Callable[[Operation, list, tuple], AxisInfo | None]


def registrar(table: dict[str, Rule]) -> Callable:
    """A decorator `@rule("add", "sub")` that files the function in `table` under those op names."""
    def rule(*names: str):
        def register(fn: Rule) -> Rule:
            for name in names:
                table[name] = fn
            return fn
        return register
    return rule


RULES: dict[str, Rule] = {}
_rule = registrar(RULES)


# ---------------------------------------------------------------------------
# Helpers shared with `alignment_arith`


def operand_dtype(op: Operation) -> DType:
    return element_of(op.operands[0].type).dtype


def wrap(value: int, dtype: DType) -> int:
    """`value` as the IR computes it in `dtype` (two's complement wrap-around; bool is 0 or 1)."""
    if dtype.is_bool:
        return int(value != 0)
    modulus = 1 << dtype.bits
    value %= modulus
    return value - modulus if dtype.is_signed and value >= modulus // 2 else value


def min_constancy(*infos: AxisInfo) -> list[int]:
    return [min(x.constancy[d] for x in infos) for d in range(infos[0].rank)]


# ---------------------------------------------------------------------------
# Sources


@_rule("constant")
def _constant(op, args, shape):
    value = op.attrs["value"]
    return constant_info(shape, int(value)) if isinstance(value, (bool, int)) else None


@_rule("program_id", "num_programs", "cluster_rank", "cluster_id")
def _program_id(op, args, shape):
    return unknown(shape, nonnegative=True)


@_rule("arange")
def _arange(op, args, shape):
    start, n = op.attrs["start"], shape[0]
    c = group_cap(n)
    d = pow2_divisor(start) if c == n else min(pow2_divisor(start), c)  # groups after the first start c apart
    if n == 1:
        return constant_info(shape, start)
    return make_info(shape, (c,), (d,), (1,), 1, None, start >= 0)


@_rule("make_view")
def _make_view(op, args, shape):
    base, *rest = args
    rank = len(rest) // 2
    sizes, strides = rest[:rank], rest[rank:]
    return ViewInfo(base.element_divisibility, tuple(s.element_divisibility for s in sizes),
                    tuple(s.element_divisibility for s in strides), tuple(s.constant == 1 for s in strides))


# ---------------------------------------------------------------------------
# Shape ops


@_rule("splat")
def _splat(op, args, shape):
    (x,) = args
    e = x.element_divisibility
    return make_info(shape, (1,) * len(shape), (e,) * len(shape), tuple(map(group_cap, shape)), e,
                     x.constant, x.nonnegative, x.pointee_bits)


@_rule("broadcast")
def _broadcast(op, args, shape):
    (x,) = args
    src = shape_of(op.operands[0].type)
    K = [group_cap(r) if s == 1 else k for s, r, k in zip(src, shape, x.constancy)]
    return make_info(shape, x.contiguity, x.divisibility, K, x.element_divisibility, x.constant,
                     x.nonnegative, x.pointee_bits)


@_rule("expand_dims")
def _expand_dims(op, args, shape):
    (x,) = args
    axis = op.attrs["axis"]

    def insert(values, new):
        return values[:axis] + (new,) + values[axis:]
    return make_info(shape, insert(x.contiguity, 1), insert(x.divisibility, x.element_divisibility),
                     insert(x.constancy, 1), x.element_divisibility, x.constant, x.nonnegative, x.pointee_bits)


@_rule("permute")
def _permute(op, args, shape):
    (x,) = args
    order = op.attrs["order"]
    C, D, K = ([values[i] for i in order] for values in (x.contiguity, x.divisibility, x.constancy))
    return make_info(shape, C, D, K, x.element_divisibility, x.constant, x.nonnegative, x.pointee_bits)


@_rule("reshape")
def _reshape(op, args, shape):
    """Exact when only size-1 dims come or go; otherwise only what holds of every lane survives."""
    (x,) = args
    src = shape_of(op.operands[0].type)
    kept = [d for d, s in enumerate(src) if s != 1]
    if x.constant is None and [src[d] for d in kept] == [s for s in shape if s != 1]:
        C, D, K, it = [], [], [], iter(kept)
        for size in shape:
            d = next(it) if size != 1 else None
            C.append(1 if d is None else x.contiguity[d])
            D.append(x.element_divisibility if d is None else x.divisibility[d])
            K.append(1 if d is None else x.constancy[d])
        return make_info(shape, C, D, K, x.element_divisibility, None, x.nonnegative, x.pointee_bits)
    ones = (1,) * len(shape)
    return make_info(shape, ones, (x.element_divisibility,) * len(shape), ones, x.element_divisibility,
                     x.constant, x.nonnegative, x.pointee_bits)


# ---------------------------------------------------------------------------
# Select, casts and pointer arithmetic


@_rule("select")
def _select(op, args, shape):
    cond, x, y = args
    if cond.constant is not None:
        return x if cond.constant else y
    C = [min(cond.constancy[d], x.contiguity[d], y.contiguity[d]) for d in range(len(shape))]
    D = [min(x.divisibility_at(d, c), y.divisibility_at(d, c)) for d, c in enumerate(C)]
    constant = x.constant if x.constant is not None and x.constant == y.constant else None
    return make_info(shape, C, D, min_constancy(cond, x, y), min(x.element_divisibility, y.element_divisibility),
                     constant, x.nonnegative and y.nonnegative, x.pointee_bits)


@_rule("convert_layout")
def _convert_layout(op, args, shape):
    """A layout pin moves values between threads; the values themselves, and so every fact, are unchanged."""
    return args[0]


@_rule("cast", "bitcast")
def _cast(op, args, shape):
    (a,) = args
    if a is None:            # from a float: nothing is known
        return unknown(shape)
    src, dst = operand_dtype(op), element_of(op.result.type).dtype
    if a.constant is not None and (op.name == "cast" or src.is_int):
        value = a.constant if op.name == "cast" else a.constant % (1 << src.bits)
        return constant_info(shape, wrap(value, dst))
    if dst.is_bool:
        return make_info(shape, (1,) * len(shape), (1,) * len(shape), a.constancy, 1, None, True)
    if src.is_bool or src == dst:
        return a
    # Wrapping keeps divisibility and equal values; only a value-preserving cast keeps runs and signs.
    same_values = op.name == "cast" and dst.bits > src.bits and (src.kind == "uint" or dst.kind == "int")
    C = a.contiguity if same_values else (1,) * len(shape)
    D = [a.divisibility_at(d, c) for d, c in enumerate(C)]
    return make_info(shape, C, D, a.constancy, a.element_divisibility, None, same_values and a.nonnegative)


def _offset_bytes(divisibility: int, bits: int) -> int:
    """Bytes divisibility of an offset of `divisibility` elements of `bits` bits each."""
    return max(1, min(divisibility * (bits & -bits) // 8, MAX_DIVISIBILITY))


@_rule("addptr")
def _addptr(op, args, shape):
    p, off = args
    bits = element_of(op.result.type).pointee.bits
    C, D = [], []
    for d in range(len(shape)):
        c = max(min(p.constancy[d], off.contiguity[d]), min(p.contiguity[d], off.constancy[d]))
        C.append(c)
        D.append(min(p.divisibility_at(d, c), _offset_bytes(off.divisibility_at(d, c), bits)))
    e = min(p.element_divisibility, _offset_bytes(off.element_divisibility, bits))
    return make_info(shape, C, D, min_constancy(p, off), e, pointee_bits=bits)


@_rule("int_to_ptr", "ptr_to_int")
def _address(op, args, shape):
    """An address and its pointer divide by the same powers of two (both count bytes); equal lanes stay equal."""
    (a,) = args
    result = element_of(op.result.type)
    bits = getattr(result, "pointee", None)
    D = [a.divisibility_at(d, 1) for d in range(len(shape))]
    return make_info(shape, (1,) * len(shape), D, a.constancy, a.element_divisibility,
                     pointee_bits=bits.bits if bits is not None else 0)
