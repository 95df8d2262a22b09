"""Lane-by-lane ops -> LLVM: constants, arithmetic, bitwise, shifts, comparisons, math, select, casts.

Scalars and regs<N x T> (LLVM vectors) take the same path. The numerics are
the ones `tessera.ir.dtypes` and the interpreter define:

* integers wrap; `div`/`rem` truncate toward zero, and a zero divisor gives
  0 (as the interpreter does; LLVM would call it undefined), MIN / -1 = MIN;
* `shl`/`shr` by an amount outside [0, bits) give 0, or the sign fill for an
  arithmetic `shr` (LLVM and PTX would give poison / clamp);
* float `min`/`max` ignore a NaN operand (`llvm.minnum`/`maxnum`);
* float `ne` is unordered (NaN != x), the other comparisons ordered;
* float -> int casts saturate with NaN -> 0 (`llvm.fptosi.sat`), float ->
  float rounds to nearest even, f16 <-> bf16 goes through f32 (exact);
  small floats (fp8, fp6, fp4, e8m0: i8 bit patterns) convert through f32 with
  `small_floats.py` (exact, one rounding), fp8 and e8m0 to wider floats
  with `fast_dequant.py`'s bit tricks; sub-byte integers live in an i8,
  and every conversion to one wraps to its bits;
* math functions compute in f32 (f64 for f64) and round to the result type.
  sqrt is `llvm.sqrt` (correctly rounded), floor/ceil are exact and sigmoid
  is 1 / (1 + exp(-x)); the transcendental functions and float `rem` come
  from the dialect (`TargetDialect.math` / `float_rem`), whose
  `math_support` the validator asks first.
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.ops import op_names
from tessera.ir.types import scalar_dtype

from . import small_floats
from .fast_dequant import BF16, fast_half
from .codegen_table import codegen_for
from .types import (F32, F64, I32, SMALL_FLOATS, constant, int_constant, scalar_type, splat_constant, with_element,
                    wrap_sub_byte)

# Math the core lowers the same way on every target; the dialect supplies the rest.
EXACT_MATH = ("sqrt", "floor", "ceil")


# -- constants --------------------------------------------------------------------------


@codegen_for("constant")
def _constant(lw, op):
    return constant(op.result.type, op.attrs["value"])


def _dtype(op) -> dt.DType:
    return scalar_dtype(op.result.type)


def _zero(t: ir.Type) -> ir.Constant:
    return ir.Constant(t, None)


def float_constant(t: ir.Type, value: float) -> ir.Constant:
    elem = t.element if isinstance(t, ir.VectorType) else t
    return splat_constant(t, ir.Constant(elem, value))


# -- arithmetic -------------------------------------------------------------------------


@codegen_for("add", "sub", "mul", "div", "rem", "min", "max")
def _arith(lw, op, a, b):
    d, bld = _dtype(op), lw.builder
    if d.is_float:
        flags = lw.float_flags
        simple = {"add": bld.fadd, "sub": bld.fsub, "mul": bld.fmul, "div": bld.fdiv}
        if op.name in simple:
            return simple[op.name](a, b, flags=flags)
        if op.name == "rem":
            return _in_float_math_type(lw, d, lambda x, y: lw.dialect.float_rem(lw, x, y), a, b)
        return lw.intrinsic(f"llvm.{op.name}num", [a, b], (a.type,))
    if op.name in ("div", "rem"):
        return _int_divide(lw, op.name, a, b, d)
    if op.name in ("min", "max"):
        prefix = "s" if d.kind == "int" else "u"
        return lw.intrinsic(f"llvm.{prefix}{op.name}", [a, b], (a.type,))
    return {"add": bld.add, "sub": bld.sub, "mul": bld.mul}[op.name](a, b)


def _int_divide(lw, name: str, a, b, d: dt.DType):
    """a / b or a % b truncating toward zero; 0 where b == 0; MIN / -1 wraps to MIN (and % gives 0)."""
    bld = lw.builder
    zero, one = int_constant(a.type, 0), int_constant(a.type, 1)
    by_zero = bld.icmp_unsigned("==", b, zero)
    avoid = by_zero
    if d.kind == "int":
        overflow = bld.and_(bld.icmp_signed("==", a, int_constant(a.type, d.min_value)),
                            bld.icmp_signed("==", b, int_constant(a.type, -1)))
        avoid = bld.or_(by_zero, overflow)
    safe_b = bld.select(avoid, one, b)  # a / 1 = a = MIN / -1 wrapped, a % 1 = 0
    signed = d.kind == "int"
    if name == "div":
        q = bld.sdiv(a, safe_b) if signed else bld.udiv(a, safe_b)
    else:
        q = bld.srem(a, safe_b) if signed else bld.urem(a, safe_b)
    return bld.select(by_zero, zero, q)


@codegen_for("and", "or", "xor")
def _bitwise(lw, op, a, b):
    return {"and": lw.builder.and_, "or": lw.builder.or_, "xor": lw.builder.xor}[op.name](a, b)


@codegen_for("umulhi")
def _umulhi(lw, op, a, b):
    """Both zero-extended to twice the width, multiplied, the high half kept (mul.hi.u32 on NVIDIA,
    v_mul_hi_u32 on AMD; 64-bit ones through the 128-bit product)."""
    bld, bits = lw.builder, _dtype(op).bits
    wide = with_element(a.type, ir.IntType(2 * bits))
    product = bld.mul(bld.zext(a, wide), bld.zext(b, wide))
    return bld.trunc(bld.lshr(product, int_constant(wide, bits)), a.type)


@codegen_for("shl", "shr")
def _shift(lw, op, a, b):
    d, bld = _dtype(op), lw.builder
    out_of_range = bld.icmp_unsigned(">=", b, int_constant(b.type, d.bits))  # negative amounts too
    if op.name == "shl":
        return bld.select(out_of_range, _zero(a.type), bld.shl(a, b))
    if d.kind == "int":
        fill = bld.ashr(a, int_constant(a.type, d.bits - 1))
        return bld.select(out_of_range, fill, bld.ashr(a, b))
    return bld.select(out_of_range, _zero(a.type), bld.lshr(a, b))


_PREDICATES = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


@codegen_for("cmp")
def _cmp(lw, op, a, b):
    d, pred, bld = scalar_dtype(op.operands[0].type), _PREDICATES[op.attrs["pred"]], lw.builder
    if d.is_float:
        return bld.fcmp_unordered(pred, a, b) if pred == "!=" else bld.fcmp_ordered(pred, a, b)
    if d.kind == "int":
        return bld.icmp_signed(pred, a, b)
    return bld.icmp_unsigned(pred, a, b)  # unsigned integers and bool (false < true)


@codegen_for("neg")
def _neg(lw, op, x):
    if _dtype(op).is_float:
        return lw.builder.fneg(x)
    return lw.builder.sub(_zero(x.type), x)


@codegen_for("abs")
def _abs(lw, op, x):
    d = _dtype(op)
    if d.is_float:
        return lw.intrinsic("llvm.fabs", [x], (x.type,))
    if d.kind == "uint":
        return x
    return lw.intrinsic("llvm.abs", [x, ir.Constant(ir.IntType(1), 0)], (x.type,))


@codegen_for("not")
def _not(lw, op, x):
    return lw.builder.not_(x)  # xor with all ones: logical not for i1


@codegen_for("select")
def _select(lw, op, cond, a, b):
    return lw.builder.select(cond, a, b)


# -- math ---------------------------------------------------------------------------------


@codegen_for(*op_names(numerics="math"))
def _math(lw, op, x):
    return _in_float_math_type(lw, _dtype(op), lambda v: _math_in(lw, op.name, v), x)


def _in_float_math_type(lw, d: dt.DType, compute, *operands):
    """`compute` on the operands widened to f32 (f64 stays f64), rounded back to `d`."""
    work = F64 if d == dt.f64 else F32
    bld = lw.builder
    narrow = d in (dt.f16, dt.bf16)
    wide = [bld.fpext(v, with_element(v.type, work)) if narrow else v for v in operands]
    result = compute(*wide)
    return bld.fptrunc(result, operands[0].type) if narrow else result


def _math_in(lw, name: str, x):
    """Math function `name` on f32 or f64 values `x` (scalar or vector)."""
    bld = lw.builder
    if name in EXACT_MATH:
        return lw.intrinsic(f"llvm.{name}", [x], (x.type,))
    if name == "sigmoid":           # its division is approximate in a fast-math kernel, like `div`'s
        one = float_constant(x.type, 1.0)
        e = _math_in(lw, "exp", bld.fneg(x))
        return bld.fdiv(one, bld.fadd(one, e, flags=lw.float_flags), flags=lw.float_flags)
    return lw.dialect.math(lw, name, x)

# -- conversions ------------------------------------------------------------------------------


@codegen_for("cast")
def _cast(lw, op, x):
    return on_one_lane(lw, x, lambda v: convert(lw, v, scalar_dtype(op.operands[0].type), _dtype(op)))


def on_one_lane(lw, x, cast):
    """`cast(x)`, done on the scalar when `x` is one register (`<1 x T>`): LLVM 22's AMDGPU code generation loops
    forever on a `<1 x i64>` extension of a narrowed value (`(x + offs % 3).to(f64)` on a u32 x: the DAG combiner
    rewrites the v1i64 zero_extend into a BUILD_VECTOR and back, as for the one-register addptr in memory.py)."""
    if not (isinstance(x.type, ir.VectorType) and x.type.count == 1):
        return cast(x)
    bld = lw.builder
    lane = cast(bld.extract_element(x, int_constant(I32, 0)))
    return bld.insert_element(ir.Constant(ir.VectorType(lane.type, 1), None), lane, int_constant(I32, 0))


def convert(lw, x, src: dt.DType, dst: dt.DType):
    """`x` of dtype `src` as dtype `dst`, with the rules of `DType.quantize`."""
    if src == dst:
        return x
    if src in SMALL_FLOATS or dst in SMALL_FLOATS:
        return _convert_small_float(lw, x, src, dst)
    result = _convert(lw, x, src, dst)
    if dst.is_int and dst.is_subbyte:   # computed in the i8 that holds it: keep the type's bits
        result = wrap_sub_byte(lw.builder, result, dst)
    return result


def _convert(lw, x, src: dt.DType, dst: dt.DType):
    bld = lw.builder
    to = with_element(x.type, scalar_type(dst))
    if dst.is_bool:  # x != 0 (NaN counts as nonzero)
        if src.is_float:
            return bld.fcmp_unordered("!=", x, _zero(x.type))
        return bld.icmp_unsigned("!=", x, _zero(x.type))
    if src.is_bool:
        return bld.uitofp(x, to) if dst.is_float else bld.zext(x, to)
    if src.is_int and dst.is_int:   # by register width: sub-byte integers are held in an i8
        have, want = _int_width(x.type), _int_width(to)
        if want < have:
            return bld.trunc(x, to)
        if want > have:
            return bld.sext(x, to) if src.kind == "int" else bld.zext(x, to)
        return x
    if src.is_float and dst.is_float:
        if dst.bits == src.bits:  # f16 <-> bf16: f32 holds both exactly
            return bld.fptrunc(bld.fpext(x, with_element(x.type, F32)), to)
        return bld.fpext(x, to) if dst.bits > src.bits else bld.fptrunc(x, to)
    if src.is_float:
        signed = dst.kind == "int"
        result = lw.intrinsic("llvm.fptosi.sat" if signed else "llvm.fptoui.sat", [x], (to, x.type))
        if dst.is_subbyte:      # saturated to the i8's range: narrow it to the type's
            prefix = "s" if signed else "u"
            low, high = (int_constant(to, v) for v in (dst.min_value, dst.max_value))
            result = lw.intrinsic(f"llvm.{prefix}min", [result, high], (to,))
            if signed:
                result = lw.intrinsic("llvm.smax", [result, low], (to,))
        return result
    return _int_to_float(lw, x, src, dst, to)


def _convert_small_float(lw, x, src: dt.DType, dst: dt.DType):
    """Casts from and to small floats go through f32, which holds every value of theirs, so only the last step
    rounds."""
    bld = lw.builder
    if src in SMALL_FLOATS:
        fast = _fast_byte_float(lw, x, src, dst)
        if fast is not None:
            return fast
        return convert(lw, small_floats.decode(bld, x, src), dt.f32, dst)
    if src == dt.f64:
        return small_floats.encode(bld, x, dst)  # f64 -> f32 would round twice
    if dst == dt.e8m0 and src.is_int:  # powers of two up to 2^127: through f64, exact for |x| < 2^53
        return small_floats.encode(bld, convert(lw, x, src, dt.f64), dst)
    if src.is_int and src.bits >= 32:  # beyond +-2^20 every int overflows fp8, fp6 and fp4; within it f32 is exact
        limit = 1 << 20
        if src.kind == "int":
            low = int_constant(x.type, -limit)
            x = bld.select(bld.icmp_signed("<", x, low), low, x)
            high = int_constant(x.type, limit)
            x = bld.select(bld.icmp_signed(">", x, high), high, x)
        else:
            high = int_constant(x.type, limit)
            x = bld.select(bld.icmp_unsigned(">", x, high), high, x)
    return small_floats.encode(bld, convert(lw, x, src, dt.f32), dst)


def _fast_byte_float(lw, x, src: dt.DType, dst: dt.DType):
    """fp8 / e8m0 -> a wider float by `fast_dequant`'s bit tricks (None where it has none for the pair)."""
    if src.bits != 8 or not dst.is_float:
        return None
    bld = lw.builder
    scalar = not isinstance(x.type, ir.VectorType)
    vector = bld.insert_element(ir.Constant(ir.VectorType(x.type, 1), None), x, int_constant(I32, 0)) if scalar else x
    fast = fast_half(bld, vector, src, dst, vector.type.count)
    if fast is None:
        return None
    have = dt.bf16 if fast.type.element == BF16 else dt.f16
    if have != dst:
        fast = convert(lw, fast, have, dst)
    return bld.extract_element(fast, int_constant(I32, 0)) if scalar else fast


def _int_to_float(lw, x, src: dt.DType, dst: dt.DType, to: ir.Type):
    if dst == dt.bf16 and src.bits >= 32:  # beyond f32's 24 bits: targets differ in how often they round
        return lw.dialect.wide_int_to_bf16(lw, x, src)
    return lw.builder.sitofp(x, to) if src.kind == "int" else lw.builder.uitofp(x, to)


@codegen_for("bitcast")
def _bitcast(lw, op, x):
    return on_one_lane(lw, x, lambda v: _bitcast_registers(lw, v, scalar_dtype(op.operands[0].type), _dtype(op)))


def _bitcast_registers(lw, x, src: dt.DType, dst: dt.DType):
    bld = lw.builder
    to = with_element(x.type, scalar_type(dst))
    if src.is_bool:  # bool is one byte holding 0 or 1
        return bld.zext(x, to)
    if dst.is_bool:
        return bld.icmp_unsigned("!=", x, _zero(x.type))
    if src.is_int and src.is_subbyte and dst in SMALL_FLOATS:   # a pattern keeps only the type's bits
        return bld.and_(x, int_constant(x.type, (1 << src.bits) - 1))
    return x if x.type == to else bld.bitcast(x, to)   # (an i8 read as a sub-byte integer is wrapped by `emit`)


def _int_width(t: ir.Type) -> int:
    elem = t.element if isinstance(t, ir.VectorType) else t
    return elem.width if isinstance(elem, ir.IntType) else 0
