"""`OpTable`: op name -> what one stage of the compiler does with the op, filled by a decorator.

Each stage that handles ops one by one keeps one table: the tile
interpreter's semantics, the SIMT simulator's, the tile -> thread lowering,
and the LLVM lowering of each target (layered over the common one with
`base`). Op families register their functions where they are written:

    SEMANTICS = OpTable("interpreter semantics", entry=Semantics)

    @SEMANTICS.register("add", "sub")
    def _arith(ctx, op, a, b): ...

Registering a name twice is an error, so every op has one definition per
stage, found by grepping its name.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Callable, Iterator


class OpTable(MutableMapping):
    """Op name -> entry (the registered function, or `entry(fn, **options)`); names missing here come from `base`."""

    def __init__(self, what: str, base: "OpTable | None" = None, entry: Callable[..., Any] | None = None):
        self.what = what            # in messages: "NVPTX lowering for op 'mma' defined twice"
        self.base = base
        self.entry = entry
        self._own: dict[str, Any] = {}

    def register(self, *names: str, **options) -> Callable[[Callable], Callable]:
        """Register the decorated function for ops `names` (with `options` for `entry`)."""

        def register(fn: Callable) -> Callable:
            value = self.entry(fn, **options) if self.entry is not None else fn
            for name in names:
                self[name] = value
            return fn

        return register

    def own(self) -> frozenset[str]:
        """The ops this table defines itself (not through `base`)."""
        return frozenset(self._own)

    def __setitem__(self, name: str, value: Any) -> None:
        if name in self:
            raise RuntimeError(f"{self.what} for op {name!r} defined twice")
        self._own[name] = value

    def __delitem__(self, name: str) -> None:
        del self._own[name]

    def __getitem__(self, name: str) -> Any:
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

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"<OpTable {self.what}: {len(self)} ops>"
