"""Philox4x32 in numpy, written from Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3" (SC'11),
and Triton's documented use of it (`tl.randint`, `tl.rand`): the reference `tessera.rand` and friends are
tested against. `test_random.py` checks it against the Random123 known-answer vectors first."""

from __future__ import annotations

import numpy as np

MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
WEYL = (0x9E3779B9, 0xBB67AE85)
LOW32 = np.uint64(0xFFFFFFFF)


def philox4x32(counter, key, rounds: int = 10) -> list[np.ndarray]:
    """The four output words (uint32 arrays) for counter words `counter` (4 arrays or ints) and key (k0, k1)."""
    c = [np.asarray(word, np.uint64) & LOW32 for word in counter]
    k0, k1 = (np.uint64(int(k) & 0xFFFFFFFF) for k in key)
    for round_index in range(rounds):
        if round_index:
            k0, k1 = (k0 + np.uint64(WEYL[0])) & LOW32, (k1 + np.uint64(WEYL[1])) & LOW32
        p0 = np.uint64(MULTIPLIERS[0]) * c[0]          # < 2**64: exact
        p1 = np.uint64(MULTIPLIERS[1]) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & LOW32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & LOW32]
    return [word.astype(np.uint32) for word in c]


def randint4x(seed: int, offsets: np.ndarray, rounds: int = 10) -> list[np.ndarray]:
    """Triton's mapping: key = the seed as u64 in (low, high) words; counter = (offset's low 32 bits, its high
    32 bits for 64-bit offsets, 0, 0)."""
    seed %= 2 ** 64
    offsets = np.asarray(offsets)
    wide = offsets.astype(np.int64).astype(np.uint64) if offsets.dtype.kind == "i" else offsets.astype(np.uint64)
    # bits 32..63 of the offset: the low word of an arithmetic or a logical shift alike
    high = wide >> np.uint64(32) if offsets.dtype.itemsize == 8 else np.zeros_like(wide)
    return philox4x32([wide, high, 0, 0], (seed & 0xFFFFFFFF, seed >> 32), rounds)


def uniform(words: np.ndarray) -> np.ndarray:
    """u32 words -> f32 in [0, 1): as i32, negatives folded (-x - 1), times the f32 scale 4.6566127342e-10."""
    x = words.view(np.int32)
    folded = np.where(x < 0, ~x, x)       # ~x == -x - 1, without overflow at -2**31
    return folded.astype(np.float32) * np.float32(4.6566127342e-10)


def normal(u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """Box-Muller's first output, in float64 (the kernels compute it in f32)."""
    u1 = np.maximum(np.float32(1.0e-7), u1).astype(np.float64)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2 * np.pi * u2.astype(np.float64))
