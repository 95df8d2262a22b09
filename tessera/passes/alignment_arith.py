"""Transfer functions of the alignment analysis for integer arithmetic and comparisons.

Per dim. "run(a|b)" is the largest g <= min(C_a, K_b) such that a's values g
lanes apart and b's value are divisible by g: each aligned group of g lanes
of the run a then lies between two consecutive multiples of g, so `a < b`,
`a / b` (a >= 0) and `a >> k` are constant on it and `a % b` (a >= 0) is a
run on it. div1(x) divides every lane of x.

| op                          | C                               | D (at C groups)        | K                        |
| --------------------------- | ------------------------------- | ---------------------- | ------------------------ |
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

Constants fold exactly through every integer op, so `%c = mul %one, %K`
knows K's divisibility and `%n = add %c16, %c16` is the constant 32.
"""

from __future__ import annotations

from typing import Callable

from tessera.ir.dtypes import DType

from .alignment_lattice import AxisInfo, constant_info, is_pow2, make_info, pow2_divisor
from .alignment_rules import Rule, min_constancy, operand_dtype, registrar, wrap

RULES: dict[str, Rule] = {}
_rule = registrar(RULES)


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


def _fold(name: str, x: int, y: int, dtype: DType) -> int | None:
    """The constant `x name y`, or None where the IR leaves it undefined (division by zero)."""
    if name in ("div", "rem"):
        if y == 0:
            return None
        q = abs(x) // abs(y)
        q = q if (x >= 0) == (y > 0) else -q
        return wrap(q if name == "div" else x - y * q, dtype)
    if name in ("shl", "shr"):
        if 0 <= y < dtype.bits:
            return wrap(x << y if name == "shl" else x >> y, dtype)
        return 0 if name == "shl" or x >= 0 else -1
    ops = {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y, "and": lambda: x & y,
           "or": lambda: x | y, "xor": lambda: x ^ y, "min": lambda: min(x, y), "max": lambda: max(x, y)}
    return wrap(ops[name](), dtype)


_PREDICATES = {"eq": lambda x, y: x == y, "ne": lambda x, y: x != y, "lt": lambda x, y: x < y,
               "le": lambda x, y: x <= y, "gt": lambda x, y: x > y, "ge": lambda x, y: x >= y}


def _binary(op, a: AxisInfo, b: AxisInfo, shape, C, D, K, E, nonnegative) -> AxisInfo:
    """Fold constants, else assemble the rule's facts."""
    if a.constant is not None and b.constant is not None:
        value = _fold(op.name, a.constant, b.constant, operand_dtype(op))
        if value is not None:
            return constant_info(shape, value)
    return make_info(shape, C, D, K, E, None, nonnegative)


# ---------------------------------------------------------------------------
# The rules


@_rule("add", "sub")
def _add_sub(op, args, shape):
    a, b = args
    sub = op.name == "sub"
    C, D, K = [], [], min_constancy(a, b)
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
    return _binary(op, a, b, shape, (1,) * len(shape), D, min_constancy(a, b),
                   a.element_divisibility * b.element_divisibility, a.nonnegative and b.nonnegative)


def _exact_quotient(divisibility: int, divisor: int | None) -> int:
    """Divisibility of x / divisor for x divisible by `divisibility` (exact when divisor | x)."""
    if divisor is None or not is_pow2(abs(divisor)) or divisibility < abs(divisor):
        return 1
    return divisibility // abs(divisor)


@_rule("div")
def _div(op, args, shape):
    a, b = args
    if b.constant == 1:
        return a
    if a.constant == 0:
        return constant_info(shape, 0)
    K = min_constancy(a, b)
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
    return _binary(op, a, b, shape, C, D, min_constancy(a, b), e, a.nonnegative)


@_rule("shl")
def _shl(op, args, shape):
    a, b = args
    bits, k = operand_dtype(op).bits, b.constant
    if a.constant is not None and k is not None:
        return constant_info(shape, _fold("shl", a.constant, k, operand_dtype(op)))
    if k == 0:
        return a
    if k is not None and not 0 <= k < bits:
        return constant_info(shape, 0)
    scale = 1 << k if k is not None else 1      # an unknown shift yields 0 or a multiple of a
    D = [_div1(a, d) * scale for d in range(len(shape))]
    return make_info(shape, (1,) * len(shape), D, min_constancy(a, b), a.element_divisibility * scale,
                     None, a.nonnegative)


@_rule("shr")
def _shr(op, args, shape):
    a, b = args
    bits, k = operand_dtype(op).bits, b.constant
    if a.constant is not None and k is not None:
        return constant_info(shape, _fold("shr", a.constant, k, operand_dtype(op)))
    if k == 0:
        return a
    K = min_constancy(a, b)
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
    if a.constant is None and mask is not None and not operand_dtype(op).is_bool:
        if mask == -1:
            return a
        if mask > 0 and is_pow2(mask + 1):       # a & (2**k - 1) == a mod 2**k, rounding down
            C = [_run_pow2(a, d, mask + 1) for d in range(rank)]
            D = [min(a.divisibility_at(d, c), pow2_divisor(mask + 1)) for d, c in enumerate(C)]
            return make_info(shape, C, D, a.constancy, min(a.element_divisibility, pow2_divisor(mask + 1)),
                             None, True)
        if mask < 0 and is_pow2(-mask):         # a & -2**k == 2**k * floor(a / 2**k)
            K = [max(k, _run_pow2(a, d, -mask)) for d, k in enumerate(a.constancy)]
            D = [max(_div1(a, d), pow2_divisor(mask)) for d in range(rank)]
            return make_info(shape, (1,) * rank, D, K, max(a.element_divisibility, pow2_divisor(mask)),
                             None, a.nonnegative)
    # Trailing zeros of a & b: at least those of either operand.
    D = [max(_div1(a, d), _div1(b, d)) for d in range(rank)]
    e = max(a.element_divisibility, b.element_divisibility)
    return _binary(op, a, b, shape, (1,) * rank, D, min_constancy(a, b), e, a.nonnegative or b.nonnegative)


@_rule("or", "xor", "min", "max")
def _lanewise_min(op, args, shape):
    """Results whose trailing zeros are at least the fewer of the operands'."""
    a, b = args
    D = [min(_div1(a, d), _div1(b, d)) for d in range(len(shape))]
    nonnegative = (a.nonnegative or b.nonnegative) if op.name == "max" else (a.nonnegative and b.nonnegative)
    e = min(a.element_divisibility, b.element_divisibility)
    return _binary(op, a, b, shape, (1,) * len(shape), D, min_constancy(a, b), e, nonnegative)


@_rule("neg", "abs", "not")
def _unary(op, args, shape):
    (a,) = args
    dtype = operand_dtype(op)
    if a.constant is not None:
        x = a.constant
        value = {"neg": -x, "abs": abs(x), "not": (1 - x) if dtype.is_bool else ~x}[op.name]
        return constant_info(shape, wrap(value, dtype))
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
    K = min_constancy(a, b)
    for d in range(len(shape)):
        if a.contiguity[d] > 1 and b.contiguity[d] > 1:       # a - b is constant over both runs
            K[d] = max(K[d], min(a.contiguity[d], b.contiguity[d]))
        if pred in ("lt", "ge"):      # run < bound flips only at a multiple of g
            K[d] = max(K[d], _run_against(a, b, d))
        if pred in ("gt", "le"):      # bound > run, i.e. run < bound
            K[d] = max(K[d], _run_against(b, a, d))
    return make_info(shape, (1,) * len(shape), (1,) * len(shape), K, 1, None, True)
