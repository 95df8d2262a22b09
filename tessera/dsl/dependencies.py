"""What a kernel's compiled code depends on besides its own source.

The binary cache key must change when a helper the kernel calls changes, or
when a module-level constant it reads changes (`BLOCK = 128` at the top of
the file). Both are found statically from the AST — names and `module.name`
attributes resolved in the function's globals and closure — so a launch can
compute its cache key, and hit the disk cache, without tracing the kernel.
"""

from __future__ import annotations

import ast
import types
from typing import Any

from ..ir.dtypes import DType
from .function import DeviceFunction
from .source import KernelSource
from .values import constexpr

CONSTANT_TYPES = (bool, int, float, str, type(None), DType)


def kernel_dependencies(source: KernelSource) -> tuple[list[str], dict[str, Any]]:
    """(source hashes of every @tessera.func reached, transitively; constants read from globals by name)."""
    callees: dict[str, str] = {}
    constants: dict[str, Any] = {}
    _visit(source, callees, constants, seen=set())
    return sorted(callees.values()), dict(sorted(constants.items()))


def _visit(source: KernelSource, callees: dict, constants: dict, seen: set) -> None:
    if id(source) in seen:
        return
    seen.add(id(source))
    namespace = {**source.globals, **source.closure_vars()}
    for name, value in _referenced(source.tree, namespace):
        if isinstance(value, DeviceFunction):
            callees[f"{value.fn.__module__}.{value.__name__}"] = value.source.source_hash
            _visit(value.source, callees, constants, seen)
        elif isinstance(value, constexpr):
            constants[name] = value.value
        elif isinstance(value, CONSTANT_TYPES) or (
                isinstance(value, tuple) and all(isinstance(v, CONSTANT_TYPES) for v in value)):
            constants[name] = value


def _referenced(tree: ast.AST, namespace: dict[str, Any]):
    """(dotted name, value) for every global name and module attribute the code mentions."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in namespace:
            yield node.id, namespace[node.id]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = namespace.get(node.value.id)
            if isinstance(module, types.ModuleType) and hasattr(module, node.attr):
                yield f"{node.value.id}.{node.attr}", getattr(module, node.attr)
