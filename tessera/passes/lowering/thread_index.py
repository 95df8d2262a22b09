"""`ThreadIndex`: the coordinates a thread's registers hold, as hoisted thread-IR index math.

The thread part of a linear function of a layout's coordinates is computed
once per kernel from `thread_id` with shifts and masks (div/rem when a mode
is not a power of two), hoisted to the top of the kernel; the register part
is a constant per register (`layout_math`). `regs` builds
`splat(thread part) + pack(constants)`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tessera.ir import dtypes as dt
from tessera.ir.core import Value
from tessera.ir.layouts import RegisterLayout
from tessera.ir.types import ScalarType

from .emitter import Emitter
from .layout_math import layout_digits, local_parts


class ThreadIndex:
    """Index math for the `num_threads` threads of a block, emitted through `out`."""

    def __init__(self, out: Emitter, num_threads: int):
        self.out = out
        self.num_threads = num_threads

    @property
    def thread_id(self) -> Value:
        return self.out.hoist("thread_id")

    def digit(self, stride: int, size: int) -> Value:
        """(thread_id / stride) % size, hoisted."""
        out, x = self.out, self.thread_id
        if _pow2(stride) and _pow2(size):
            if stride > 1:
                x = out.hoist("shr", [x, out.const(stride.bit_length() - 1)])
            if stride * size < self.num_threads:
                x = out.hoist("and", [x, out.const(size - 1)])
            return x
        if stride > 1:
            x = out.hoist("div", [x, out.const(stride)])
        if stride * size < self.num_threads:
            x = out.hoist("rem", [x, out.const(size)])
        return x

    def affine(self, x: Value, scale: int = 1, bias: int = 0) -> Value:
        """x * scale + bias for a hoisted i32 `x`, hoisted (no op for the identity parts)."""
        if scale != 1:
            x = self.out.hoist("mul", [x, self.out.const(scale)])
        if bias:
            x = self.out.hoist("add", [x, self.out.const(bias)])
        return x

    def part(self, layout: RegisterLayout, weights: Sequence[int]) -> Value | None:
        """sum_d weights[d] * (thread part of coord d), as a hoisted i32; None when it is 0."""
        total = None
        for digit in layout_digits(layout):
            if not digit.spatial or digit.dim < 0:
                continue
            scale = digit.dim_stride * weights[digit.dim]
            if scale == 0:
                continue
            term = self.affine(self.digit(digit.stride, digit.size), scale)
            total = term if total is None else self.out.hoist("add", [total, term])
        return total

    def regs(self, layout: RegisterLayout, weights: Sequence[int], offset: Value | None = None,
             bias: int = 0, dtype: dt.DType = dt.i32) -> Value:
        """regs<N x dtype>: sum_d weights[d] * coord_d + offset + bias for each of this thread's registers."""
        out, count = self.out, layout.local_size
        consts = (local_parts(layout) * np.asarray(weights, np.int64)).sum(-1) + bias if layout.rank else \
            np.full(count, bias, np.int64)
        scalar = self.part(layout, weights)
        if scalar is not None and dtype != dt.i32:
            scalar = out.hoist("cast", [scalar], type=ScalarType(dtype))
        if offset is not None:
            offset = out.cast(offset, dtype)
            scalar = offset if scalar is None else out.emit("add", scalar, offset)
        if scalar is None:
            return out.const_regs(consts.tolist(), dtype)
        if not consts.any():
            return out.splat(scalar, count)
        return out.emit("add", out.splat(scalar, count), out.const_regs(consts.tolist(), dtype))

    def owner_predicate(self, layout: RegisterLayout) -> Value | None:
        """A hoisted bool: this thread is replica 0 of the elements it holds; None when nothing is replicated."""
        pred = None
        for digit in layout_digits(layout):
            if digit.dim >= 0:
                continue
            zero = self.out.hoist("cmp", [self.digit(digit.stride, digit.size), self.out.const(0)], {"pred": "eq"})
            pred = zero if pred is None else self.out.hoist("and", [pred, zero])
        return pred

    def first_thread(self) -> Value:
        return self.out.hoist("cmp", [self.thread_id, self.out.const(0)], {"pred": "eq"})


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
