"""The alignment analysis' reading of hints (`ir/hint_ops.py`): what the author states becomes a fact.

| op / statement                         | fact                                                         |
| -------------------------------------- | ------------------------------------------------------------ |
| multiple_of x, n (per dim)             | D = max(D, n) where C or K >= g = min(n, size): every C-group |
|                                        | start is then a lane the promise speaks of (a scalar: E)     |
| max_contiguous x, c (per dim)          | C = max(C, min(c, size)), K = 1 there; D kept (the new group |
|                                        | starts are old ones); a multiple_of operand's n applies anew |
| assume x % 2^k == 0, x & (2^k-1) == 0  | x (a scalar): E = max(E, 2^k), from the assume on            |
| assume x > c, x >= c (c >= 0), and     | x nonnegative; `and` of conditions: each                     |

The interpreter checks each promise (`backends/interp/hints.py`), so a
fact taken from a hint holds in every run the interpreter accepts.
"""

from __future__ import annotations

from dataclasses import replace

from tessera.ir.core import Operation, Value
from tessera.ir.hint_ops import hint_groups
from tessera.ir.types import ScalarType

from .alignment_lattice import MAX_DIVISIBILITY, AxisInfo, make_info
from .alignment_rules import Rule, registrar

RULES: dict[str, Rule] = {}
_rule = registrar(RULES)


def _with_multiples(x: AxisInfo, values: tuple[int, ...], groups: tuple[int, ...]) -> list[int]:
    """x's divisibility per dim, raised to `values` where x's groups are the ones the promise speaks of."""
    return [max(d, min(n, MAX_DIVISIBILITY)) if max(c, k) >= g else d
            for d, c, k, n, g in zip(x.divisibility, x.contiguity, x.constancy, values, groups)]


@_rule("multiple_of")
def _multiple_of(op, args, shape):
    (x,) = args
    values = op.attrs["values"]
    if not shape:
        return make_info((), (), (), (), max(x.element_divisibility, min(values[0], MAX_DIVISIBILITY)),
                         x.constant, x.nonnegative)
    divisibility = _with_multiples(x, values, hint_groups(values, op.result.type))
    return make_info(shape, x.contiguity, divisibility, x.constancy, x.element_divisibility, None, x.nonnegative)


@_rule("max_contiguous")
def _max_contiguous(op, args, shape):
    (x,) = args
    if not shape:
        return x
    contiguity = [max(c, g) for c, g in zip(x.contiguity, hint_groups(op.attrs["values"], op.result.type))]
    constancy = [1 if c > 1 else k for c, k in zip(contiguity, x.constancy)]
    widened = AxisInfo(tuple(contiguity), x.divisibility, tuple(constancy), x.element_divisibility, None,
                       x.nonnegative)
    producer = op.operands[0].owner
    divisibility = list(x.divisibility)
    if isinstance(producer, Operation) and producer.name == "multiple_of":
        values = producer.attrs["values"]
        divisibility = _with_multiples(widened, values, hint_groups(values, producer.result.type))
    return make_info(shape, contiguity, divisibility, constancy, x.element_divisibility, None, x.nonnegative)


def assumed(cond: Value, info) -> dict[Value, AxisInfo]:
    """The scalar values whose facts `assume cond` strengthens, with their new facts (`info(v)`: the current)."""
    op = cond.owner
    if not isinstance(op, Operation):
        return {}
    if op.name == "and":
        found = assumed(op.operands[0], info)
        return {**found, **assumed(op.operands[1], info)}
    if op.name != "cmp":
        return {}
    pred, (a, b) = op.attrs["pred"], op.operands
    if pred in ("lt", "le"):
        pred, a, b = {"lt": "gt", "le": "ge"}[pred], b, a
    if pred in ("gt", "ge"):
        bound = info(b).constant
        if bound is not None and bound >= (0 if pred == "ge" else -1) and isinstance(a.type, ScalarType):
            return {a: replace(info(a), nonnegative=True)}
        return {}
    if pred == "eq":
        for zero, other in ((a, b), (b, a)):
            if info(zero).constant == 0:
                return _divisible(other, info)
    return {}


def _divisible(value: Value, info) -> dict[Value, AxisInfo]:
    """`value == 0` for value = x % 2^k or x & (2^k - 1): x is a multiple of 2^k."""
    op = value.owner
    if not isinstance(op, Operation) or op.name not in ("rem", "and"):
        return {}
    x, c = op.operands
    constant = info(c).constant
    if constant is None or not isinstance(x.type, ScalarType):
        return {}
    modulus = constant if op.name == "rem" else constant + 1
    if modulus < 1 or modulus & (modulus - 1):
        return {}
    old = info(x)
    return {x: make_info((), (), (), (), max(old.element_divisibility, min(modulus, MAX_DIVISIBILITY)),
                         old.constant, old.nonnegative)}
