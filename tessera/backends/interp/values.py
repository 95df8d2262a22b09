"""Runtime values that are not plain numbers: pointers and tensor views.

Scalars and tiles of numbers are numpy arrays (0-d for scalars) of their
dtype's `compute_dtype`. A pointer, or a tile of pointers, is `Pointers`: one
`Memory` and an int64 array of element offsets into it (0-d for a scalar
pointer). A tensor view is `View`: memory, base offset, sizes and strides in
elements, as plain ints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .storage import Memory


@dataclass(frozen=True, eq=False)
class Pointers:
    """Element offsets into one memory, one per lane (a 0-d array for a scalar pointer)."""

    memory: Memory
    offsets: np.ndarray  # int64

    @property
    def shape(self) -> tuple[int, ...]:
        return self.offsets.shape

    def __repr__(self) -> str:
        return f"Pointers({self.memory.name or 'memory'}, offsets={self.offsets.tolist()})"


@dataclass(frozen=True)
class View:
    """A strided tensor: element (i0, i1, ...) lives at base + sum(i_d * strides[d])."""

    memory: Memory
    base: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]


def map_lanes(value, fn: Callable[[np.ndarray], np.ndarray]):
    """Apply a lane-rearranging `fn` (reshape, broadcast, ...) to numbers or to pointer offsets."""
    if isinstance(value, Pointers):
        return Pointers(value.memory, fn(value.offsets))
    return fn(value)
