"""Index math of register layouts, shared by every lowering: digits, register maps, strides (pure functions).

Under a layout, element coordinate d of (thread t, register j) is a sum over
the layout's modes of digit * (mode stride in the dim), each digit taken
from t or from j (`layout_digits`). So any linear function of the
coordinates, sum_d w_d * coord_d (a flat index, a shared-memory address, an
arange), splits into a *thread part*, computed once per kernel from
`thread_id` (`thread_index.ThreadIndex`), plus a *register part*, a
constant per register (`local_parts`). Moving a tile to another layout is a
renaming of registers when `register_map` finds the same source registers in
every thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from tessera.ir import dtypes as dt
from tessera.ir.layouts import RegisterLayout


@dataclass(frozen=True)
class Digit:
    """One digit of a layout: a mode (or a replication) read from the thread or the register index."""

    spatial: bool
    dim: int            # -1 for a replication digit
    size: int
    stride: int         # in the thread index (spatial) or the register index (local)
    dim_stride: int     # coordinate step along `dim` per unit of the digit (0 for replication)


@lru_cache(maxsize=None)
def layout_digits(layout: RegisterLayout) -> tuple[Digit, ...]:
    """Every digit of `layout`: spatial ones (replication included), then local ones."""
    sizes = layout.sizes
    dim_of, dim_stride = {}, {}
    for d, ids in enumerate(layout.dim_mode_ids):
        step = 1
        for e in reversed(ids):
            dim_of[e], dim_stride[e] = d, step
            step *= sizes[e]
    out = []
    for entries, spatial in ((layout.spatial_modes, True), (layout.local_modes, False)):
        stride = 1
        for e in reversed(entries):
            size = sizes[e] if e >= 0 else -e
            if e >= 0:
                out.append(Digit(spatial, dim_of[e], size, stride, dim_stride[e]))
            else:
                out.append(Digit(True, -1, size, stride, 0))
            stride *= size
    return tuple(out)


@lru_cache(maxsize=None)
def local_parts(layout: RegisterLayout) -> np.ndarray:
    """(registers, rank) coordinates each register holds in thread 0 (whose thread digits are all 0)."""
    return layout.table()[0]


@lru_cache(maxsize=4096)
def register_map(src: RegisterLayout, dst: RegisterLayout, weights: tuple[int, ...]) -> tuple[int, ...] | None:
    """Registers of `src` that give each register of `dst`, the same in every thread; None if there are none.

    Register j of `dst` must hold source element number sum_k weights[k] * coord_k
    (row-major in the source) of its own coordinates.
    """
    if src.num_threads != dst.num_threads:
        return None
    threads = np.arange(src.num_threads)[:, None]
    src_flat = (src.table() * np.asarray(row_major_strides(src.shape), np.int64)).sum(-1)
    holder = np.full((src.num_threads, math.prod(src.shape)), -1, np.int64)
    holder[threads, src_flat] = np.arange(src.local_size)[None, :]
    wanted = (dst.table() * np.asarray(weights, np.int64)).sum(-1)
    need = holder[threads, wanted]
    if (need < 0).any() or (need != need[0]).any():
        return None
    return tuple(int(i) for i in need[0])


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def shared_vector_width(layout: RegisterLayout, weights: Sequence[int], bits: int, max_vector_bits: int) -> int:
    """Registers of `bits` bits one shared-memory access may move when register j of `layout` goes to element
    sum_d w_d * coord_d: a power of two of registers contiguous along the dim of weight 1 (the last, or
    another: a tile stored transposed, e.g. a K-contiguous B into an N x K buffer) that every other weight
    keeps aligned, at most `max_vector_bits` wide."""
    if not layout.rank or 1 not in weights:
        return 1
    dim = layout.rank - 1 if weights[-1] == 1 else list(weights).index(1)
    k = min(layout.local_contiguity(dim), max(1, max_vector_bits // max(bits, 8)))
    k = 1 << (k.bit_length() - 1)
    while k > 1 and any(w % k for d, w in enumerate(weights) if d != dim):
        k //= 2
    return k


def shared_dtype(dtype: dt.DType) -> dt.DType:
    """What a value of `dtype` is kept as in shared memory: sub-byte types widen to a byte (ints) or f32
    (floats), so that threads never share a byte; everything else is kept as is."""
    if dtype.bits >= 8:
        return dtype
    if dtype.is_float:
        return dt.f32
    return dt.i8 if dtype.is_signed else dt.u8
