"""Building one function out of several launches' functions: shared parameters, merged attributes, cloning.

Parameters bound to the same name become one parameter of the merged
function (the same buffer or scalar); the others keep their order, the
first launch's first. Attributes that list parameter indices
(`divisible_by_16`, `noalias`) are renumbered (a divisibility fact holds if
any launch states it, no-aliasing only if every launch taking the parameter
does); any other attribute must agree between the launches.
"""

from __future__ import annotations

from typing import Sequence

from tessera.ir.builder import Builder
from tessera.ir.core import Block, Function, Operation, Value

from ..rewrite import clone_op
from .launches import Launch

# Facts about one parameter each, listed by index: a value's divisibility holds wherever it is passed; a
# pointer is free of aliases in the merged kernel only if it was in every kernel that takes it.
UNION_ATTRS, INTERSECTION_ATTRS = ("divisible_by_16",), ("noalias",)


class Refused(Exception):
    """Fusion is not possible; the message says why."""


class Merged:
    """The merged function under construction, and each launch's parameters -> its parameters."""

    def __init__(self, name: str, launches: Sequence[Launch]):
        names, types = [], []
        for launch in launches:
            for bound, arg in zip(launch.bind, launch.fn.args):
                if bound in names:
                    if types[names.index(bound)] != arg.type:
                        raise Refused(f"{bound} is bound to parameters of different types "
                                      f"({types[names.index(bound)]} and {arg.type})")
                    continue
                names.append(bound)
                types.append(arg.type)
        self.names = names
        hints = [_hint(launches, n) for n in names]
        self.fn = Function(name, Block(types, hints), _merged_attrs(launches, names))
        self.builder = Builder()
        self.builder.block = self.fn.body

    def mapping(self, launch: Launch) -> dict[Value, Value]:
        """The launch's parameters -> the merged function's."""
        return {arg: self.fn.args[self.names.index(bound)] for bound, arg in zip(launch.bind, launch.fn.args)}

    def clone_body(self, launch: Launch, mapping: dict[Value, Value], skip=frozenset(), into: Block = None) -> None:
        """Clone the launch's ops, but its `return` and the ops in `skip`, to the end of `into` (default: the
        merged function's body)."""
        block = into if into is not None else self.fn.body
        for op in body_ops(launch):
            if op not in skip:
                block.append(clone_op(op, mapping))

    def launch(self, grid: tuple[int, ...], launches: Sequence[Launch]) -> Launch:
        """The merged function as a launch over `grid`, bound to the shared names."""
        self.builder.create("return")
        return Launch(self.fn, grid, tuple(self.names),
                      frozenset().union(*(l.writes_all for l in launches)),
                      tuple(s for l in launches for s in l.sources), tuple(o for l in launches for o in l.origin))


def body_ops(launch: Launch) -> list[Operation]:
    """The launch's top-level ops without the closing `return`."""
    ops = list(launch.fn.body.ops)
    if not ops or ops[-1].name != "return":
        raise Refused(f"@{launch.name} does not end in a return")
    return ops[:-1]


def _hint(launches: Sequence[Launch], bound: str) -> str:
    for launch in launches:
        for name, arg in zip(launch.bind, launch.fn.args):
            if name == bound and arg.name_hint:
                return arg.name_hint
    return ""


def _merged_attrs(launches: Sequence[Launch], names: list[str]) -> dict:
    attrs: dict = {}
    for launch in launches:
        for key, value in launch.fn.attrs.items():
            if key in UNION_ATTRS + INTERSECTION_ATTRS:
                continue
            if key in attrs and attrs[key] != value:
                raise Refused(f"attribute {key} differs between the kernels ({attrs[key]!r} vs {value!r})")
            attrs[key] = value
    for key in UNION_ATTRS + INTERSECTION_ATTRS:
        holds = {}
        for launch in launches:
            listed = set(launch.fn.attrs.get(key, ()))
            for i, bound in enumerate(launch.bind):
                index = names.index(bound)
                fact = i in listed
                holds[index] = (holds.get(index, fact) or fact) if key in UNION_ATTRS else holds.get(index, fact) and fact
        indices = tuple(sorted(i for i, fact in holds.items() if fact))
        if indices:
            attrs[key] = indices
    return attrs
