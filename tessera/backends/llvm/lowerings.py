"""Lowering tables: thread-IR op name -> the function that emits its LLVM IR.

`COMMON` holds every target-neutral op (elementwise, casts, memory,
registers, control flow, and the thread ops whose LLVM differs per target
but whose shape does not: they ask the `TargetDialect` for the details).
Each target layers its own table over it for the ops only it has:

    NVPTX = LoweringTable("NVPTX", base=COMMON)

    @NVPTX.register("ldmatrix")
    def _ldmatrix(lw, op, row): ...

A lowering function receives the function-wide `codegen.Lowering`
(builder, module, target, dialect, helpers), the `Operation` and the LLVM
values of its operands, and returns the LLVM value of its result, a list
(one per result) for multi-result ops, or None. The validator rejects any
op that has no entry in the target's table before LLVM sees anything.
"""

from __future__ import annotations

from typing import Callable, Iterator


class LoweringTable:
    """Op name -> lowering function, falling back to `base` for names it does not define."""

    def __init__(self, name: str, base: "LoweringTable | None" = None):
        self.name = name
        self.base = base
        self._own: dict[str, Callable] = {}

    def register(self, *names: str) -> Callable[[Callable], Callable]:
        """Register the decorated function as this table's lowering of ops `names`."""

        def register(fn: Callable) -> Callable:
            for name in names:
                if name in self:
                    raise RuntimeError(f"{self.name} lowering for op {name!r} defined twice")
                self._own[name] = fn
            return fn

        return register

    def __getitem__(self, name: str) -> Callable:
        if name in self._own:
            return self._own[name]
        if self.base is not None:
            return self.base[name]
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return name in self._own or (self.base is not None and name in self.base)

    def __iter__(self) -> Iterator[str]:
        yield from self._own
        if self.base is not None:
            yield from (name for name in self.base if name not in self._own)

    def own(self) -> frozenset[str]:
        """The ops this table adds to its base."""
        return frozenset(self._own)


COMMON = LoweringTable("common")
lowering = COMMON.register  # `@lowering("add", "sub")` registers a target-neutral lowering
