"""Math functions on AMD GPUs, from LLVM intrinsics and short expansions (no device library is linked).

| op            | f32 (f16/bf16 compute in f32)                          | f64        |
| ------------- | ------------------------------------------------------ | ---------- |
| exp, exp2, log, log2 | `llvm.<op>.f32` (LLVM's AMDGPU lowering: ~1 ulp)  | rejected   |
| sin, cos      | `llvm.sin/cos.f32` (`v_sin/v_cos_f32` on x / 2pi: a few ulp near 0, accuracy drops for |x| >> 1e3) | rejected |
| rsqrt         | 1 / sqrt(x), both correctly rounded (<= 1 ulp)          | same       |
| tanh          | odd Taylor polynomial for |x| < 0.125, else sign(x) (1 - 2 / (exp(2|x|) + 1)) (relative error ~1e-6) | rejected |
| erf           | Taylor series for |x| < 0.5, else Abramowitz-Stegun 7.1.26 (absolute error <= 2e-7) | rejected |
| rem (fmod)    | scalar `frem`, which LLVM 22 expands for AMDGPU into an exact loop | same (exact) |

f64 transcendental functions need a device math library (ROCm's OCML), which
this backend does not link yet: the validator rejects them by name rather
than letting LLVM abort on a missing libcall. `tests/backends/test_amdgpu_math.py`
runs these very expansions on the host CPU against numpy.
"""

from __future__ import annotations

import math

from llvmlite import ir

from tessera.ir import dtypes as dt

from ..llvm.ops import EXACT_MATH, float_constant
from .intrinsics import NATIVE_MATH

EXPANDED_MATH = ("rsqrt", "tanh", "erf")
F64_MATH = ("rsqrt",)  # what f64 supports besides EXACT_MATH and rem

# erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)), for |x| < 0.5 (last term < 1e-9 relative)
_ERF_TAYLOR = [(-1) ** n / (math.factorial(n) * (2 * n + 1)) * 2 / math.sqrt(math.pi) for n in range(7)]
# Abramowitz & Stegun 7.1.26: erf(x) = 1 - t (a1 + t (a2 + ...)) exp(-x^2), t = 1 / (1 + p x), x >= 0
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
# tanh(x) = x - x^3/3 + 2x^5/15 - 17x^7/315 + 62x^9/2835 for |x| < 0.125 (next term < 1e-12 relative)
_TANH_TAYLOR = (1.0, -1 / 3, 2 / 15, -17 / 315, 62 / 2835)


def math_support(name: str, dtype: dt.DType) -> str | None:
    """Why math op `name` on `dtype` cannot be lowered for AMDGPU (None when it can)."""
    if name in EXACT_MATH or name == "rem" or dtype != dt.f64 or name in F64_MATH:
        return None
    return (f"`{name}` on f64 needs a device math library (ROCm's OCML), which the AMDGPU backend does not "
            f"link yet; compute it in f32 (cast to f32 first)")


def math_function(lw, name: str, x: ir.Value) -> ir.Value:
    """Math function `name` of f32 (or, for rsqrt, f64) values `x` (scalar or vector)."""
    bld = lw.builder
    if name in NATIVE_MATH:
        return lw.intrinsic(f"llvm.{name}", [x], (x.type,))
    if name == "rsqrt":
        return bld.fdiv(float_constant(x.type, 1.0), lw.intrinsic("llvm.sqrt", [x], (x.type,)))
    if name == "tanh":
        return _tanh(lw, x)
    if name == "erf":
        return _erf(lw, x)
    raise KeyError(f"no AMDGPU lowering for math function {name!r}")  # the validator keeps this unreachable


def fmod(lw, a: ir.Value, b: ir.Value) -> ir.Value:
    """`frem` lane by lane: LLVM's exact AMDGPU expansion handles scalars only (a vector frem, as
    from bf16 registers, would reach instruction selection as a libcall and abort), and f32 ones whose
    operands are bf16 values widened by `fpext` would be shrunk back to a bfloat frem by InstCombine,
    which has no expansion either (the same abort: "no libcall available for frem"). Those operands are
    widened through their bits instead (a bf16 is the top half of an f32), which InstCombine leaves alone."""
    bld = lw.builder

    def operand(v):
        source = v.operands[0] if getattr(v, "opname", None) == "fpext" else None
        if source is None or "bfloat" not in str(source.type):
            return v
        count = source.type.count if isinstance(source.type, ir.VectorType) else None
        typed = (lambda t: ir.VectorType(t, count)) if count else (lambda t: t)   # noqa: E731
        bits = bld.zext(bld.bitcast(source, typed(ir.IntType(16))), typed(ir.IntType(32)))
        shift = ir.Constant(typed(ir.IntType(32)), [16] * count if count else 16)
        return bld.bitcast(bld.shl(bits, shift), typed(ir.FloatType()))
    return lw.map_lanes(lambda p, q: bld.frem(p, q), operand(a), operand(b))


def _polynomial(bld, x, coefficients):
    """c0 + x (c1 + x (c2 + ...)) by Horner's rule."""
    t = x.type
    result = float_constant(t, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        result = bld.fadd(bld.fmul(result, x), float_constant(t, c))
    return result


def _magnitude(lw, x):
    return lw.intrinsic("llvm.fabs", [x], (x.type,))


def _with_sign_of(bld, x, magnitude):
    """`magnitude` (>= 0) with x's sign (select keeps NaN and -0 handling simple: the magnitude carries NaN)."""
    negative = bld.fcmp_ordered("<", x, float_constant(x.type, 0.0))
    return bld.select(negative, bld.fneg(magnitude), magnitude)


def _tanh(lw, x):
    bld = lw.builder
    a = _magnitude(lw, x)
    small = bld.fcmp_ordered("<", a, float_constant(x.type, 0.125))
    near_zero = bld.fmul(x, _polynomial(bld, bld.fmul(x, x), _TANH_TAYLOR))
    e = lw.intrinsic("llvm.exp", [bld.fmul(a, float_constant(x.type, 2.0))], (x.type,))
    one = float_constant(x.type, 1.0)
    large = bld.fsub(one, bld.fdiv(float_constant(x.type, 2.0), bld.fadd(e, one)))  # exp -> inf gives 1
    return bld.select(small, near_zero, _with_sign_of(bld, x, large))


def _erf(lw, x):
    bld = lw.builder
    a = _magnitude(lw, x)
    small = bld.fcmp_ordered("<", a, float_constant(x.type, 0.5))
    near_zero = bld.fmul(x, _polynomial(bld, bld.fmul(x, x), _ERF_TAYLOR))
    one = float_constant(x.type, 1.0)
    t = bld.fdiv(one, bld.fadd(one, bld.fmul(a, float_constant(x.type, _AS_P))))
    series = bld.fmul(t, _polynomial(bld, t, _AS_A))
    gauss = lw.intrinsic("llvm.exp", [bld.fneg(bld.fmul(a, a))], (x.type,))
    large = bld.fsub(one, bld.fmul(series, gauss))
    return bld.select(small, near_zero, _with_sign_of(bld, x, large))
