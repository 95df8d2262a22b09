"""Fragment order: W's codes stored so that each thread of the decode GEMM loads exactly its mma B fragments.

The decode kernel (16 rows of x, BN columns of W, BK of K per step, 4
warps) multiplies on mma.sync m16n8k16, whose B operand, the (BK, BN) tile
W^T, lives in registers in the layout the compiler's mma plan gives it
(`FragmentTiling.b_layout`, the same as `passes.mma.mma_plan` for 16-row
tiles; a test holds them equal):

    local(BK / 16, RN) . spatial(1, WN) . mma_m16n8k16_b()

Thread t holds L = BK * BN / threads codes of it, in register order.
`pack(..., layout="fragment")` stores each (BN, BK) block of W's codes as
`threads` rows of those L codes (`to_fragment_order`), so thread t's codes
are one contiguous run of L * bits / 8 bytes: 128-bit loads, in register
order, straight into the registers the mma reads. The kernel loads the
block as a (threads, L) tile pinned to `load_layout` (row t in thread t)
and re-reads it as (BN, BK) with `reshape(digits) -> permute(order) ->
reshape((BN, BK))`; layout assignment derives the operand's layout through
those shape ops (the thread and register digits, regrouped), which is
`b_layout` itself, so the dot needs no conversion: no shared memory, no
shuffles. The low-bit pass unpacks the loaded bytes in registers, and the
scales and zeros load straight into the layout they broadcast from
(`scale_layout`).

The stored array keeps the plain layout's byte count and [N, K * bits / 8]
shape; only the order of the codes inside it changes. Any width works
(L * bits / 8 bytes a thread: 32 for 4 bits, 64 for 8); 3-bit runs of 24
bytes are read 4 bytes at a time. On sm_90a the decode dot (16 rows) stays
on mma.sync, so the same order serves; wgmma (64-row tiles) reads B only
from shared memory, so there the order buys nothing unless the product is
swapped (y^T = W x^T) to make W wgmma's register A operand.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from tessera import layouts

MMA_N, MMA_K, WARP = 8, 16, 32


@dataclass(frozen=True)
class FragmentTiling:
    """The (BN, BK) block and warps of the decode kernel that a fragment-order weight is stored for."""

    BN: int = 64
    BK: int = 128
    num_warps: int = 4

    def __post_init__(self) -> None:
        threads = self.num_warps * WARP
        if self.BK % MMA_K or self.BN % (MMA_N * self.num_warps) or self.BN * self.BK % threads:
            raise ValueError(f"quant fragment order: BK ({self.BK}) must be a multiple of {MMA_K} and BN "
                             f"({self.BN}) a multiple of {MMA_N} x num_warps ({self.num_warps}), so that every "
                             f"warp owns whole m16n8k16 B fragments")

    @property
    def threads(self) -> int:
        return self.num_warps * WARP

    @property
    def locals(self) -> int:
        """Codes per thread per block (L)."""
        return self.BN * self.BK // self.threads

    @cached_property
    def b_layout(self) -> layouts.RegisterLayout:
        """The (BK, BN) mma.sync B operand layout of a 16-row dot with these tiles: the warps split N (a 16-row
        tile has one m16 fragment), each holding RN n8 fragments of every k16 step."""
        rn = self.BN // MMA_N // self.num_warps
        return (layouts.local(self.BK // MMA_K, rn) * layouts.spatial(1, self.num_warps)
                * layouts.mma_m16n8k16_b())

    @cached_property
    def load_layout(self) -> layouts.RegisterLayout:
        """The stored (threads, L) block: thread t holds row t, register i column i."""
        return layouts.spatial(self.threads, 1) * layouts.local(1, self.locals)

    @cached_property
    def digits(self) -> tuple[int, ...]:
        """The (threads, L) block viewed as the digits of the thread index, then of the register index (major
        first): each digit is one mode of b_layout, i.e. one digit of k or n."""
        b = self.b_layout
        if not b.is_bijective:
            raise ValueError(f"quant fragment order: {b} replicates B over warps; use BN >= 8 x num_warps")
        return tuple(b.sizes[e] for e in b.spatial_modes) + tuple(b.sizes[e] for e in b.local_modes)

    @cached_property
    def order(self) -> tuple[int, ...]:
        """The permutation of `digits` that lists n's digits, then k's, each major first: the (BN, BK) block
        once reshaped."""
        b = self.b_layout
        position = {e: i for i, e in enumerate(list(b.spatial_modes) + list(b.local_modes))}
        k_modes, n_modes = b.dim_mode_ids
        return tuple(position[e] for e in n_modes + k_modes)

    def scale_layout(self, group_size: int) -> layouts.RegisterLayout:
        """The (BN, BK / G) block of scales (or zeros) in the layout from which they broadcast over the codes'
        groups without moving: thread t holds the scales of its own columns and groups, once each."""
        groups = max(self.BK // group_size, 1)
        codes = self.b_layout.permute((1, 0)).reshape((self.BN, groups, self.BK // groups))
        return codes.reduce(2, keepdims=False)

    def constexprs(self, group_size: int) -> Mapping[str, Any]:
        """The decode kernel's FRAGMENT / LOAD_LAYOUT / DIGITS / ORDER / SCALE_LAYOUT constexprs (read-only).

        Kept per group size: deriving the scale layout costs ~100 µs of layout algebra, which every call of
        the op would otherwise pay, and the same layout objects make the launch's key compare by identity."""
        known = self.__dict__.setdefault("_constexprs", {})     # frozen: the cache lives in the instance dict
        found = known.get(group_size)
        if found is None:
            found = known[group_size] = MappingProxyType(dict(
                FRAGMENT=True, LOAD_LAYOUT=self.load_layout, DIGITS=self.digits, ORDER=self.order,
                SCALE_LAYOUT=self.scale_layout(group_size)))
        return found

    # -- the permutation --------------------------------------------------------------------

    @cached_property
    def source(self) -> tuple[np.ndarray, np.ndarray]:
        """(n, k) inside the block of register i of thread t, as [threads, L] arrays (b_layout.map)."""
        t, i = np.meshgrid(np.arange(self.threads), np.arange(self.locals), indexing="ij")
        k, n = self.b_layout.map(t, i)
        return n, k

    def fits(self, n: int, k: int, group_size: int) -> bool:
        """Whether an [n, k] weight with groups of `group_size` along K can be stored for these tiles."""
        return n % self.BN == 0 and k % self.BK == 0 and (self.BK % group_size == 0 or group_size % self.BK == 0)

    def check(self, n: int, k: int, who: str = "quant.pack(layout='fragment')") -> None:
        """ValueError (naming `who`) unless an [n, k] weight is made of whole blocks."""
        if n % self.BN or k % self.BK:
            raise ValueError(f"{who}: N ({n}) must be a multiple of {self.BN} and K ({k}) of {self.BK}; use "
                             f"layout='plain' for this weight")

    def to_fragment_order(self, codes: np.ndarray) -> np.ndarray:
        """codes [N, K] -> [N / BN, K / BK, threads, L]: block (a, b)'s row t is thread t's registers."""
        n, k = codes.shape
        self.check(n, k)
        blocks = codes.reshape(n // self.BN, self.BN, k // self.BK, self.BK).transpose(0, 2, 1, 3)
        rows, cols = self.source
        return blocks[:, :, rows, cols]

    def from_fragment_order(self, stored: np.ndarray) -> np.ndarray:
        """The inverse of `to_fragment_order`: [N / BN, K / BK, threads, L] -> codes [N, K]."""
        nb, kb = stored.shape[:2]
        blocks = np.empty((nb, kb, self.BN, self.BK), stored.dtype)
        rows, cols = self.source
        blocks[:, :, rows, cols] = stored
        return blocks.transpose(0, 2, 1, 3).reshape(nb * self.BN, kb * self.BK)


DECODE_TILING = FragmentTiling()     # quant_gemm's decode plan: 16 x 64 tiles of y, 128 of K a step, 4 warps
