"""Math functions on NVIDIA GPUs: CUDA's libdevice when it is found, MUFU approximations otherwise.

With libdevice, exp/exp2/log/log2/rsqrt/sin/cos/tanh/erf and float `rem`
(fmod) call `__nv_*` (IEEE-accurate to a few ulp), lane by lane, and the
LLVM optimizer (`llvm/optimize.py`) links the functions in. Without it, f32 uses the hardware
approximations in `intrinsics.APPROX` (exp and log go through base 2), f64
rsqrt is 1 / sqrt (both correctly rounded), and f64 transcendental
functions, `erf` and float `rem` are rejected by the validator
(`math_support`).
"""

from __future__ import annotations

import math

from llvmlite import ir

from tessera.ir import dtypes as dt

from ..llvm.ops import EXACT_MATH, float_constant
from ..llvm.types import F64
from . import intrinsics
from .intrinsics import APPROX, FAST_APPROX, LIBDEVICE

assert set(LIBDEVICE) >= set(APPROX) | {"erf", "rem"}


def math_support(name: str, dtype: dt.DType, has_libdevice: bool) -> str | None:
    """Why math op `name` on `dtype` cannot be lowered (None when it can)."""
    if has_libdevice or name in EXACT_MATH or name == "sigmoid" and dtype != dt.f64:
        return None
    if name == "rsqrt" and dtype == dt.f64:
        return None  # 1 / sqrt, both correctly rounded
    if name in APPROX and dtype != dt.f64:
        return None
    what = "float `rem` (fmod)" if name == "rem" else f"`{name}` on {dtype.name}"
    return (f"{what} needs CUDA's libdevice, which this compile does not use (none was found, or "
            f"libdevice=False); install the CUDA toolkit or "
            f"`pip install nvidia-nvvm` (CUDA 13) / `nvidia-cuda-nvcc-cu12`, or set TESSERA_LIBDEVICE "
            f"to libdevice.10.bc")


def libdevice_call(lw, op_name: str, args) -> ir.Value:
    """`__nv_<op>` of scalar `args`, recorded so the optimizer links it in."""
    return lw.call_library(intrinsics.declare_libdevice(lw.module, op_name, args[0].type), args)


def math_function(lw, name: str, x: ir.Value, use_libdevice: bool, fast: bool = False) -> ir.Value:
    """Math function `name` of f32 or f64 values `x` (scalar or vector); `fast` (a fast-math kernel): the
    flush-to-zero approximations (`FAST_APPROX`) where there is one."""
    bld = lw.builder
    element = x.type.element if isinstance(x.type, ir.VectorType) else x.type
    fast = fast and element != F64 and name in FAST_APPROX
    if use_libdevice and not fast:
        return lw.map_lanes(lambda v: libdevice_call(lw, name, [v]), x)
    if name == "rsqrt" and element == F64:
        return bld.fdiv(float_constant(x.type, 1.0), lw.intrinsic("llvm.sqrt", [x], (x.type,)))
    approx = (FAST_APPROX if fast else APPROX)[name]
    if name == "exp":  # e^x = 2^(x log2 e)
        x = bld.fmul(x, float_constant(x.type, 1 / math.log(2)))
    result = lw.map_lanes(lambda v: lw.intrinsic(approx, [v]), x)
    if name == "log":  # ln x = log2(x) ln 2
        result = bld.fmul(result, float_constant(x.type, math.log(2)))
    return result


def fmod(lw, a: ir.Value, b: ir.Value) -> ir.Value:
    """Float `rem` through libdevice's fmod (exact, unlike LLVM's frem expansion)."""
    return lw.map_lanes(lambda p, q: libdevice_call(lw, "rem", [p, q]), a, b)
