"""`Launch`: one kernel launch as the fusion pass sees it, and its IR-text form.

A launch is a tile-IR function, its grid, and a binding: for each parameter
the name of the buffer or scalar it receives. Two parameters (of one launch
or of two) bound to the same name receive the same buffer or the same
scalar value; different names are different, non-overlapping buffers (the
caller guarantees it, or lists overlapping names in `aliased`). `writes_all`
names buffers the launch is declared to write in full (library ops whose
coverage the IR cannot show, such as the GEMM's output).

In IR text, a launch is a function with attributes `grid` and `bind` (and
`writes_all`), and a sequence of launches is a module in launch order:

    func @scale(%x: ptr<f32>, %y: ptr<f32>, %n: i32) attributes {bind = ["a", "t", "n"], grid = [4]} {...}
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.ir.core import Function, Module
from tessera.ir.types import PointerType, element_of

LAUNCH_ATTRS = ("grid", "bind", "writes_all")


@dataclass
class Launch:
    fn: Function
    grid: tuple[int, ...]
    bind: tuple[str, ...]                    # one name per parameter of fn
    writes_all: frozenset[str] = field(default_factory=frozenset)
    sources: tuple[str, ...] = ()            # the launches fused into this one, by kernel name
    origin: tuple[int, ...] = ()             # and by their positions in the caller's sequence

    def __post_init__(self):
        if len(self.bind) != len(self.fn.args):
            raise ValueError(f"launch of @{self.fn.name}: {len(self.bind)} bound names for {len(self.fn.args)} "
                             f"parameters")
        self.grid = tuple(self.grid) + (1,) * (3 - len(self.grid))
        if not self.sources:
            self.sources = (self.fn.name,)

    @property
    def name(self) -> str:
        return self.fn.name

    def buffers(self) -> set[str]:
        """Names bound to pointer parameters."""
        return {n for n, a in zip(self.bind, self.fn.args) if isinstance(element_of(a.type), PointerType)}


def launches_from_module(module: Module) -> list[Launch]:
    """The launches a module of functions with `grid` and `bind` attributes describes, in order."""
    launches = []
    for fn in module.functions:
        if "grid" not in fn.attrs or "bind" not in fn.attrs:
            raise ValueError(f"function @{fn.name} has no `grid` and `bind` attributes: not a launch")
        attrs = {k: v for k, v in fn.attrs.items() if k not in LAUNCH_ATTRS}
        launch_fn = Function(fn.name, fn.body, attrs, fn.loc)
        launches.append(Launch(launch_fn, tuple(fn.attrs["grid"]), tuple(fn.attrs["bind"]),
                               frozenset(fn.attrs.get("writes_all", ()))))
    return launches


def module_from_launches(launches: list[Launch]) -> Module:
    """The IR-text form of `launches`: their functions, each with its grid and binding as attributes."""
    functions = []
    for launch in launches:
        attrs = dict(launch.fn.attrs, grid=_short_grid(launch.grid), bind=tuple(launch.bind))
        if launch.writes_all:
            attrs["writes_all"] = tuple(sorted(launch.writes_all))
        functions.append(Function(launch.fn.name, launch.fn.body, attrs, launch.fn.loc))
    return Module(functions)


def _short_grid(grid: tuple[int, ...]) -> tuple[int, ...]:
    """(4, 1, 1) -> (4,): trailing axes of size 1 dropped."""
    grid = list(grid)
    while len(grid) > 1 and grid[-1] == 1:
        grid.pop()
    return tuple(grid)


def scalar_value(name: str):
    """The value a scalar binding names: "#4096" -> 4096, "#0.5" -> 0.5; None for other names (buffers, or
    scalars whose value the caller does not state)."""
    if not name.startswith("#"):
        return None
    text = name[1:]
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None
