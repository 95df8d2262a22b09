"""`@tessera.func`: helper functions that kernels call and the compiler inlines."""

from __future__ import annotations

import inspect
import operator
from typing import Any, Callable

from .source import KernelSource


class DeviceFunction:
    """A helper written in the kernel language; each call inside a kernel is inlined.

    Called from plain Python it runs the original function, so helpers that
    only combine constexprs stay usable on the host. A helper is also a
    compile-time value: a kernel may take one as a constexpr argument and call
    it (the library's epilogue and prologue hooks), specialized on the helper's
    source and what it calls (`__tessera_key__`, part of the binary cache key).
    """

    __tessera_constexpr__ = True

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.source = KernelSource.of(fn)
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__

    # Called on the host (a grid function's `tessera.cdiv`), the helper is its function itself: the property
    # hands `fn` to the call, one Python frame fewer than a method forwarding the arguments.
    __call__ = property(operator.attrgetter("fn"))

    @property
    def __signature__(self) -> inspect.Signature:
        """The function's own signature (`inspect` and `help` would find only the `__call__` property)."""
        return inspect.signature(self.fn)

    def __tessera_key__(self) -> tuple:
        """What identifies the compiled helper: its qualified name, source hash, callees and globals read."""
        from .dependencies import kernel_dependencies

        callees, constants = kernel_dependencies(self.source)
        return (f"{self.fn.__module__}.{self.fn.__qualname__}", self.source.source_hash, tuple(callees),
                tuple(sorted(constants.items())))

    def __repr__(self) -> str:
        return f"<tessera.func {self.__name__}>"


def func(fn: Callable[..., Any]) -> DeviceFunction:
    """Mark `fn` as a device helper function: `@tessera.func def combine(a, b): return a + b`."""
    return DeviceFunction(fn)
