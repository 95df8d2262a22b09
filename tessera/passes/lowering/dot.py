"""dot: the FMA fallback, through shared memory.

A and B are stored row-major into shared memory (whatever their layouts),
a barrier, then every thread runs a thread-level `for` over k that loads
A[m, k] and B[k, n] for each of its accumulator registers (m, n) and adds
their product in the accumulator's dtype, then a barrier so the buffers
can be reused. Inputs are converted to the accumulator dtype before the
multiply (exact for f16/bf16/fp8 into f32; integers wrap like the
interpreter's). The sum is rounded at every step, unlike the tile
interpreter's single rounding of an exact sum, so float results agree to
the accumulator's precision times K, not bit for bit; `input_precision`
is ignored (full f32). Tensor-core paths (mma, wgmma, mfma) come later.
"""

from __future__ import annotations

from tessera.ir import dtypes as dt
from tessera.ir.core import Block
from tessera.ir.types import ScalarType

from . import lowering
from .context import Regs


@lowering("dot")
def _dot(ctx, op):
    a, b, acc = ctx.operands(op)
    (m, k), (_, n) = op.operands[0].type.shape, op.operands[1].type.shape
    layout = ctx.assignment.layout(op.result)
    if acc.layout != layout:
        acc = ctx.convert(acc, layout, op)
    acc_dtype = acc.element.dtype
    a_buf, b_buf = ctx.to_shared(a), ctx.to_shared(b)
    count = layout.local_size
    a_rows = ctx.index_regs(layout, [k, 0])     # m * K: where row m of A starts
    b_cols = ctx.index_regs(layout, [0, 1])     # n: column n of B
    body = Block([ScalarType(dt.i32), acc.value.type], ["kk", "acc"])
    with ctx.b.at(body):
        kk, total = body.args
        a_ptrs = ctx.emit("addptr", ctx.splat(a_buf, count), ctx.emit("add", a_rows, ctx.splat(kk, count)))
        b_row = ctx.emit("mul", kk, ctx.const(n))
        b_ptrs = ctx.emit("addptr", ctx.splat(b_buf, count), ctx.emit("add", b_cols, ctx.splat(b_row, count)))
        x = ctx.cast(ctx.emit("load", a_ptrs), acc_dtype)
        y = ctx.cast(ctx.emit("load", b_ptrs), acc_dtype)
        ctx.create("yield", [ctx.emit("add", total, ctx.emit("mul", x, y))])
    loop = ctx.create("for", [ctx.const(0), ctx.const(k), ctx.const(1), acc.value], None, [acc.value.type], [body])
    ctx.barrier()
    ctx.define(op.result, Regs(loop.result, layout), op)
