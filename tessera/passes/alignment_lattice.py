"""The facts of the alignment analysis (`AxisInfo`, `ViewInfo`) and their lattice.

The facts (per dimension d of a tile; a scalar has only `element_divisibility`)
-------------------------------------------------------------------------------
Along d the lanes fall into aligned groups: indices [k*G, (k+1)*G). For every
lane index i (other coordinates fixed):

* contiguity C: within each aligned group of C lanes, each value is the
  previous plus one step (1 for integers, one element for pointers);
* divisibility D: the value at every lane with i[d] % C == 0 (each group's
  first lane) is divisible by D. With C == 1 that is every lane. Integers
  count in units, pointers in BYTES (a pointer to f32 element k of a
  16-byte aligned array has divisibility gcd(16, 4k));
* constancy K: within each aligned group of K lanes all values are equal;
* element_divisibility E: divides every lane (for a scalar: the value);
* constant: the exact value when every lane holds it; nonnegative: every
  lane is >= 0 (this is what makes C-style `div`/`rem` facts sound).

All of C, K, D and E are powers of two. C and K are at most the largest
power of two dividing the dimension; D and E are capped at
MAX_DIVISIBILITY (2**12), so 0 is "divisible by 4096". A group of g < C
lanes of a run starts g steps apart, so its first value is divisible by
min(D, g steps) (`AxisInfo.divisibility_at`); rules use that whenever they
regroup, which Triton's rules do not (they claim 132 divisible by 128 for
[0, 1, 2, 3] + [128]*4 regrouped in fours).

Facts hold for the values as computed in the IR's fixed-width types:
divisibility and constancy survive wrap-around, contiguity and
nonnegativity assume that index arithmetic does not overflow.

Lattice: per dim, C, D, K and E form chains of powers of two; a fact is
weaker when smaller, and 1 (`unknown`) is the bottom. The join (`join`)
of two facts at a control-flow merge keeps what both guarantee:
C = min, K = min, D = min of `divisibility_at(d, C)` of both, E = min,
constant if equal, nonnegative if both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

MAX_DIVISIBILITY = 1 << 12


def pow2_divisor(n: int) -> int:
    """The largest power of two dividing `n`, at most MAX_DIVISIBILITY (0 is divisible by all)."""
    return MAX_DIVISIBILITY if n == 0 else min(n & -n, MAX_DIVISIBILITY)


def group_cap(size: int) -> int:
    """Contiguity and constancy along a dim are at most the largest power of two dividing its size."""
    return size & -size


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def pow2_at_most(n: int) -> int:
    """The largest power of two <= n (1 for n < 1); 128 bits of a 3-bit type: 128 // 3 = 42 -> 32 elements."""
    return 1 << (max(n, 1).bit_length() - 1)


@dataclass(frozen=True)
class AxisInfo:
    """What holds for every lane of an integer, bool or pointer value (see the module docstring)."""

    contiguity: tuple[int, ...]
    divisibility: tuple[int, ...]
    constancy: tuple[int, ...]
    element_divisibility: int = 1
    constant: int | None = None
    nonnegative: bool = False
    pointee_bits: int = 0        # pointers: the pointee's width; divisibility is then in bytes

    @property
    def rank(self) -> int:
        return len(self.contiguity)

    def steps_divisibility(self, n: int) -> int:
        """A power of two dividing the distance covered by `n` contiguous steps (1 for pointers into sub-byte
        elements whose run does not end on a byte)."""
        if not self.pointee_bits:
            return min(n, MAX_DIVISIBILITY)
        return max(1, min(n * (self.pointee_bits & -self.pointee_bits) // 8, MAX_DIVISIBILITY))

    def divisibility_at(self, dim: int, group: int) -> int:
        """A power of two dividing the value at every lane whose index along `dim` is a multiple of `group`."""
        c, d = self.contiguity[dim], self.divisibility[dim]
        if c == 1 or group % c == 0:
            return d
        return min(d, self.steps_divisibility(group))

    def __str__(self) -> str:
        text = f"divisibility={self.element_divisibility}"
        if self.rank:
            text = (f"contiguity={list(self.contiguity)} divisibility={list(self.divisibility)} "
                    f"constancy={list(self.constancy)} element_divisibility={self.element_divisibility}")
        if self.constant is not None:
            text += f" constant={self.constant}"
        return text + (" nonnegative" if self.nonnegative else "")


@dataclass(frozen=True)
class ViewInfo:
    """What is known about a tensor view: base alignment (bytes), size and stride divisibility (elements)."""

    base_divisibility: int
    size_divisibility: tuple[int, ...]
    stride_divisibility: tuple[int, ...]
    unit_stride: tuple[bool, ...]        # the stride is the constant 1

    @staticmethod
    def unknown(rank: int) -> "ViewInfo":
        return ViewInfo(1, (1,) * rank, (1,) * rank, (False,) * rank)


Facts = Union[AxisInfo, ViewInfo]


# ---------------------------------------------------------------------------
# Building facts


def make_info(shape: tuple[int, ...], contiguity, divisibility, constancy, element_divisibility: int = 1,
              constant: int | None = None, nonnegative: bool = False, pointee_bits: int = 0) -> AxisInfo:
    """An AxisInfo with the invariants restored: bounds, caps, and divisibility shared between dims."""
    if constant is not None:
        p = pow2_divisor(constant)
        return AxisInfo((1,) * len(shape), (p,) * len(shape), tuple(group_cap(s) for s in shape),
                        p, constant, constant >= 0, pointee_bits)
    raw = AxisInfo(tuple(contiguity), tuple(divisibility), tuple(constancy), 1, None, nonnegative, pointee_bits)
    C, D, K = [], [], []
    e = min(element_divisibility, MAX_DIVISIBILITY)
    for dim, size in enumerate(shape):
        cap = group_cap(size)
        c = min(raw.contiguity[dim], cap)
        C.append(c)
        D.append(min(raw.divisibility_at(dim, c), MAX_DIVISIBILITY))
        K.append(min(raw.constancy[dim], cap))
    for c, d in zip(C, D):
        if c == 1:          # every lane is a group start: d divides every lane
            e = max(e, d)
    D = [max(d, e) for d in D]
    return AxisInfo(tuple(C), tuple(D), tuple(K), e, None, nonnegative, pointee_bits)


def unknown(shape: tuple[int, ...], pointee_bits: int = 0, nonnegative: bool = False) -> AxisInfo:
    """Nothing known beyond the trivial: every fact 1."""
    ones = (1,) * len(shape)
    return AxisInfo(ones, ones, ones, 1, None, nonnegative, pointee_bits)


def constant_info(shape: tuple[int, ...], value: int) -> AxisInfo:
    return make_info(shape, (), (), (), constant=value)


def join(a: Facts | None, b: Facts | None) -> Facts | None:
    """What holds of a value that is either `a` or `b` (a control-flow merge)."""
    if a is None or b is None:
        return None
    if isinstance(a, ViewInfo):
        return ViewInfo(min(a.base_divisibility, b.base_divisibility),
                        tuple(map(min, a.size_divisibility, b.size_divisibility)),
                        tuple(map(min, a.stride_divisibility, b.stride_divisibility)),
                        tuple(x and y for x, y in zip(a.unit_stride, b.unit_stride)))
    if a == b or (a.constant is not None and a.constant == b.constant):
        return a
    C = [min(x, y) for x, y in zip(a.contiguity, b.contiguity)]
    D = [min(a.divisibility_at(d, c), b.divisibility_at(d, c)) for d, c in enumerate(C)]
    K = [min(x, y) for x, y in zip(a.constancy, b.constancy)]
    no_caps = (1 << 62,) * a.rank      # both sides already respect the real shape's caps
    return make_info(no_caps, C, D, K, min(a.element_divisibility, b.element_divisibility), None,
                     a.nonnegative and b.nonnegative, a.pointee_bits)
