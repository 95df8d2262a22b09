"""Block-scaled matrix multiplication: dot_scaled (OCP MX formats and NVFP4).

A block-scaled operand is a tile of small floats whose consecutive groups
of G elements along K share one scale. The product dequantizes each
operand in registers (value x scale, to bf16) and runs an ordinary `dot`:
the tensor cores of targets without native low-bit MMA (Hopper, AMD
CDNA3) then take bf16 fragments. Every dequantized value is exact in bf16
(fp4/fp6/fp8 have at most 4 significant bits and the scales are powers of
two (e8m0) or 4-bit e4m3), so the only rounding is the f32 accumulation.
"""

from __future__ import annotations

from typing import Any

from ...ir import dtypes as dt
from .. import operators
from ..constexpr_args import describe
from ..errors import TypeMismatchError
from ..values import Context, Tensor, builtin
from .linalg import dot
from .shape import broadcast_to, expand_dims, reshape

SCALED_VALUES = (dt.f8e4m3, dt.f8e5m2, dt.f6e2m3, dt.f6e3m2, dt.f4e2m1)   # the element types of MX and NVFP4
SCALES = (dt.e8m0, dt.f8e4m3)       # MX: e8m0 powers of two; NVFP4: e4m3
UNSCALED = (dt.bf16, dt.f16)        # an operand without a scale may also be one of these


@builtin
def dot_scaled(ctx: Context, a, a_scale, b, b_scale, acc=None, tensor_scale=None) -> Tensor:
    """dot_scaled(a, a_scale, b, b_scale, acc=None, tensor_scale=None) -> acc + s * (a . sa) @ (b . sb).

    `a` is an M x K tile and `b` a K x N tile of fp8 (e4m3, e5m2), fp6 (e2m3,
    e3m2) or fp4 (e2m1) values; element (m, k) of `a` is scaled by
    `a_scale[m, k // G]` and element (k, n) of `b` by `b_scale[k // G, n]`,
    where the group size G is K over the scales' K extent. The formats:

        MXFP8 / MXFP6 / MXFP4   e8m0 scales, G = 32
        NVFP4                   f8e4m3 scales, G = 16, and an f32 `tensor_scale`

    (any G that divides K works). A scale of None leaves that operand
    unscaled (it may then also be bf16 or f16). `tensor_scale`, an f32
    scalar, multiplies the product before it is added to `acc` (an M x N f32
    tile; zeros without one). Dequantization happens in registers, to bf16.
    """
    a = _operand(ctx, a, a_scale, "a", k_axis=1)
    b = _operand(ctx, b, b_scale, "b", k_axis=0)
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        ctx.error(f"cannot dot_scaled {a.shape} @ {b.shape}: the inner dimensions differ", TypeMismatchError)
    if tensor_scale is None:
        return dot.impl(ctx, a, b, acc)
    product = dot.impl(ctx, a, b, None, out_dtype=dt.f32)
    scaled = operators.binary(ctx, "*", product, operators.cast(ctx, tensor_scale, dt.f32))
    return scaled if acc is None else operators.binary(ctx, "+", acc, scaled)


def _operand(ctx: Context, x: Any, scale: Any, name: str, k_axis: int) -> Tensor:
    """Operand `x` dequantized to bf16: x.to(bf16) times its scales repeated over their groups along K."""
    if not isinstance(x, Tensor) or x.dtype is None or len(x.shape) != 2:
        ctx.error(f"dot_scaled needs a 2-D tile for {name}, got {describe(x)}", TypeMismatchError)
    allowed = SCALED_VALUES if scale is not None else SCALED_VALUES + UNSCALED
    if x.dtype not in allowed:
        ctx.error(f"dot_scaled's {name} must hold one of {', '.join(d.name for d in allowed)}, got {x.type}"
                  + ("" if scale is not None else "; cast wider types to bf16"), TypeMismatchError)
    values = operators.cast(ctx, x, dt.bf16)
    if scale is None:
        return values
    k = x.shape[k_axis]
    other = x.shape[1 - k_axis]
    if not isinstance(scale, Tensor) or scale.dtype not in SCALES or len(scale.shape) != 2:
        ctx.error(f"dot_scaled's {name}_scale must be a 2-D tile of e8m0 or f8e4m3 scales, got {describe(scale)}",
                  TypeMismatchError)
    groups = scale.shape[k_axis]
    if scale.shape[1 - k_axis] != other or k % groups:
        want = f"{other} x K/G" if k_axis == 1 else f"K/G x {other}"
        ctx.error(f"dot_scaled's {name}_scale is {scale.shape}, but {name} is {x.shape}: it must be {want} for a "
                  f"group size G dividing K = {k}", TypeMismatchError)
    size = k // groups
    spread = (other, groups, size) if k_axis == 1 else (groups, size, other)
    scales = operators.cast(ctx, scale, dt.bf16)
    scales = expand_dims.impl(ctx, scales, 2 if k_axis == 1 else 1)
    scales = reshape.impl(ctx, broadcast_to.impl(ctx, scales, spread), x.shape)
    return operators.binary(ctx, "*", values, scales)
