"""dot: on matrix instructions (wgmma, mma.sync, MFMA) where it qualifies, else the FMA fallback.

wgmma (sm_90a) reads its operands from shared memory: `wgmma_dot.py`.

Matrix instructions (`mma.mma_plan` says when, picks the instruction and
the layouts): layout assignment has already put the accumulator in the C
fragment layout and asked for A and B in the fragment layouts, so each
thread holds, for each of its warp's fragments, exactly the registers the
instruction takes. For every (m-fragment, n-fragment) the warp runs one
instruction (`mma` or `mfma`, with its shape) per k-fragment, in k
order, accumulating into that C fragment. An operand that has to move into
its fragment layout goes, on NVIDIA, through XOR-swizzled shared memory and
`ldmatrix` (`mma_operands.py`: 16-bit A plain, B with .trans; 8-bit and tf32
fragments only plain, i.e. A, and a B read from its N x K transpose),
bank-conflict free; what ldmatrix cannot read through the generic conversion;
on AMD through LDS in the padded row- or column-major layout with the
fewest modelled bank conflicts, read with plain vector loads
(`mfma_operands.py`); the generic conversion is the fallback. In a
software-pipelined loop (`schedule/software_pipeline.py`) an operand already sits in a
swizzled ring slot that cp.async filled, and is read from there with the
same ldmatrix plan. Each float instruction rounds to f32 (the SIMT simulator
accumulates each fragment's products in f32, in k order), so results agree with the tile interpreter's
single rounding of the exact sum to about K ulps of f32, not bit for bit; integer ones (i8/u8 -> i32)
wrap and agree exactly. A tf32 dot's `mma` rounds its f32 inputs to tf32 (ties away from zero), as the
interpreter does for `input_precision = "tf32"`.

FMA fallback, through shared memory:

A and B are stored row-major into shared memory (whatever their layouts),
a barrier, then every thread runs a thread-level `for` over k that loads
A[m, k] and B[k, n] for each of its accumulator registers (m, n) and adds
their product in the accumulator's dtype, then a barrier so the buffers
can be reused. Inputs are converted to the accumulator dtype before the
multiply (exact for f16/bf16/fp8 into f32; integers wrap like the
interpreter's). The sum is rounded at every step, unlike the tile
interpreter's single rounding of an exact sum, so float results agree to
the accumulator's precision times K, not bit for bit. f32 inputs of a dot
with `input_precision = "tf32"` are rounded to tf32 first, the same way the
tensor cores' path and the interpreter round them.
"""

from __future__ import annotations

from tessera.ir import dtypes as dt
from tessera.ir.core import Block
from tessera.ir.types import RegsType, ScalarType

from ..mma import mma_plan
from . import lowering
from .mfma_operands import lds_operand, lds_transpose_read
from .mma_operands import ldmatrix_operand, read_fragment
from .relayout import convert
from .values import Regs, RingOperand
from .wgmma_dot import wgmma_dot


@lowering("dot")
def _dot(ctx, op):
    plan = mma_plan(op, ctx.target, ctx.num_threads // ctx.warp_size)
    if plan is not None:
        return (wgmma_dot if plan.a is None else _mma_dot)(ctx, op, plan)
    a, b, acc = ctx.operands(op)
    k, n = op.operands[0].type.shape[1], op.operands[1].type.shape[1]
    layout = ctx.assignment.layout(op.result)
    if acc.layout != layout:
        acc = convert(ctx, acc, layout, op)
    acc_dtype = acc.element.dtype
    tf32 = op.attrs.get("input_precision") == "tf32" and op.operands[0].type.element.dtype == dt.f32
    a_buf, b_buf = ctx.smem.to_shared(a), ctx.smem.to_shared(b)
    count = layout.local_size
    a_rows = ctx.index.regs(layout, [k, 0])     # m * K: where row m of A starts
    b_cols = ctx.index.regs(layout, [0, 1])     # n: column n of B
    body = Block([ScalarType(dt.i32), acc.value.type], ["kk", "acc"])
    with ctx.b.at(body):
        kk, total = body.args
        a_ptrs = ctx.emit("addptr", ctx.splat(a_buf, count), ctx.emit("add", a_rows, ctx.splat(kk, count)))
        b_row = ctx.emit("mul", kk, ctx.const(n))
        b_ptrs = ctx.emit("addptr", ctx.splat(b_buf, count), ctx.emit("add", b_cols, ctx.splat(b_row, count)))
        x, y = ctx.emit("load", a_ptrs), ctx.emit("load", b_ptrs)
        if tf32:
            x, y = _round_to_tf32(ctx, x), _round_to_tf32(ctx, y)
        x, y = ctx.cast(x, acc_dtype), ctx.cast(y, acc_dtype)
        ctx.create("yield", [ctx.emit("add", total, ctx.emit("mul", x, y))])
    loop = ctx.create("for", [ctx.const(0), ctx.const(k), ctx.const(1), acc.value], None, [acc.value.type], [body])
    ctx.threads.barrier()
    ctx.define(op.result, Regs(loop.result, layout), op)


def _mma_dot(ctx, op, plan):
    inst = plan.instruction
    a, b = (_fragment(ctx, op, i, want, trans, inst) for i, want, trans in ((0, plan.a, False), (1, plan.b, True)))
    acc = convert(ctx, ctx.operand(op, 2), plan.c, op)
    a_regs, b_regs = ctx.unpack(a.value), ctx.unpack(b.value)
    c_regs = list(ctx.unpack(acc.value))
    na, nb, nc = inst.a.local_size, inst.b.local_size, inst.c.local_size    # registers per fragment
    fragment = RegsType(acc.element, nc)
    for rm in range(plan.rm):
        for rn in range(plan.rn):
            c0 = (rm * plan.rn + rn) * nc
            d = ctx.pack(c_regs[c0:c0 + nc])
            for rk in range(plan.rk):
                a0, b0 = (rm * plan.rk + rk) * na, (rk * plan.rn + rn) * nb
                d = ctx.emit(inst.op, ctx.pack(a_regs[a0:a0 + na]), ctx.pack(b_regs[b0:b0 + nb]), d,
                             attrs=dict(inst.attrs) or None, type=fragment)
            c_regs[c0:c0 + nc] = ctx.unpack(d)
    ctx.define(op.result, Regs(ctx.pack(c_regs), plan.c), op)


def _fragment(ctx, op, index, want, trans, inst):
    """Operand `index` in fragment layout `want`: when it has to move, through swizzled shared memory and
    ldmatrix (mma.sync) or padded LDS and plain loads (MFMA); else, or as the fallback, the generic
    conversion (free renaming, or scalar shared-memory loads)."""
    lowered = ctx.lookup(op.operands[index])
    staged = ctx.staged.get(op.operands[index])
    if staged is not None:                      # stored in shared memory before the loop
        return staged.read(ctx, lowered.element.dtype)
    if isinstance(lowered, RingOperand):        # a software-pipelined load: its slot of the ring buffer
        if lowered.load.fragment is None:       # an unswizzled slot (AMD's direct-to-LDS ring): plain LDS loads
            return _ring_lds_operand(ctx, lowered)
        regs = read_fragment(ctx, lowered.slot(ctx), lowered.load.fragment, lowered.load.dtype)
        return Regs(regs.value, lowered.load.want)
    if isinstance(lowered, Regs):
        if inst.op == "mfma":
            loaded = lds_operand(ctx, lowered, want)
        else:
            loaded = ldmatrix_operand(ctx, lowered, want, trans)
        if loaded is not None:
            return loaded
    return convert(ctx, ctx.operand(op, index), want, op)


def _ring_lds_operand(ctx, ring: RingOperand) -> Regs:
    """The fragment `ring.load.want` read from its row-major slot (rows along the contiguous dim `dim`, the
    tile transposed when dim is 0) with plain, vectorized LDS loads; no barrier (the loop has one)."""
    load = ring.load
    weights = [0, 0]
    weights[load.contiguous_dim] = 1
    weights[1 - load.contiguous_dim] = load.load.result.type.shape[load.contiguous_dim]
    slot = ring.slot(ctx)
    value = lds_transpose_read(ctx, slot, load.want, weights, load.dtype)     # gfx950, MN-major 16-bit
    if value is None:
        value = ctx.smem.access("load", slot, load.want, weights)
    return Regs(value, load.want)


def _round_to_tf32(ctx, x):
    """f32 registers rounded to tf32 as cvt.rna.tf32.f32 (and `numerics.round_to_tf32`) does: add half a tf32
    ulp to the bits and drop the low 13 (to nearest, ties away from zero); NaNs are kept as they are."""
    count = x.type.count
    bits = ctx.emit("bitcast", x, type=RegsType(ScalarType(dt.i32), count))
    half_ulp, mask = ctx.const_regs([0x1000] * count, dt.i32), ctx.const_regs([-0x2000] * count, dt.i32)
    rounded = ctx.emit("bitcast", ctx.emit("and", ctx.emit("add", bits, half_ulp), mask), type=x.type)
    return ctx.emit("select", ctx.emit("cmp", x, x, attrs={"pred": "ne"}), x, rounded)
