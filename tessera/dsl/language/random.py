"""Random numbers from a counter: Philox4x32-10, the same stream as Triton's `tl.rand` / `tl.randint`.

    r = tessera.rand(seed, offsets)        # f32 in [0, 1), one per offset
    keep = r > p                           # dropout without storing a mask: recompute it in backward

A counter-based generator has no state: the value for (seed, offset) is a
pure function of the two, so any program may draw any element, in any
order, and get the same number (Salmon et al., "Parallel Random Numbers: As
Easy as 1, 2, 3", SC'11). Philox4x32 enciphers the 128-bit counter
(c0, c1, c2, c3) under the 64-bit key (k0, k1) by `rounds` Feistel-like rounds

    c0, c1, c2, c3 = hi(M1 * c2) ^ c1 ^ k0,  lo(M1 * c2),  hi(M0 * c0) ^ c3 ^ k1,  lo(M0 * c0)
    k0, k1         = k0 + W0,  k1 + W1                        (all arithmetic mod 2**32)

where hi/lo are the halves of the 64-bit product (`umulhi` and `*`). The
mapping from (seed, offset) is Triton's, so kernels ported from Triton draw
bit-for-bit the same integers and uniform floats: the key is the seed as
u64 split into low and high words, and the counter is (offset's low 32 bits,
its high 32 bits -- zero for 32-bit offsets --, 0, 0). `randn` uses
Box-Muller on two of the words; its last bits follow each target's `log`,
`sqrt` and `cos`.
"""

from __future__ import annotations

from typing import Any

from ...ir.dtypes import f32, i32, u32, u64
from .. import operators
from ..constexpr_args import describe, static_int
from ..errors import TypeMismatchError
from ..promotion import PromotionError
from ..values import Context, Tensor, builtin

ROUND_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)    # M0, M1 (Salmon et al., table 2)
KEY_INCREMENTS = (0x9E3779B9, 0xBB67AE85)       # W0, W1: the golden ratio and sqrt(3) - 1, as 32-bit fractions
DEFAULT_ROUNDS = 10
UNIFORM_SCALE = 4.6566127342e-10                # the largest s with (2**31 - 1) * s < 1 in f32: rand never gives 1.0
TWO_PI = 6.283185307179586
SMALLEST_UNIFORM = 1.0e-7                       # Box-Muller's log(u1) needs u1 > 0


@builtin
def umulhi(ctx: Context, a, b) -> Tensor:
    """umulhi(a, b): the high N bits of the 2N-bit product of N-bit integers a and b, lane by lane.

    The operands' bits are read as unsigned numbers (for i32, -1 is 2**32 - 1);
    they broadcast and promote like `a * b`, whose value is the low N bits.
    One `mul.hi` instruction on NVIDIA GPUs, `v_mul_hi_u32` on AMD ones.
    """
    for x in (a, b):
        if not operators.is_number_operand(x):
            ctx.error(f"umulhi needs integers, got {describe(x)}", TypeMismatchError)
    shape = operators.common_shape(ctx, "take umulhi of", a, b)
    try:
        dtype = operators.common_dtype(a, b)
    except PromotionError as exc:
        ctx.error(f"cannot take umulhi of {describe(a)} and {describe(b)}: {exc}", TypeMismatchError)
    if not dtype.is_int:
        ctx.error(f"umulhi needs integers, got {describe(a)} and {describe(b)}; cast floats with .to(tessera.u32)",
                  TypeMismatchError)
    x, y = (operators.fit(ctx, v, dtype, shape) for v in (a, b))
    return operators.emit(ctx, "umulhi", x, y)


@builtin
def randint4x(ctx: Context, seed, offset, n_rounds=DEFAULT_ROUNDS) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """randint4x(seed, offset, n_rounds=10) -> four u32 tiles shaped like `offset`: the whole Philox block.

    `seed` is an integer scalar (a kernel argument or a Python int); `offset`
    an integer tile (or scalar), typically `base + tessera.arange(0, BLOCK)`:
    equal (seed, offset) pairs give equal numbers, distinct offsets
    independent ones. 64-bit offsets use both counter words they fill. The
    cheapest way to draw several streams: one call, four numbers per offset.
    """
    return tuple(_philox(ctx, seed, offset, n_rounds))


@builtin
def randint(ctx: Context, seed, offset, n_rounds=DEFAULT_ROUNDS) -> Tensor:
    """randint(seed, offset, n_rounds=10) -> u32 tile: the first word of `randint4x` (Triton's `tl.randint`)."""
    return _philox(ctx, seed, offset, n_rounds)[0]


@builtin
def rand(ctx: Context, seed, offset, n_rounds=DEFAULT_ROUNDS) -> Tensor:
    """rand(seed, offset, n_rounds=10) -> f32 tile, uniform in [0, 1) (Triton's `tl.rand`, bit for bit)."""
    return _uniform(ctx, _philox(ctx, seed, offset, n_rounds)[0])


@builtin
def rand4x(ctx: Context, seed, offset, n_rounds=DEFAULT_ROUNDS) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """rand4x(seed, offset, n_rounds=10) -> four independent f32 tiles uniform in [0, 1), for one Philox call."""
    return tuple(_uniform(ctx, word) for word in _philox(ctx, seed, offset, n_rounds))


@builtin
def randn(ctx: Context, seed, offset, n_rounds=DEFAULT_ROUNDS) -> Tensor:
    """randn(seed, offset, n_rounds=10) -> f32 tile, standard normal (Box-Muller on the first two words)."""
    words = _philox(ctx, seed, offset, n_rounds)
    return _box_muller(ctx, _uniform(ctx, words[0]), _uniform(ctx, words[1]))[0]


@builtin
def randn4x(ctx: Context, seed, offset, n_rounds=DEFAULT_ROUNDS) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """randn4x(seed, offset, n_rounds=10) -> four f32 tiles, standard normal, for one Philox call."""
    u = [_uniform(ctx, word) for word in _philox(ctx, seed, offset, n_rounds)]
    return (*_box_muller(ctx, u[0], u[1]), *_box_muller(ctx, u[2], u[3]))


# ---------------------------------------------------------------------------
# The generator


def _philox(ctx: Context, seed: Any, offset: Any, n_rounds: Any) -> list[Tensor]:
    """The four u32 words of Philox4x32-`n_rounds` for key `seed` and counter (offset lo, offset hi, 0, 0)."""
    rounds = static_int(ctx, n_rounds, "n_rounds")
    if rounds < 1:
        ctx.error(f"n_rounds must be at least 1, got {rounds} (10 is the standard Philox4x32-10)")
    offset = _offset(ctx, offset)
    k0, k1 = _key(ctx, seed)
    c0 = operators.cast(ctx, offset, u32)
    c1 = operators.cast(ctx, operators.binary(ctx, ">>", offset, 32), u32) if offset.dtype.bits > 32 else 0
    c2 = c3 = 0
    (m0, m1), (w0, w1) = ROUND_MULTIPLIERS, KEY_INCREMENTS
    b = lambda op, x, y: operators.binary(ctx, op, x, y)          # noqa: E731
    hi = lambda m, x: umulhi.impl(ctx, m, _word(ctx, x))         # noqa: E731
    for _ in range(rounds):
        c0, c1, c2, c3 = (b("^", b("^", hi(m1, c2), c1), k0), b("*", m1, _word(ctx, c2)),
                          b("^", b("^", hi(m0, c0), c3), k1), b("*", m0, _word(ctx, c0)))
        k0, k1 = b("+", k0, w0), b("+", k1, w1)
    # words that only ever met scalars (the zero counter words, after one round) are stretched to offset's shape
    return [operators.broadcast_to_shape(ctx, _word(ctx, c), offset.shape) for c in (c0, c1, c2, c3)]


def _word(ctx: Context, x: Any) -> Tensor:
    """A counter word as a traced u32 (the Python 0 the counter starts with becomes a constant)."""
    return operators.to_tensor(ctx, x, u32)


def _offset(ctx: Context, offset: Any) -> Tensor:
    if not isinstance(offset, Tensor) and not (operators.is_python_number(offset) and isinstance(offset, int)):
        ctx.error(f"the offset of a random number must be an integer tile or scalar, got {describe(offset)}",
                  TypeMismatchError)
    offset = operators.to_tensor(ctx, offset)
    if offset.dtype is None or not offset.dtype.is_int:
        ctx.error(f"the offset of a random number must be an integer tile or scalar, got {offset.type}; "
                  f"e.g. base + tessera.arange(0, BLOCK)", TypeMismatchError)
    return offset


def _key(ctx: Context, seed: Any) -> tuple[Any, Any]:
    """The Philox key: the seed as a u64 (as a cast converts it), split into its low and high u32 words."""
    if isinstance(seed, int) and not isinstance(seed, bool):
        value = seed % 2 ** 64
        return operators.constant(ctx, value & 0xFFFFFFFF, u32), operators.constant(ctx, value >> 32, u32)
    if not isinstance(seed, Tensor) or seed.dtype is None or not seed.dtype.is_int or seed.is_tile:
        ctx.error(f"the seed of a random number must be an integer scalar (a kernel argument or a Python int), "
                  f"got {describe(seed)}", TypeMismatchError)
    wide = operators.cast(ctx, seed, u64)
    low = operators.cast(ctx, operators.binary(ctx, "&", wide, 0xFFFFFFFF), u32)
    return low, operators.cast(ctx, operators.binary(ctx, ">>", wide, 32), u32)


# ---------------------------------------------------------------------------
# From words to distributions


def _uniform(ctx: Context, word: Tensor) -> Tensor:
    """A u32 word as an f32 in [0, 1): as i32, negatives folded onto 0..2**31-1 (-x - 1), times UNIFORM_SCALE."""
    x = operators.cast(ctx, word, i32, bitcast=True)
    folded = operators.emit(ctx, "select", operators.compare(ctx, "<", x, 0),
                            operators.binary(ctx, "-", operators.unary(ctx, "-", x), 1), x)
    return operators.binary(ctx, "*", folded, UNIFORM_SCALE)


def _box_muller(ctx: Context, u1: Tensor, u2: Tensor) -> tuple[Tensor, Tensor]:
    """Two independent standard normals from two uniforms: r cos(theta), r sin(theta)."""
    u1 = operators.emit(ctx, "max", u1, operators.constant(ctx, SMALLEST_UNIFORM, f32, u1.shape))
    theta = operators.binary(ctx, "*", TWO_PI, u2)
    radius = operators.emit(ctx, "sqrt", operators.binary(ctx, "*", -2.0, operators.emit(ctx, "log", u1)))
    return (operators.binary(ctx, "*", radius, operators.emit(ctx, "cos", theta)),
            operators.binary(ctx, "*", radius, operators.emit(ctx, "sin", theta)))
