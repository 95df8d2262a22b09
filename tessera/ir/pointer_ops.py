"""Pointers as values: conversions between 64-bit integers and pointers, lane by lane.

    %p = int_to_ptr %a : tile<16xptr<f16>>      each lane's address (bytes, as an i64/u64) as a pointer to f16
    %a = ptr_to_int %p : i64                    a pointer's address in bytes

They are what a kernel needs to follow pointers stored in memory (the
per-group A, B, C of a grouped GEMM over separate allocations: an array of
addresses, loaded as i64, cast to pointers and used in `make_view` or
pointer arithmetic). Both are elementwise; the CPU interpreter resolves an
address to the array that holds it (`backends/interp/addresses.py`).
"""

from __future__ import annotations

from .ops import define, require
from .types import PointerType, ScalarType, element_of, shape_of


def _check_int_to_ptr(op):
    src, res = op.operands[0].type, op.results[0].type
    require(isinstance(element_of(src), ScalarType) and element_of(src).dtype.is_int
            and element_of(src).dtype.bits == 64, f"int_to_ptr takes 64-bit integers, got {src}")
    require(isinstance(element_of(res), PointerType) and shape_of(res) == shape_of(src),
            f"int_to_ptr makes pointers of the operand's shape, got {res} from {src}")
    require(element_of(res).address_space == "global", "int_to_ptr makes global-memory pointers")


def _check_ptr_to_int(op):
    src, res = op.operands[0].type, op.results[0].type
    require(isinstance(element_of(src), PointerType), f"ptr_to_int takes pointers, got {src}")
    require(isinstance(element_of(res), ScalarType) and element_of(res).dtype.is_int
            and element_of(res).dtype.bits == 64 and shape_of(res) == shape_of(src),
            f"ptr_to_int makes 64-bit integers of the operand's shape, got {res} from {src}")


define("int_to_ptr", "The pointers at the operand's byte addresses (64-bit integers), lane by lane.", 1,
       check=_check_int_to_ptr, elementwise=True)
define("ptr_to_int", "The byte addresses (a 64-bit integer type) of the operand's pointers, lane by lane.", 1,
       check=_check_ptr_to_int, elementwise=True)
