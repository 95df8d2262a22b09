"""Alignment analysis: divisibility, contiguity and constancy of integer and pointer values, per tile dimension.

What the vectorizer and the memory lowering need to know about an address
tile is how many lanes in a row hit consecutive, suitably aligned addresses
under one mask bit. This analysis (Triton's AxisInfo, made sound for C
division and for regrouped runs) computes, for every SSA value of integer,
bool or pointer type, an `AxisInfo`; for views, a `ViewInfo`.

    facts = analyze(fn)                            # {Value: AxisInfo | ViewInfo}
    access_width(facts, load_op)                   # lanes one vector access may move
    vector_width(facts[ptr], 32), mask_constancy(facts[mask])

The facts (per dimension d of a tile; a scalar has only `element_divisibility`)
-------------------------------------------------------------------------------
Along d the lanes fall into aligned groups: indices [k*G, (k+1)*G). For every
lane index i (other coordinates fixed):

* contiguity C: within each aligned group of C lanes, each value is the
  previous plus one step (1 for integers, one element for pointers);
* divisibility D: the value at every lane with i[d] % C == 0 (each group's
  first lane) is divisible by D. With C == 1 that is every lane. Integers
  count in units, pointers in BYTES (a pointer to f32 element k of a
  16-byte aligned array has divisibility gcd(16, 4k));
* constancy K: within each aligned group of K lanes all values are equal;
* element_divisibility E: divides every lane (for a scalar: the value);
* constant: the exact value when every lane holds it; nonnegative: every
  lane is >= 0 (this is what makes C-style `div`/`rem` facts sound).

All of C, K, D and E are powers of two. C and K are at most the largest
power of two dividing the dimension; D and E are capped at
MAX_DIVISIBILITY (2**12), so 0 is "divisible by 4096". A group of g < C
lanes of a run starts g steps apart, so its first value is divisible by
min(D, g steps) (`AxisInfo.divisibility_at`); rules use that whenever they
regroup, which Triton's rules do not (they claim 132 divisible by 128 for
[0, 1, 2, 3] + [128]*4 regrouped in fours).

Facts hold for the values as computed in the IR's fixed-width types:
divisibility and constancy survive wrap-around, contiguity and
nonnegativity assume that index arithmetic does not overflow.

Lattice: per dim, C, D, K and E form chains of powers of two; a fact is
weaker when smaller, and 1 (`unknown`) is the bottom. The join (`join`)
of two facts at a control-flow merge keeps what both guarantee:
C = min, K = min, D = min of `divisibility_at(d, C)` of both, E = min,
constant if equal, nonnegative if both.

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

Transfer functions, per dim. "run(a|b)" is the largest g <= min(C_a, K_b)
such that a's values g lanes apart and b's value are divisible by g: each
aligned group of g lanes of the run a then lies between two consecutive
multiples of g, so `a < b`, `a / b` (a >= 0) and `a >> k` are constant on
it and `a % b` (a >= 0) is a run on it. div1(x) divides every lane of x.

| op                          | C                               | D (at C groups)        | K                        |
| --------------------------- | ------------------------------- | ---------------------- | ------------------------ |
| splat; broadcast's new dims | 1                               | E                      | dim                      |
| expand_dims, permute        | moved (new dim: 1)              | moved (new dim: E)     | moved (new dim: 1)       |
| reshape                     | kept if only 1-dims move        | E otherwise            | as C                     |
| add a, b                    | max(min(C_a,K_b), min(K_a,C_b)) | min of a and b         | min(K_a, K_b)            |
| sub a, b                    | min(C_a, K_b)                   | min of a and b         | min(K); min(C) if 2 runs |
| mul a, b                    | C_a if b == 1, else 1           | div1(a) * div1(b)      | min(K_a, K_b)            |
| div a, b                    | C_a if b == 1, else 1           | div1(a) / b, b = +-2^k | min(K); run(a|b) if a>=0 |
| rem a, b                    | run(a|b) if a >= 0              | min of a and b         | min(K_a, K_b)            |
| shl a, k / shr a, k         | as mul / div by 2^k             | (shr rounds down:      | runs need no sign)       |
| and a, 2^k - 1              | run(a|2^k): floor modulo        | min(D_a, 2^k)          | K_a                      |
| and a, -2^k                 | 1                               | max(div1(a), 2^k)      | run(a|2^k)               |
| and (other)                 | 1                               | max(div1(a), div1(b))  | min(K_a, K_b)            |
| or, xor, min, max, neg, abs | 1                               | min(div1(a), div1(b))  | min(K)                   |
| not                         | 1                               | 1                      | K_a                      |
| cmp lt, ge (gt, le: b, a)   | 1                               | 1                      | min(K); run(a|b); 2 runs |
| cmp eq, ne                  | 1                               | 1                      | min(K); min(C) if 2 runs |
| select c, x, y              | min(K_c, C_x, C_y)              | min of x and y         | min(K_c, K_x, K_y)       |
| cast, bitcast int -> int    | kept if values are kept         | kept (wraps keep it)   | kept                     |
| addptr p, off               | max(min(K_p,C_o), min(C_p,K_o)) | min(D_p, D_o * bytes)  | min(K_p, K_o)            |
| load, reduce, scan, dot     | 1                               | 1                      | 1                        |
| for / while / if            | args, results: fixpoint         | of `join` over inits   | and yields               |

A view access (`view_vector_width`) may move w lanes along a unit-stride
dim when the base, the other dims' strides and the block offset along the
dim are multiples of w elements, and the offset and size along the dim are
multiples of w (so the bounds check is the same for all w lanes).

Constants fold exactly through every integer op, so `%c = mul %one, %K`
knows K's divisibility and `%n = add %c16, %c16` is the constant 32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Union

from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.dtypes import DType
from tessera.ir.types import PointerType, ScalarType, TileType, Type, ViewType, element_of, shape_of

MAX_DIVISIBILITY = 1 << 12


def pow2_divisor(n: int) -> int:
    """The largest power of two dividing `n`, at most MAX_DIVISIBILITY (0 is divisible by all)."""
    return MAX_DIVISIBILITY if n == 0 else min(n & -n, MAX_DIVISIBILITY)


def _group_cap(size: int) -> int:
    """Contiguity and constancy along a dim are at most the largest power of two dividing its size."""
    return size & -size


@dataclass(frozen=True)
class AxisInfo:
    """What holds for every lane of an integer, bool or pointer value (see the module docstring)."""

    contiguity: tuple[int, ...]
    divisibility: tuple[int, ...]
    constancy: tuple[int, ...]
    element_divisibility: int = 1
    constant: int | None = None
    nonnegative: bool = False
    pointee_bits: int = 0        # pointers: the pointee's width; divisibility is then in bytes

    @property
    def rank(self) -> int:
        return len(self.contiguity)

    def steps_divisibility(self, n: int) -> int:
        """A power of two dividing the distance covered by `n` contiguous steps (1 for pointers into sub-byte
        elements whose run does not end on a byte)."""
        if not self.pointee_bits:
            return min(n, MAX_DIVISIBILITY)
        return max(1, min(n * (self.pointee_bits & -self.pointee_bits) // 8, MAX_DIVISIBILITY))

    def divisibility_at(self, dim: int, group: int) -> int:
        """A power of two dividing the value at every lane whose index along `dim` is a multiple of `group`."""
        c, d = self.contiguity[dim], self.divisibility[dim]
        if c == 1 or group % c == 0:
            return d
        return min(d, self.steps_divisibility(group))

    def __str__(self) -> str:
        text = f"divisibility={self.element_divisibility}"
        if self.rank:
            text = (f"contiguity={list(self.contiguity)} divisibility={list(self.divisibility)} "
                    f"constancy={list(self.constancy)} element_divisibility={self.element_divisibility}")
        if self.constant is not None:
            text += f" constant={self.constant}"
        return text + (" nonnegative" if self.nonnegative else "")


@dataclass(frozen=True)
class ViewInfo:
    """What is known about a tensor view: base alignment (bytes), size and stride divisibility (elements)."""

    base_divisibility: int
    size_divisibility: tuple[int, ...]
    stride_divisibility: tuple[int, ...]
    unit_stride: tuple[bool, ...]        # the stride is the constant 1

    @staticmethod
    def unknown(rank: int) -> "ViewInfo":
        return ViewInfo(1, (1,) * rank, (1,) * rank, (False,) * rank)


Facts = Union[AxisInfo, ViewInfo]


# ---------------------------------------------------------------------------
# Building facts


def make_info(shape: tuple[int, ...], contiguity, divisibility, constancy, element_divisibility: int = 1,
              constant: int | None = None, nonnegative: bool = False, pointee_bits: int = 0) -> AxisInfo:
    """An AxisInfo with the invariants restored: bounds, caps, and divisibility shared between dims."""
    if constant is not None:
        p = pow2_divisor(constant)
        return AxisInfo((1,) * len(shape), (p,) * len(shape), tuple(_group_cap(s) for s in shape),
                        p, constant, constant >= 0, pointee_bits)
    raw = AxisInfo(tuple(contiguity), tuple(divisibility), tuple(constancy), 1, None, nonnegative, pointee_bits)
    C, D, K = [], [], []
    e = min(element_divisibility, MAX_DIVISIBILITY)
    for dim, size in enumerate(shape):
        cap = _group_cap(size)
        c = min(raw.contiguity[dim], cap)
        C.append(c)
        D.append(min(raw.divisibility_at(dim, c), MAX_DIVISIBILITY))
        K.append(min(raw.constancy[dim], cap))
    for c, d in zip(C, D):
        if c == 1:          # every lane is a group start: d divides every lane
            e = max(e, d)
    D = [max(d, e) for d in D]
    return AxisInfo(tuple(C), tuple(D), tuple(K), e, None, nonnegative, pointee_bits)


def unknown(shape: tuple[int, ...], pointee_bits: int = 0, nonnegative: bool = False) -> AxisInfo:
    """Nothing known beyond the trivial: every fact 1."""
    ones = (1,) * len(shape)
    return AxisInfo(ones, ones, ones, 1, None, nonnegative, pointee_bits)


def constant_info(shape: tuple[int, ...], value: int) -> AxisInfo:
    return make_info(shape, (), (), (), constant=value)


def join(a: Facts | None, b: Facts | None) -> Facts | None:
    """What holds of a value that is either `a` or `b` (a control-flow merge)."""
    if a is None or b is None:
        return None
    if isinstance(a, ViewInfo):
        return ViewInfo(min(a.base_divisibility, b.base_divisibility),
                        tuple(map(min, a.size_divisibility, b.size_divisibility)),
                        tuple(map(min, a.stride_divisibility, b.stride_divisibility)),
                        tuple(x and y for x, y in zip(a.unit_stride, b.unit_stride)))
    if a == b or (a.constant is not None and a.constant == b.constant):
        return a
    C = [min(x, y) for x, y in zip(a.contiguity, b.contiguity)]
    D = [min(a.divisibility_at(d, c), b.divisibility_at(d, c)) for d, c in enumerate(C)]
    K = [min(x, y) for x, y in zip(a.constancy, b.constancy)]
    no_caps = (1 << 62,) * a.rank      # both sides already respect the real shape's caps
    return make_info(no_caps, C, D, K, min(a.element_divisibility, b.element_divisibility), None,
                     a.nonnegative and b.nonnegative, a.pointee_bits)


# ---------------------------------------------------------------------------
# Helpers of the rules


def _div1(x: AxisInfo, dim: int) -> int:
    """A power of two dividing every lane of `x` along `dim`."""
    return x.divisibility_at(dim, 1)


def _run(a: AxisInfo, dim: int, limit: int, boundary_divisibility: Callable[[int], int]) -> int:
    """The largest power of two g <= min(C_a, limit) such that a's values at lanes g apart, and the
    boundary they are compared with (divided by, ...), are divisible by g: each aligned group of g lanes
    of `a` then lies between two consecutive multiples of g."""
    g = min(a.contiguity[dim], limit)
    while g > 1 and (a.divisibility_at(dim, g) < g or boundary_divisibility(g) < g):
        g //= 2
    return g


def _run_against(a: AxisInfo, b: AxisInfo, dim: int) -> int:
    """`_run` where the boundary is the value b, constant over the group."""
    return _run(a, dim, b.constancy[dim], lambda g: b.divisibility_at(dim, g))


def _run_pow2(a: AxisInfo, dim: int, modulus: int) -> int:
    """`_run` against the constant boundary `modulus` (a power of two)."""
    return _run(a, dim, modulus, lambda g: modulus)


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _wrap(value: int, dtype: DType) -> int:
    """`value` as the IR computes it in `dtype` (two's complement wrap-around; bool is 0 or 1)."""
    if dtype.is_bool:
        return int(value != 0)
    modulus = 1 << dtype.bits
    value %= modulus
    return value - modulus if dtype.is_signed and value >= modulus // 2 else value


def _fold(name: str, x: int, y: int, dtype: DType) -> int | None:
    """The constant `x name y`, or None where the IR leaves it undefined (division by zero)."""
    if name in ("div", "rem"):
        if y == 0:
            return None
        q = abs(x) // abs(y)
        q = q if (x >= 0) == (y > 0) else -q
        return _wrap(q if name == "div" else x - y * q, dtype)
    if name in ("shl", "shr"):
        if 0 <= y < dtype.bits:
            return _wrap(x << y if name == "shl" else x >> y, dtype)
        return 0 if name == "shl" or x >= 0 else -1
    ops = {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y, "and": lambda: x & y,
           "or": lambda: x | y, "xor": lambda: x ^ y, "min": lambda: min(x, y), "max": lambda: max(x, y)}
    return _wrap(ops[name](), dtype)


_PREDICATES = {"eq": lambda x, y: x == y, "ne": lambda x, y: x != y, "lt": lambda x, y: x < y,
               "le": lambda x, y: x <= y, "gt": lambda x, y: x > y, "ge": lambda x, y: x >= y}


# ---------------------------------------------------------------------------
# Transfer functions: rule(op, operand facts, result shape) -> AxisInfo

Rule = Callable[[Operation, list, tuple], AxisInfo | None]
_RULES: dict[str, Rule] = {}


def _rule(*names: str):
    def register(fn: Rule) -> Rule:
        for name in names:
            _RULES[name] = fn
        return fn
    return register


def _dtype(op: Operation) -> DType:
    return element_of(op.operands[0].type).dtype


@_rule("constant")
def _constant(op, args, shape):
    value = op.attrs["value"]
    return constant_info(shape, int(value)) if isinstance(value, (bool, int)) else None


@_rule("program_id", "num_programs")
def _program_id(op, args, shape):
    return unknown(shape, nonnegative=True)


@_rule("arange")
def _arange(op, args, shape):
    start, n = op.attrs["start"], shape[0]
    c = _group_cap(n)
    d = pow2_divisor(start) if c == n else min(pow2_divisor(start), c)  # groups after the first start c apart
    if n == 1:
        return constant_info(shape, start)
    return make_info(shape, (c,), (d,), (1,), 1, None, start >= 0)


@_rule("splat")
def _splat(op, args, shape):
    (x,) = args
    e = x.element_divisibility
    return make_info(shape, (1,) * len(shape), (e,) * len(shape), tuple(map(_group_cap, shape)), e,
                     x.constant, x.nonnegative, x.pointee_bits)


@_rule("broadcast")
def _broadcast(op, args, shape):
    (x,) = args
    src = shape_of(op.operands[0].type)
    K = [_group_cap(r) if s == 1 else k for s, r, k in zip(src, shape, x.constancy)]
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


def _binary(op, a: AxisInfo, b: AxisInfo, shape, C, D, K, E, nonnegative) -> AxisInfo:
    """Fold constants, else assemble the rule's facts."""
    if a.constant is not None and b.constant is not None:
        value = _fold(op.name, a.constant, b.constant, _dtype(op))
        if value is not None:
            return constant_info(shape, value)
    return make_info(shape, C, D, K, E, None, nonnegative)


def _min_constancy(*infos: AxisInfo) -> list[int]:
    return [min(x.constancy[d] for x in infos) for d in range(infos[0].rank)]


@_rule("add", "sub")
def _add_sub(op, args, shape):
    a, b = args
    sub = op.name == "sub"
    C, D, K = [], [], _min_constancy(a, b)
    for d in range(len(shape)):
        c = min(a.contiguity[d], b.constancy[d])
        if not sub:
            c = max(c, min(a.constancy[d], b.contiguity[d]))
        elif a.contiguity[d] > 1 and b.contiguity[d] > 1:   # two runs: their difference is constant
            K[d] = max(K[d], min(a.contiguity[d], b.contiguity[d]))
        C.append(c)
        D.append(min(a.divisibility_at(d, c), b.divisibility_at(d, c)))
    e = min(a.element_divisibility, b.element_divisibility)
    return _binary(op, a, b, shape, C, D, K, e, not sub and a.nonnegative and b.nonnegative)


@_rule("mul")
def _mul(op, args, shape):
    a, b = args
    if b.constant == 1 or a.constant == 1:
        return a if b.constant == 1 else b
    if a.constant == 0 or b.constant == 0:
        return constant_info(shape, 0)
    D = [_div1(a, d) * _div1(b, d) for d in range(len(shape))]
    return _binary(op, a, b, shape, (1,) * len(shape), D, _min_constancy(a, b),
                   a.element_divisibility * b.element_divisibility, a.nonnegative and b.nonnegative)


def _exact_quotient(divisibility: int, divisor: int | None) -> int:
    """Divisibility of x / divisor for x divisible by `divisibility` (exact when divisor | x)."""
    if divisor is None or not _is_pow2(abs(divisor)) or divisibility < abs(divisor):
        return 1
    return divisibility // abs(divisor)


@_rule("div")
def _div(op, args, shape):
    a, b = args
    if b.constant == 1:
        return a
    if a.constant == 0:
        return constant_info(shape, 0)
    K = _min_constancy(a, b)
    if a.nonnegative:   # C division truncates: only a nonnegative run maps to one quotient per group
        K = [max(k, _run_against(a, b, d)) for d, k in enumerate(K)]
    D = [_exact_quotient(_div1(a, d), b.constant) for d in range(len(shape))]
    return _binary(op, a, b, shape, (1,) * len(shape), D, K,
                   _exact_quotient(a.element_divisibility, b.constant), a.nonnegative and b.nonnegative)


@_rule("rem")
def _rem(op, args, shape):
    a, b = args
    if b.constant in (1, -1):
        return constant_info(shape, 0)
    C = [_run_against(a, b, d) if a.nonnegative else 1 for d in range(len(shape))]
    D = [min(a.divisibility_at(d, c), b.divisibility_at(d, c)) for d, c in enumerate(C)]
    e = min(a.element_divisibility, b.element_divisibility)
    return _binary(op, a, b, shape, C, D, _min_constancy(a, b), e, a.nonnegative)


@_rule("shl")
def _shl(op, args, shape):
    a, b = args
    bits, k = _dtype(op).bits, b.constant
    if a.constant is not None and k is not None:
        return constant_info(shape, _fold("shl", a.constant, k, _dtype(op)))
    if k == 0:
        return a
    if k is not None and not 0 <= k < bits:
        return constant_info(shape, 0)
    scale = 1 << k if k is not None else 1      # an unknown shift yields 0 or a multiple of a
    D = [_div1(a, d) * scale for d in range(len(shape))]
    return make_info(shape, (1,) * len(shape), D, _min_constancy(a, b), a.element_divisibility * scale,
                     None, a.nonnegative)


@_rule("shr")
def _shr(op, args, shape):
    a, b = args
    bits, k = _dtype(op).bits, b.constant
    if a.constant is not None and k is not None:
        return constant_info(shape, _fold("shr", a.constant, k, _dtype(op)))
    if k == 0:
        return a
    K = _min_constancy(a, b)
    if k is None or not 0 <= k < bits:
        if k is not None and a.nonnegative:
            return constant_info(shape, 0)
        return make_info(shape, (1,) * len(shape), (1,) * len(shape), K, 1, None, a.nonnegative)
    # a >> k is floor(a / 2**k), for negative a too: runs aligned to 2**k give one value.
    K = [max(c, _run_pow2(a, d, 1 << k)) for d, c in enumerate(K)]
    D = [_exact_quotient(_div1(a, d), 1 << k) for d in range(len(shape))]
    return make_info(shape, (1,) * len(shape), D, K, _exact_quotient(a.element_divisibility, 1 << k),
                     None, a.nonnegative)


@_rule("and")
def _and(op, args, shape):
    a, b = args
    if a.constant is not None and b.constant is None:
        a, b = b, a
    mask, rank = b.constant, len(shape)
    if a.constant is None and mask is not None and not _dtype(op).is_bool:
        if mask == -1:
            return a
        if mask > 0 and _is_pow2(mask + 1):       # a & (2**k - 1) == a mod 2**k, rounding down
            C = [_run_pow2(a, d, mask + 1) for d in range(rank)]
            D = [min(a.divisibility_at(d, c), pow2_divisor(mask + 1)) for d, c in enumerate(C)]
            return make_info(shape, C, D, a.constancy, min(a.element_divisibility, pow2_divisor(mask + 1)),
                             None, True)
        if mask < 0 and _is_pow2(-mask):         # a & -2**k == 2**k * floor(a / 2**k)
            K = [max(k, _run_pow2(a, d, -mask)) for d, k in enumerate(a.constancy)]
            D = [max(_div1(a, d), pow2_divisor(mask)) for d in range(rank)]
            return make_info(shape, (1,) * rank, D, K, max(a.element_divisibility, pow2_divisor(mask)),
                             None, a.nonnegative)
    # Trailing zeros of a & b: at least those of either operand.
    D = [max(_div1(a, d), _div1(b, d)) for d in range(rank)]
    e = max(a.element_divisibility, b.element_divisibility)
    return _binary(op, a, b, shape, (1,) * rank, D, _min_constancy(a, b), e, a.nonnegative or b.nonnegative)


@_rule("or", "xor", "min", "max")
def _lanewise_min(op, args, shape):
    """Results whose trailing zeros are at least the fewer of the operands'."""
    a, b = args
    D = [min(_div1(a, d), _div1(b, d)) for d in range(len(shape))]
    nonnegative = (a.nonnegative or b.nonnegative) if op.name == "max" else (a.nonnegative and b.nonnegative)
    e = min(a.element_divisibility, b.element_divisibility)
    return _binary(op, a, b, shape, (1,) * len(shape), D, _min_constancy(a, b), e, nonnegative)


@_rule("neg", "abs", "not")
def _unary(op, args, shape):
    (a,) = args
    dtype = _dtype(op)
    if a.constant is not None:
        x = a.constant
        value = {"neg": -x, "abs": abs(x), "not": (1 - x) if dtype.is_bool else ~x}[op.name]
        return constant_info(shape, _wrap(value, dtype))
    rank = len(shape)
    if op.name == "not":
        return make_info(shape, (1,) * rank, (1,) * rank, a.constancy)
    D = [_div1(a, d) for d in range(rank)]
    return make_info(shape, (1,) * rank, D, a.constancy, a.element_divisibility, None, op.name == "abs")


@_rule("cmp")
def _cmp(op, args, shape):
    a, b = args
    pred = op.attrs["pred"]
    if a.constant is not None and b.constant is not None:
        return constant_info(shape, int(_PREDICATES[pred](a.constant, b.constant)))
    K = _min_constancy(a, b)
    for d in range(len(shape)):
        if a.contiguity[d] > 1 and b.contiguity[d] > 1:       # a - b is constant over both runs
            K[d] = max(K[d], min(a.contiguity[d], b.contiguity[d]))
        if pred in ("lt", "ge"):      # run < bound flips only at a multiple of g
            K[d] = max(K[d], _run_against(a, b, d))
        if pred in ("gt", "le"):      # bound > run, i.e. run < bound
            K[d] = max(K[d], _run_against(b, a, d))
    return make_info(shape, (1,) * len(shape), (1,) * len(shape), K, 1, None, True)


@_rule("select")
def _select(op, args, shape):
    cond, x, y = args
    if cond.constant is not None:
        return x if cond.constant else y
    C = [min(cond.constancy[d], x.contiguity[d], y.contiguity[d]) for d in range(len(shape))]
    D = [min(x.divisibility_at(d, c), y.divisibility_at(d, c)) for d, c in enumerate(C)]
    constant = x.constant if x.constant is not None and x.constant == y.constant else None
    return make_info(shape, C, D, _min_constancy(cond, x, y), min(x.element_divisibility, y.element_divisibility),
                     constant, x.nonnegative and y.nonnegative, x.pointee_bits)


@_rule("cast", "bitcast")
def _cast(op, args, shape):
    (a,) = args
    if a is None:            # from a float: nothing is known
        return unknown(shape)
    src, dst = _dtype(op), element_of(op.result.type).dtype
    if a.constant is not None and (op.name == "cast" or src.is_int):
        value = a.constant if op.name == "cast" else a.constant % (1 << src.bits)
        return constant_info(shape, _wrap(value, dst))
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
    return make_info(shape, C, D, _min_constancy(p, off), e, pointee_bits=bits)


@_rule("make_view")
def _make_view(op, args, shape):
    base, *rest = args
    rank = len(rest) // 2
    sizes, strides = rest[:rank], rest[rank:]
    return ViewInfo(base.element_divisibility, tuple(s.element_divisibility for s in sizes),
                    tuple(s.element_divisibility for s in strides), tuple(s.constant == 1 for s in strides))


# ---------------------------------------------------------------------------
# The walk over the function


def _pointee_bits(t: Type) -> int | None:
    """0 for integer and bool values, the pointee's bits for pointers, None for untracked types."""
    elem = element_of(t)
    if isinstance(elem, PointerType):
        return elem.pointee.bits
    if isinstance(elem, ScalarType) and (elem.dtype.is_int or elem.dtype.is_bool):
        return 0
    return None


def _unknown_for(t: Type) -> Facts | None:
    if isinstance(t, ViewType):
        return ViewInfo.unknown(t.rank)
    bits = _pointee_bits(t)
    if bits is None:
        return None
    dtype = getattr(element_of(t), "dtype", None)
    return unknown(shape_of(t), bits, dtype is not None and dtype.kind in ("uint", "bool"))


class _Analysis:
    def __init__(self):
        self.facts: dict[Value, Facts] = {}

    def info(self, value: Value) -> Facts | None:
        if value in self.facts:
            return self.facts[value]
        return _unknown_for(value.type)

    def set(self, value: Value, facts: Facts | None) -> None:
        if facts is None:
            facts = _unknown_for(value.type)
        if facts is None:
            return
        if isinstance(facts, AxisInfo):
            dtype = getattr(element_of(value.type), "dtype", None)
            if dtype is not None and dtype.kind in ("uint", "bool") and not facts.nonnegative:
                facts = replace(facts, nonnegative=True)
        self.facts[value] = facts

    def function(self, fn: Function) -> dict[Value, Facts]:
        aligned = set(fn.attrs.get("divisible_by_16", ()))
        for i, arg in enumerate(fn.args):
            facts = _unknown_for(arg.type)
            if isinstance(facts, AxisInfo) and i in aligned:
                facts = replace(facts, divisibility=(16,) * facts.rank, element_divisibility=16)
            self.set(arg, facts)
        self.block(fn.body)
        return self.facts

    def block(self, block: Block) -> None:
        for op in block.ops:
            handler = getattr(self, "op_" + op.name, None)
            if handler is not None:
                handler(op)
            elif op.regions:
                self.opaque_regions(op)
            else:
                self.op(op)

    def op(self, op: Operation) -> None:
        rule = _RULES.get(op.name)
        tracked = len(op.results) == 1 and (isinstance(op.result.type, ViewType) or
                                            _pointee_bits(op.result.type) is not None)
        if rule is None or not tracked:
            for result in op.results:
                self.set(result, None)
            return
        args = [self.info(v) for v in op.operands]
        if any(a is None for a in args) and op.name not in ("cast", "bitcast"):
            self.set(op.result, None)
            return
        self.set(op.result, rule(op, args, shape_of(op.result.type)))

    def opaque_regions(self, op: Operation) -> None:
        """Combine regions of reduce/scan and ops without a rule: nothing known of their inputs or results."""
        for region in op.regions:
            for arg in region.args:
                self.set(arg, None)
            self.block(region)
        for result in op.results:
            self.set(result, None)

    def yields(self, block: Block, skip: int = 0) -> list[Facts | None]:
        return [self.info(v) for v in block.terminator.operands[skip:]]

    def fixpoint(self, args: list[Value], initial: list[Facts | None], body: Callable[[], list]) -> list:
        """Bind `args` to `initial`, run `body` (which returns the facts flowing back into args), and join
        until nothing changes. Each round can only weaken facts, so this ends."""
        current = initial
        while True:
            for arg, facts in zip(args, current):
                self.set(arg, facts)
            current_back = body()
            joined = [join(c, y) for c, y in zip(current, current_back)]
            if joined == current:
                return current
            current = joined

    def op_for(self, op: Operation) -> None:
        lb, ub, step, *inits = [self.info(v) for v in op.operands]
        body = op.regions[0]
        iv = make_info((), (), (), (), min(lb.element_divisibility, step.element_divisibility),
                       None, lb.nonnegative and step.nonnegative)
        self.set(body.args[0], iv)

        def run_body():
            self.block(body)
            return self.yields(body)
        carried = self.fixpoint(body.args[1:], inits, run_body)
        for result, facts in zip(op.results, carried):
            self.set(result, facts)

    def op_if(self, op: Operation) -> None:
        cond = self.info(op.operands[0])
        then, other = op.regions
        self.block(then)
        self.block(other)
        branches = [self.yields(then), self.yields(other)]
        if cond.constant is not None:
            branches = [branches[0] if cond.constant else branches[1]]
        for i, result in enumerate(op.results):
            facts = branches[0][i]
            for branch in branches[1:]:
                facts = join(facts, branch[i])
            self.set(result, facts)

    def op_while(self, op: Operation) -> None:
        before, after = op.regions
        passed: list = []

        def run_body():
            nonlocal passed
            self.block(before)
            passed = self.yields(before, skip=1)
            for arg, facts in zip(after.args, passed):
                self.set(arg, facts)
            self.block(after)
            return self.yields(after)
        self.fixpoint(before.args, [self.info(v) for v in op.operands], run_body)
        for result, facts in zip(op.results, passed):
            self.set(result, facts)


def analyze(fn: Function) -> dict[Value, Facts]:
    """Facts for every integer, bool and pointer value (AxisInfo) and every view (ViewInfo) of `fn`."""
    return _Analysis().function(fn)


# ---------------------------------------------------------------------------
# Queries for the vectorizer


def vector_width(info: AxisInfo, element_bits: int, max_bits: int = 128, dim: int = -1) -> int:
    """How many consecutive elements along `dim` one access through the pointer tile `info` may cover:
    min(contiguity, alignment in elements, max_bits / element_bits), a power of two >= 1. (For a tile of
    integer offsets from a suitably aligned base, the alignment is the offsets' divisibility.)"""
    if info.rank == 0 or not _is_pow2(element_bits):
        return 1
    aligned = info.divisibility[dim] * 8 // element_bits if info.pointee_bits else info.divisibility[dim]
    return max(1, min(info.contiguity[dim], aligned, max_bits // element_bits))


def mask_constancy(info: AxisInfo, dim: int = -1) -> int:
    """How many consecutive lanes along `dim` of the mask `info` share one mask bit."""
    return info.constancy[dim] if info.rank else 1


def view_vector_width(view: ViewInfo, offsets: list[AxisInfo], shape: tuple[int, ...], element_bits: int,
                      max_bits: int = 128, dim: int = -1) -> int:
    """Lanes along `dim` one access may move for a block of `shape` at `offsets` of a view: the stride along
    `dim` must be 1, the block's first lanes aligned, and the bounds check the same for all of them."""
    rank = len(shape)
    dim %= rank
    if not view.unit_stride[dim] or not _is_pow2(element_bits):
        return 1
    width = min(_group_cap(shape[dim]), max(1, max_bits // element_bits))
    # Element (i_0, ...) lives at base + bytes(sum_e (offset_e + i_e) * stride_e).
    aligned = view.base_divisibility * 8 // element_bits
    for e in range(rank):
        if e != dim:
            rows = offsets[e].element_divisibility if shape[e] == 1 else 1
            aligned = min(aligned, view.stride_divisibility[e] * rows)
    aligned = min(aligned, offsets[dim].element_divisibility)
    # offset + i < size flips only at multiples of the width when both are multiples of it.
    bounds = min(offsets[dim].element_divisibility, view.size_divisibility[dim])
    return max(1, min(width, aligned, bounds))


def access_width(facts: dict[Value, Facts], op: Operation, max_bits: int = 128, dim: int = -1) -> int:
    """Lanes along `dim` that one vector instruction of the memory op `op` may move, mask included."""
    if op.name in ("load", "store"):
        ptr = op.operands[0]
        if not isinstance(ptr.type, TileType):
            return 1
        width = vector_width(facts[ptr], ptr.type.element.pointee.bits, max_bits, dim)
        mask_index = 1 if op.name == "load" else 2
        if len(op.operands) > mask_index:
            width = min(width, mask_constancy(facts[op.operands[mask_index]], dim))
        return width
    if op.name in ("view_load", "view_store"):
        view = op.operands[0]
        rank = view.type.rank
        shape = shape_of(op.result.type) if op.name == "view_load" else shape_of(op.operands[-1].type)
        offsets = [facts[v] for v in op.operands[1:1 + rank]]
        return view_vector_width(facts[view], offsets, shape, view.type.dtype.bits, max_bits, dim)
    return 1
