"""The Python source of a kernel or helper function, parsed once.

`KernelSource` holds what the tracer needs to trace a function: its
AST, where it lives (file and line offset, for error messages), its globals
(to resolve names like `tessera`, `BLOCK` or a helper function), and the
names and annotations of its parameters. It also hashes the source, so the
binary cache can tell when a kernel (or a helper it calls) changed.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import UnsupportedSyntaxError


@dataclass
class KernelSource:
    fn: Callable[..., Any]
    tree: ast.FunctionDef            # line numbers already shifted to the file's
    file: str
    source_lines: list[str]          # the whole file, for error messages
    param_names: list[str]
    constexpr_params: frozenset[str]
    defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.fn.__name__

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        """The function's signature, built once (launches bind arguments against it)."""
        return inspect.signature(self.fn)

    @property
    def globals(self) -> dict[str, Any]:
        return self.fn.__globals__

    def closure_vars(self) -> dict[str, Any]:
        """Values of variables captured from enclosing functions (constexprs only, in kernels)."""
        code = self.fn.__code__
        cells = self.fn.__closure__ or ()
        return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(ast.unparse(self.tree).encode()).hexdigest()

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> "KernelSource":
        try:
            lines, first_line = inspect.getsourcelines(fn)
            file = inspect.getsourcefile(fn) or "<unknown>"
        except (OSError, TypeError) as exc:
            raise UnsupportedSyntaxError(
                f"cannot read the source of {getattr(fn, '__name__', fn)!r}: kernels must be defined in a file "
                f"(not typed into an interactive prompt or built with exec)", kernel=getattr(fn, "__name__", None)
            ) from exc
        text = "".join(lines)
        dedented = textwrap.dedent(text)
        indent = len(lines[0]) - len(lines[0].lstrip()) if dedented != text else 0
        module = ast.parse(dedented)
        ast.increment_lineno(module, first_line - 1)
        if indent:  # columns must point into the file's lines, which keep their indentation
            for node in ast.walk(module):
                if hasattr(node, "col_offset"):
                    node.col_offset += indent
                    if getattr(node, "end_col_offset", None) is not None:
                        node.end_col_offset += indent
        tree = next(node for node in module.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
        if isinstance(tree, ast.AsyncFunctionDef):
            raise UnsupportedSyntaxError("kernels cannot be async functions", kernel=fn.__name__,
                                         file=file, line=tree.lineno, column=tree.col_offset)
        # decorators are Python's business, not the kernel body's
        tree.decorator_list = []
        try:
            with open(file, encoding="utf-8") as f:
                file_lines = f.read().splitlines()
        except OSError:
            file_lines = []
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        constexprs = frozenset(p.name for p in params if _is_constexpr_annotation(p.annotation, fn))
        defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        return cls(fn, tree, file, file_lines, [p.name for p in params], constexprs, defaults)


def _is_constexpr_annotation(annotation: Any, fn: Callable[..., Any]) -> bool:
    """True for `tessera.constexpr` (the class or an instance), also when annotations are strings."""
    from .values import constexpr
    if annotation is inspect.Parameter.empty:
        return False
    if isinstance(annotation, str):
        return annotation.split(".")[-1] == "constexpr"
    return annotation is constexpr or isinstance(annotation, constexpr)
