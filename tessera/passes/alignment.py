"""Alignment analysis: divisibility, contiguity and constancy of integer and pointer values, per tile dimension.

What the vectorizer and the memory lowering need to know about an address
tile is how many lanes in a row hit consecutive, suitably aligned addresses
under one mask bit. This analysis (Triton's AxisInfo, made sound for C
division and for regrouped runs) computes, for every SSA value of integer,
bool or pointer type, an `AxisInfo`; for views, a `ViewInfo`.

    facts = analyze(fn)                            # {Value: AxisInfo | ViewInfo}
    access_width(facts, load_op)                   # lanes one vector access may move
    vector_width(facts[ptr], 32), mask_constancy(facts[mask])

This module is the entry point: the walk over a function and the queries of
the vectorizer. The rest lives in
  `alignment_lattice`  what the facts mean, their invariants and `join`;
  `alignment_rules`    where facts come from, and the rules of shape ops,
                       select, casts and `addptr`;
  `alignment_arith`    the rules of integer arithmetic and comparisons;
  `alignment_hints`    what multiple_of, max_contiguous and assume state.

The walk, per dim (ops without a rule, and arguments not listed in the
kernel's divisible_by_16, know nothing):

| op                          | C                               | D (at C groups)        | K                        |
| --------------------------- | ------------------------------- | ---------------------- | ------------------------ |
| load, reduce, scan, dot     | 1                               | 1                      | 1                        |
| for / while / if            | args, results: fixpoint         | of `join` over inits   | and yields               |

A view access (`view_vector_width`) may move w lanes along a unit-stride
dim when the base, the other dims' strides and the block offset along the
dim are multiples of w elements, and the offset and size along the dim are
multiples of w (so the bounds check is the same for all w lanes).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.types import PointerType, ScalarType, TileType, Type, ViewType, element_of, shape_of

from . import alignment_arith, alignment_hints, alignment_rules
from .alignment_lattice import (  # noqa: F401  (re-exported: the analysis' public API)
    MAX_DIVISIBILITY, AxisInfo, Facts, ViewInfo, constant_info, group_cap, is_pow2, join, make_info,
    pow2_at_most, pow2_divisor, unknown,
)
from .alignment_rules import Rule  # noqa: F401  (re-exported)

_RULES: dict[str, Rule] = {**alignment_rules.RULES, **alignment_arith.RULES, **alignment_hints.RULES}


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

    def op_assume(self, op: Operation) -> None:
        """Values the assumed condition constrains know more from here on."""
        for value, facts in alignment_hints.assumed(op.operands[0], self.info).items():
            self.set(value, facts)

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
    if info.rank == 0 or not _vectorizable(element_bits):
        return 1
    aligned = elements_aligned(info.divisibility[dim], element_bits) if info.pointee_bits else info.divisibility[dim]
    return max(1, min(info.contiguity[dim], aligned, pow2_at_most(max_bits // element_bits)))


def elements_aligned(byte_divisibility: int, element_bits: int) -> int:
    """How many elements of `element_bits` bits an address divisible by `byte_divisibility` bytes is aligned
    to. A sub-byte pointer's byte divisibility is elements * lowbit(bits) / 8, floored at one byte, so one
    byte says nothing about where in the byte the element starts."""
    if element_bits >= 8:
        return byte_divisibility * 8 // element_bits
    return 1 if byte_divisibility == 1 else byte_divisibility * 8 // (element_bits & -element_bits)


def _vectorizable(element_bits: int) -> bool:
    """Whole groups of elements make whole accesses: powers of two, and any sub-byte width (a group of a
    multiple of 8 elements ends on a byte; the low-bit pass splits it into aligned byte accesses)."""
    return is_pow2(element_bits) or element_bits < 8


def mask_constancy(info: AxisInfo, dim: int = -1) -> int:
    """How many consecutive lanes along `dim` of the mask `info` share one mask bit."""
    return info.constancy[dim] if info.rank else 1


def view_vector_width(view: ViewInfo, offsets: list[AxisInfo], shape: tuple[int, ...], element_bits: int,
                      max_bits: int = 128, dim: int = -1) -> int:
    """Lanes along `dim` one access may move for a block of `shape` at `offsets` of a view: the stride along
    `dim` must be 1, the block's first lanes aligned, and the bounds check the same for all of them."""
    rank = len(shape)
    dim %= rank
    if not view.unit_stride[dim] or not _vectorizable(element_bits):
        return 1
    width = min(group_cap(shape[dim]), pow2_at_most(max_bits // element_bits))
    # Element (i_0, ...) lives at base + bytes(sum_e (offset_e + i_e) * stride_e).
    aligned = elements_aligned(view.base_divisibility, element_bits)
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
