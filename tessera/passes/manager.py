"""Run passes over a module in order, verifying and recording the IR between them.

    pm = PassManager([Canonicalize(), CSE(), DCE()], dump=True)     # or default_tile_passes() (tile_passes.py)
    module = pm.run(module)
    for name, text in pm.dumps: ...     # ("input", ...), then one entry per pass

A pass is anything with a `name` and `run(module)` that returns the new
module or None after changing it in place; a plain function
`def my_pass(module)` works too and is named after itself. With
`verify_each`, the input and the output of every pass are verified, so an
invalid module is blamed on the pass that produced it.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from tessera.ir.core import Module
from tessera.ir.errors import VerifyError
from tessera.ir.printer import print_module
from tessera.ir.verifier import verify_module


class Pass(Protocol):
    """One transformation of a module: in place (return None) or returning the new one."""

    name: str

    def run(self, module: Module) -> Module | None: ...


class FunctionPass:
    """A pass that rewrites every function of a module in place with `rewrite(fn)`.

    Subclasses set `name` and `rewrite` (a function of one IR function):

        class DCE(FunctionPass):
            name = "dce"
            rewrite = staticmethod(dce_function)
    """

    name: str
    rewrite: Callable

    def run(self, module: Module) -> None:
        for fn in module.functions:
            self.rewrite(fn)


DumpSink = Callable[[str, str], None]


class PassManager:
    """Runs `passes` in order.

    verify_each: verify the input and the result of every pass.
    dump: None to record nothing; True to keep `(pass name, IR text)` in
      `self.dumps` (the input first, named "input"); or a callable that is
      given each pair as well (e.g. to write files for TESSERA_DUMP).
    """

    def __init__(self, passes: Sequence[Pass | Callable[[Module], Module | None]],
                 verify_each: bool = True, dump: bool | DumpSink | None = None):
        self.passes = list(passes)
        self.verify_each = verify_each
        self.dump = dump
        self.dumps: list[tuple[str, str]] = []

    def run(self, module: Module) -> Module:
        self.dumps = []
        self._check(module, "input", "the input to the pass manager is invalid")
        for p in self.passes:
            name = pass_name(p)
            result = getattr(p, "run", p)(module)
            module = module if result is None else result
            self._check(module, name, f"pass '{name}' produced invalid IR")
        return module

    def _check(self, module: Module, name: str, blame: str) -> None:
        if self.verify_each:
            try:
                verify_module(module)
            except VerifyError as e:
                raise VerifyError(f"{blame}: {e}") from e
        if self.dump:
            text = print_module(module, locations=True)
            self.dumps.append((name, text))
            if callable(self.dump):
                self.dump(name, text)


def pass_name(p) -> str:
    """A pass's `name`, or a function's own name."""
    return getattr(p, "name", None) or getattr(p, "__name__", type(p).__name__)
