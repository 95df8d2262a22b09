"""Probing for vendor driver libraries without initializing them (so nothing can hang)."""

from __future__ import annotations

import ctypes


def any_library_loads(names: tuple[str, ...]) -> bool:
    """Whether one of the shared libraries `names` can be dlopen'ed."""
    for name in names:
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False
