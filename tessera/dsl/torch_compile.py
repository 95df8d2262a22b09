"""How torch.compile sees Tessera: a kernel launch is called, never traced.

Dynamo (torch.compile's tracer) would otherwise trace a launch's Python --
binding, the compiler, numpy -- and fail with an internal error, or compile
it into a graph that computes something else. Two things keep it out:

* `dynamo_opaque(fn)` marks a launch entry point (`kernel[grid]`, `kernel(...)`,
  the warm path's entries) the way `torch.compiler.disable` does, without
  importing torch: torch.compile calls it outside the graph and, under
  `fullgraph=True`, says to make the launching function a PyTorch op with
  `tessera.torch.op`;
* the packages a launch runs (dsl, ir, passes, backends, runtime) are added
  to Dynamo's skipped files when Dynamo is first imported (an import hook
  waits for it; torch itself is never imported here), so the frames of a
  launch that runs outside the graph run as plain Python. `kernels_lib` and
  `tessera.torch` stay traceable: their ops belong in graphs.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Callable

DYNAMO_MESSAGE = ("a tessera kernel launch runs outside the graph: make the function that launches it a PyTorch op "
                  "with @tessera.torch.op(...) to keep it inside torch.compile(fullgraph=True)")
_TRACE_RULES = "torch._dynamo.trace_rules"
_SKIPPED_PACKAGES = ("tessera.dsl", "tessera.ir", "tessera.passes", "tessera.backends", "tessera.runtime")


def dynamo_opaque(fn: Callable) -> Callable:
    """Mark `fn` so torch.compile calls it outside the graph instead of tracing it (see the module docstring)."""
    fn._torchdynamo_disable = True
    fn._torchdynamo_disable_msg = DYNAMO_MESSAGE
    return fn


def _skip_tessera_frames(trace_rules) -> None:
    for package in _SKIPPED_PACKAGES:
        trace_rules.add(package)


class _WhenDynamoLoads(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when Dynamo's trace rules are being imported, it wraps their loader so the
    tessera packages are skipped as soon as the module exists."""

    def find_spec(self, name, path, target=None):
        if name != _TRACE_RULES:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_module(module, run=run):
                    run(module)
                    _skip_tessera_frames(module)
                spec.loader.exec_module = exec_module
                return spec
        return None


def install() -> None:
    """Skip tessera's launch frames in Dynamo now if it is loaded, else when it is (idempotent)."""
    if _TRACE_RULES in sys.modules:
        _skip_tessera_frames(sys.modules[_TRACE_RULES])
    elif not any(isinstance(f, _WhenDynamoLoads) for f in sys.meta_path):
        sys.meta_path.insert(0, _WhenDynamoLoads())
