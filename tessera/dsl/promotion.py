"""Type promotion: which dtype an operation on mixed operands computes in.

The one place that decides it. Two steps, both numpy-like (NEP 50):

1. `promote(a, b)` (two tensors) or `weak_promote(tensor_dtype, value)`
   (a tensor and a Python scalar) give the operands' *common dtype*;
2. `operator_dtype(op, common)` adjusts it for the operator: bool becomes
   i32 in arithmetic, `/` on integers is f32, bitwise ops reject floats, ...

Common dtype of two tensors (symmetric; M, N are bit widths)
-------------------------------------------------------------

    a \\ b      | bool   | iN                 | uN                       | float F
    -----------+--------+--------------------+--------------------------+----------
    bool       | bool   | iN                 | uN                       | F
    iM         | iM     | i max(M, N)        | iM if M > N, else the    | F
               |        |                    | narrowest of i8, i16,    |
               |        |                    | i32, i64 wider than N    |
               |        |                    | (with u64: error)        |
    uM         | uM     | (see iM, uN)       | u max(M, N)              | F
    float G    | G      | G                  | G                        | floats below

    so: i32 + u32 -> i64, i8 + u8 -> i16, i4 + u4 -> i8, i16 + u8 -> i16,
        i64 + f16 -> f16 (int + float is always the float, as in Triton).

Two floats: the narrower one if the wider holds all its values exactly,
else the narrowest of f16, bf16, f32, f64 that holds both:

    a \\ b     f16    bf16   f32    f64    f8e4m3 f8e5m2 f6e2m3 f6e3m2 f4e2m1 e8m0
    f16      f16    f32    f32    f64    f16    f16    f16    f16    f16    f32
    bf16     f32    bf16   f32    f64    bf16   bf16   bf16   bf16   bf16   bf16
    f32      f32    f32    f32    f64    f32    f32    f32    f32    f32    f32
    f64      f64    f64    f64    f64    f64    f64    f64    f64    f64    f64
    f8e4m3   f16    bf16   f32    f64    f8e4m3 f16    f8e4m3 f8e4m3 f8e4m3 bf16
    f8e5m2   f16    bf16   f32    f64    f16    f8e5m2 f16    f8e5m2 f8e5m2 bf16
    f6e2m3   f16    bf16   f32    f64    f8e4m3 f16    f6e2m3 f16    f6e2m3 bf16
    f6e3m2   f16    bf16   f32    f64    f8e4m3 f8e5m2 f16    f6e3m2 f6e3m2 bf16
    f4e2m1   f16    bf16   f32    f64    f8e4m3 f8e5m2 f6e2m3 f6e3m2 f4e2m1 bf16
    e8m0     f32    bf16   f32    f64    bf16   bf16   bf16   bf16   bf16   e8m0

    (f16 + bf16 -> f32; arithmetic on the fp8/fp6/fp4/e8m0 results then
    computes in f32, see Operators below.)

Tensor with a Python scalar (weak: the tensor's dtype wins)
-------------------------------------------------------------

    tensor \\ Python | bool    | int                          | float
    ----------------+---------+------------------------------+-------
    bool            | bool    | i32 (i64 / u64 if too large) | f32
    int / uint D    | D       | D; error if the value does   | f32
                    |         | not fit in D                 |
    float D         | D       | D                            | D

Operators (after the common dtype C is known)
----------------------------------------------

    operator                        | computes in
    --------------------------------+----------------------------------------------
    + - * // %  (and unary -, abs)  | C; bool -> i32; floats narrower than 16 bits
                                    | (fp8, fp6, fp4, e8m0) -> f32
    /                               | integers and bool -> f32; else as above
    & | ^                           | C, which must be an integer or bool
                                    | (bool & bool stays bool)
    << >>                           | C, which must be an integer; bool -> i32
    == != < <= > >=                 | C (the result is bool)
    math functions (exp, sqrt, ...) | integers and bool -> f32; floats narrower
                                    | than 16 bits -> f32; f16/bf16/f32/f64 stay

fp8/fp6/fp4/e8m0 are storage formats: arithmetic on them computes in f32.
Moves and selections (load, store, where, minimum, maximum, max/min
reductions, reshapes) keep the dtype, since they never round.
"""

from __future__ import annotations

from ..ir import float_formats
from ..ir.dtypes import DType, bool_, bf16, f16, f32, f64, i8, i16, i32, i64, u64

SIGNED_INTS = (i8, i16, i32, i64)
WIDE_FLOATS = (f16, bf16, f32, f64)

ARITHMETIC_OPERATORS = ("+", "-", "*", "//", "%")
BITWISE_OPERATORS = ("&", "|", "^")
SHIFT_OPERATORS = ("<<", ">>")
COMPARISON_OPERATORS = ("==", "!=", "<", "<=", ">", ">=")


class PromotionError(TypeError):
    """Two operand types have no common type (i64 with u64) or do not suit the operator (float & int).

    The message says what to change; the frontend adds the source line.
    """


# ---------------------------------------------------------------------------
# Common dtype


def promote(a: DType, b: DType) -> DType:
    """The common dtype of two tensors' dtypes (tables in the module docstring)."""
    if a == b:
        return a
    if a.is_bool or b.is_bool:
        return b if a.is_bool else a
    if a.is_float or b.is_float:
        if a.is_float and b.is_float:
            return _promote_floats(a, b)
        return a if a.is_float else b
    if a.kind == b.kind:
        return a if a.bits >= b.bits else b
    signed, unsigned = (a, b) if a.kind == "int" else (b, a)
    return _signed_holding(signed, unsigned)


def _promote_floats(a: DType, b: DType) -> DType:
    if holds_exactly(a, b):
        return a
    if holds_exactly(b, a):
        return b
    return next(f for f in WIDE_FLOATS if holds_exactly(f, a) and holds_exactly(f, b))


def holds_exactly(wide: DType, narrow: DType) -> bool:
    """Whether every value of float format `narrow` is a value of float format `wide`."""
    if wide == narrow:
        return True
    return (wide.mantissa_bits >= narrow.mantissa_bits
            and wide.max_value >= narrow.max_value
            and float_formats.min_positive(wide) <= float_formats.min_positive(narrow)
            and (wide.has_sign or not narrow.has_sign)
            and (wide.has_inf or not narrow.has_inf)
            and (wide.has_nan or not narrow.has_nan))


def _signed_holding(signed: DType, unsigned: DType) -> DType:
    if signed.bits > unsigned.bits:
        return signed
    for candidate in SIGNED_INTS:
        if candidate.bits > unsigned.bits and candidate.bits >= signed.bits:
            return candidate
    raise PromotionError(f"no integer type holds both {signed.name} and {unsigned.name} values (it would need "
                         f"more than 64 bits); cast one operand explicitly, e.g. x.to(tessera.i64)")


# ---------------------------------------------------------------------------
# Python scalars


def python_scalar_dtype(value: bool | int | float) -> DType:
    """The dtype a Python scalar gets on its own: bool -> bool, int -> i32 (i64, u64 if larger), float -> f32."""
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        for dtype in (i32, i64, u64):
            if dtype.min_value <= value <= dtype.max_value:
                return dtype
        raise PromotionError(f"the integer {value} does not fit in 64 bits")
    if isinstance(value, float):
        return f32
    raise PromotionError(f"expected a Python bool, int or float, got {type(value).__name__} {value!r}")


def weak_promote(tensor_dtype: DType, value: bool | int | float) -> DType:
    """The common dtype of a tensor of `tensor_dtype` and the Python scalar `value` (NEP 50: the tensor wins)."""
    if isinstance(value, bool):
        return tensor_dtype
    if isinstance(value, int):
        if tensor_dtype.is_bool:
            return python_scalar_dtype(value)
        if tensor_dtype.is_int and not tensor_dtype.min_value <= value <= tensor_dtype.max_value:
            raise PromotionError(f"the Python int {value} does not fit in {tensor_dtype.name} "
                                 f"(range {tensor_dtype.min_value}..{tensor_dtype.max_value}); "
                                 f"cast the tensor first, e.g. x.to(tessera.i32)")
        return tensor_dtype
    if isinstance(value, float):
        return tensor_dtype if tensor_dtype.is_float else f32
    raise PromotionError(f"expected a Python bool, int or float, got {type(value).__name__} {value!r}")


# ---------------------------------------------------------------------------
# Operators


def is_storage_float(dtype: DType) -> bool:
    """fp8, fp6, fp4 and e8m0: floats narrower than 16 bits, which compute in f32."""
    return dtype.is_float and dtype.bits < 16


def arithmetic_dtype(dtype: DType) -> DType:
    """What + - * // % (and unary -, abs, sums) compute in: bool -> i32, storage floats -> f32."""
    if dtype.is_bool:
        return i32
    if is_storage_float(dtype):
        return f32
    return dtype


def math_dtype(dtype: DType) -> DType:
    """What math functions (exp, sqrt, ...) and true division compute in: a float of at least 16 bits."""
    if not dtype.is_float or is_storage_float(dtype):
        return f32
    return dtype


def operator_dtype(op: str, common: DType) -> DType:
    """The dtype operator `op` computes in, given its operands' common dtype."""
    if op in ARITHMETIC_OPERATORS:
        return arithmetic_dtype(common)
    if op == "/":
        return math_dtype(common)
    if op in BITWISE_OPERATORS:
        if common.is_float:
            raise PromotionError(f"bitwise `{op}` needs integer or bool operands, not {common.name}; "
                                 f"to work on the bits of floats, bitcast first: x.to(tessera.i32, bitcast=True)")
        return common
    if op in SHIFT_OPERATORS:
        if common.is_float:
            raise PromotionError(f"shift `{op}` needs integer operands, not {common.name}")
        return i32 if common.is_bool else common
    if op in COMPARISON_OPERATORS:
        return common
    raise ValueError(f"unknown operator {op!r}")
