"""What a compiled kernel is specialized on, and how a call's arguments map to it.

A kernel is traced once per *specialization*: the dtypes of its tensor and
scalar arguments, the values of its constexpr parameters, and two facts per
pointer/integer argument that let later passes emit wide memory accesses:
whether it is divisible by 16 (pointers: 16-byte aligned) and whether an
integer equals 1 (strides of 1 make accesses contiguous). Parameters listed
in `do_not_specialize` contribute only their dtype. Pointer arguments whose
memory overlaps another argument's are marked `may_alias`, so the backend
only promises "no aliasing" to LLVM where it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ir.types import Type


@dataclass(frozen=True)
class ParamSpec:
    """One kernel parameter as the tracer sees it.

    constexpr parameters carry `value` and do not appear in the IR signature;
    runtime parameters carry their IR `type`. An integer parameter with
    `equals_one` is bound to the constant 1 while tracing (it stays in the
    signature so launches pass arguments positionally).
    """

    name: str
    constexpr: bool
    value: Any = None
    type: Type | None = None
    divisible_by_16: bool = False
    equals_one: bool = False
    may_alias: bool = False          # pointers: memory overlaps another pointer argument's
