"""`@tessera.func`: helper functions that kernels call and the compiler inlines."""

from __future__ import annotations

from typing import Any, Callable

from .source import KernelSource


class DeviceFunction:
    """A helper written in the kernel language; each call inside a kernel is inlined.

    Called from plain Python it runs the original function, so helpers that
    only combine constexprs stay usable on the host.
    """

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.source = KernelSource.of(fn)
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<tessera.func {self.__name__}>"


def func(fn: Callable[..., Any]) -> DeviceFunction:
    """Mark `fn` as a device helper function: `@tessera.func def combine(a, b): return a + b`."""
    return DeviceFunction(fn)
