"""Small helpers every kernel author reaches for, usable in kernels and on the host."""

from __future__ import annotations

from .function import func


@func
def cdiv(a, b):
    """Ceiling division `(a + b - 1) // b` for non-negative integers: how many blocks of b cover a."""
    return (a + b - 1) // b


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (host helper: tile sizes must be powers of two)."""
    if n < 1:
        return 1
    return 1 << (n - 1).bit_length()
