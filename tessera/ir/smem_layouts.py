"""Shared-memory layouts: tile coordinate -> element offset, with XOR swizzles.

An `SmemLayout` is strides over a shape (row-major, column-major, padded rows,
or any strides) followed by an optional `Swizzle` of the element offset:

    offset(coord) = swizzle(sum(coord[d] * strides[d]))

`Swizzle(bits, base, shift)` is CuTe's Swizzle<B, M, S>: it XORs the `bits`-bit
field of the offset at bit `base + shift` into the field at bit `base`,

    swizzle(o) = o ^ ((o >> shift) & (((1 << bits) - 1) << base))

With `shift >= bits` the two fields do not overlap, so the swizzle is its own
inverse and permutes every aligned block of 2**(base + bits) offsets; a
swizzled compact layout whose size is a multiple of that block is a bijection
onto [0, size). In element units for elements of `e` bytes, `base = log2(16/e)`
makes the permuted unit a 16-byte chunk; `swizzle_bytes(128, e)` is the TMA /
wgmma 128-byte swizzle (Swizzle<3,4,3> on bytes; Swizzle(3,3,3) for f16):
16-byte chunk c of row r (rows of 128 bytes) moves to chunk c ^ (r % 8).

`bank_conflicts` scores an access pattern against banks of 4-byte words
(32 by default; the target's `shared_memory_banks`).
Text form: `row_major(64,64)`, `row_major(64,64,pad=8)`, `col_major(32,32)`,
`strided(shape=[4,8],strides=[1,4])`, each optionally `.swizzle(3,3,3)`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from tessera.ir.layouts import LayoutError, parse_call_chain


@dataclass(frozen=True)
class Swizzle:
    """XOR the `bits`-bit field at bit base + shift into the field at bit base."""

    bits: int
    base: int
    shift: int

    def __post_init__(self) -> None:
        if not (self.bits >= 1 and self.base >= 0 and self.shift >= self.bits):
            raise LayoutError(f"{self}: need bits >= 1, base >= 0 and shift >= bits")

    def __call__(self, offset: Any) -> Any:
        mask = ((1 << self.bits) - 1) << self.base
        if isinstance(offset, (int, np.integer)):
            return int(offset) ^ ((int(offset) >> self.shift) & mask)
        o = np.asarray(offset, np.int64)
        return o ^ ((o >> self.shift) & mask)

    @property
    def block(self) -> int:
        """The swizzle permutes each aligned block of this many offsets."""
        return 1 << (self.base + self.bits)

    def __str__(self) -> str:
        return f"swizzle({self.bits},{self.base},{self.shift})"


def swizzle_bytes(nbytes: int, element_bytes: int) -> Swizzle:
    """The 32/64/128-byte swizzle (TMA, wgmma, CuTe SW32/64/128) in element units.

    16-byte chunks are permuted within each group of `nbytes`, keyed by the
    128-byte row index: Swizzle<log2(nbytes/16), 4, 3> on byte offsets.
    """
    if nbytes not in (32, 64, 128) or element_bytes not in (1, 2, 4, 8, 16):
        raise LayoutError(f"swizzle_bytes({nbytes}, {element_bytes}): need 32/64/128 bytes of 1..16-byte elements")
    return Swizzle(int(math.log2(nbytes // 16)), 4 - int(math.log2(element_bytes)), 3)


@dataclass(frozen=True)
class SmemLayout:
    """Element offsets of a tile in shared memory; see the module docstring."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    swizzle: Swizzle | None = None

    def __post_init__(self) -> None:
        shape, strides = tuple(int(s) for s in self.shape), tuple(int(s) for s in self.strides)
        if len(shape) != len(strides) or any(n < 1 for n in shape) or any(s < 0 for s in strides):
            raise LayoutError(f"smem layout needs positive sizes and non-negative strides, got {shape}:{strides}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "strides", _normal_strides(shape, strides))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __call__(self, *coord: Any) -> Any:
        """Offset of `coord` (one int or array per dim; arrays broadcast)."""
        if len(coord) != self.rank:
            raise LayoutError(f"{self}: expected {self.rank} coordinates, got {len(coord)}")
        offset = sum((c * s for c, s in zip(coord, self.strides)), 0)
        return self.swizzle(offset) if self.swizzle else offset

    def offsets(self) -> np.ndarray:
        """The offset of every coordinate: an int array of `shape`."""
        grids = np.meshgrid(*(np.arange(n) for n in self.shape), indexing="ij")
        return np.asarray(self(*grids), np.int64).reshape(self.shape)

    @property
    def cosize(self) -> int:
        """Elements to allocate: one past the largest offset."""
        return int(self.offsets().max()) + 1

    @property
    def is_bijective(self) -> bool:
        """Whether the offsets are exactly 0 .. size-1 (no padding, no aliasing)."""
        return bool(np.array_equal(np.sort(self.offsets().ravel()), np.arange(self.size)))

    def with_swizzle(self, bits: int, base: int, shift: int) -> SmemLayout:
        if self.swizzle is not None:
            raise LayoutError(f"{self} is already swizzled")
        return SmemLayout(self.shape, self.strides, Swizzle(bits, base, shift))

    def __str__(self) -> str:
        text = _strided_text(self.shape, self.strides)
        return f"{text}.{self.swizzle}" if self.swizzle else text


def row_major(*shape: int, pad: int = 0) -> SmemLayout:
    """Last dim contiguous; rows (the last dim) padded to shape[-1] + pad elements."""
    return SmemLayout(shape, _compact_strides(shape, pad, reverse=False))


def col_major(*shape: int, pad: int = 0) -> SmemLayout:
    """First dim contiguous; columns padded to shape[0] + pad elements."""
    return SmemLayout(shape, _compact_strides(shape, pad, reverse=True))


def strided(shape: tuple[int, ...], strides: tuple[int, ...]) -> SmemLayout:
    return SmemLayout(tuple(shape), tuple(strides))


def parse_smem_layout(text: str) -> SmemLayout:
    """Inverse of `str(smem_layout)`."""
    calls = parse_call_chain(text)
    try:
        (name, args, kwargs), rest = calls[0], calls[1:]
        if name in ("row_major", "col_major") and set(kwargs) <= {"pad"} and all(isinstance(a, int) for a in args):
            layout = (row_major if name == "row_major" else col_major)(*args, **kwargs)
        elif name == "strided" and not args and set(kwargs) == {"shape", "strides"}:
            layout = strided(kwargs["shape"], kwargs["strides"])
        else:
            raise LayoutError(f"unknown smem layout {name}(...)")
        if rest:
            (name, args, kwargs), *more = rest
            if name != "swizzle" or kwargs or more or len(args) != 3:
                raise LayoutError("only one .swizzle(bits,base,shift) may follow")
            layout = layout.with_swizzle(*args)
        return layout
    except (LayoutError, TypeError) as e:
        raise LayoutError(f"bad smem layout {text!r}: {e}") from None


def bank_conflicts(layout: SmemLayout, access: Any, element_bytes: float, banks: int = 32) -> int:
    """Worst bank-conflict degree of one warp-wide access; 1 means conflict-free.

    `access` holds each thread's coordinates: (threads, rank) for one element
    per thread, or (threads, vector, rank) for a vector access. Shared memory
    has `banks` banks of 4-byte words (word w is in bank w % banks: 32 on
    NVIDIA and on AMD gfx90a/gfx942 LDS, 64 on gfx950) and serves at most
    4 * banks bytes per phase, threads taken in order: with 32 banks, 32
    threads per phase for <= 4 bytes per thread, 16 for 8 bytes, 8 for 16
    bytes. Within a phase threads reading the same word share it
    (broadcast); the degree is the largest number of distinct words any bank
    must serve. Returns the worst phase's degree.
    """
    acc = np.asarray(access, np.int64)
    if acc.ndim == 2:
        acc = acc[:, None, :]
    if acc.ndim != 3 or acc.shape[-1] != layout.rank:
        raise LayoutError(f"access must be (threads, [vector,] {layout.rank}) coordinates, got {acc.shape}")
    bits = round(element_bytes * 8)
    offsets = np.asarray(layout(*np.moveaxis(acc, -1, 0)), np.int64).reshape(acc.shape[:2])
    per_thread = acc.shape[1] * bits // 8
    phase = banks if per_thread <= 4 else max(1, 4 * banks // per_thread)
    worst = 0
    for start in range(0, len(offsets), phase):
        first_bit = offsets[start : start + phase].ravel() * bits
        words = {w for lo, hi in zip(first_bit // 32, (first_bit + bits - 1) // 32) for w in range(lo, hi + 1)}
        worst = max(worst, max(Counter(w % banks for w in words).values(), default=0))
    return worst


def _compact_strides(shape: tuple[int, ...], pad: int, reverse: bool) -> tuple[int, ...]:
    if pad < 0:
        raise LayoutError(f"pad must be non-negative, got {pad}")
    dims = list(reversed(range(len(shape)))) if not reverse else list(range(len(shape)))
    strides, step = [0] * len(shape), 1
    for k, d in enumerate(dims):
        strides[d] = step
        step *= shape[d] + (pad if k == 0 else 0)
    return tuple(strides)


def _normal_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of size-1 dims never matter; store them as 0 so == compares maps."""
    return tuple(0 if n == 1 else s for n, s in zip(shape, strides))


def _strided_text(shape: tuple[int, ...], strides: tuple[int, ...]) -> str:
    dims = ",".join(map(str, shape))
    if not shape:
        return "row_major()"
    for name, reverse in (("row_major", False), ("col_major", True)):
        inner = shape[0] if reverse else shape[-1]
        outer = [d for d in (range(1, len(shape)) if reverse else range(len(shape) - 1)) if shape[d] > 1]
        pads = [0]
        if shape and inner > 1 and outer:
            pads.append(strides[outer[0] if reverse else outer[-1]] - inner)
        for pad in pads:
            if pad >= 0 and _normal_strides(shape, _compact_strides(shape, pad, reverse)) == strides:
                return f"{name}({dims}{f',pad={pad}' if pad else ''})"
    return f"strided(shape=[{dims}],strides=[{','.join(map(str, strides))}])"
