"""NVPTX codegen of the warpgroup ops (`ir/warpgroup_ops.py`): Hopper wgmma, sm_90a only.

* `wgmma_fence` / `wgmma_commit` / `wgmma_wait N` are `wgmma.fence.sync.aligned`,
  `wgmma.commit_group.sync.aligned` and `wgmma.wait_group.sync.aligned N`
  through their LLVM intrinsics; `fence_proxy_async` is
  `fence.proxy.async.shared::cta` (`llvm.nvvm.fence.proxy.async.shared_cta`).
* `wgmma_desc` is integer arithmetic: the shared pointer's address (ptrtoint of
  the addrspace(3) pointer is its shared-window address), `(addr & 0x3FFFF) >> 4`
  in 32 bits, zero-extended and OR'ed with the constant LBO / SBO / swizzle fields
  (`wgmma_layouts.MatrixDescriptor`), as CUTLASS builds it: the high word is then
  a constant ptxas materializes (it dropped it from a 64-bit `mul.wide` start).
* `wgmma` has no LLVM intrinsic (LLVM 22), so it is inline PTX:

      {
      .reg .pred p;
      setp.ne.b32 p, $N+2, 0;
      wgmma.mma_async.sync.aligned.m64n<N>k16.f32.<t>.<t> {$0, ..., $N/2-1}, $N/2, $N/2+1, p, 1, 1, <ta>, <tb>;
      }

  (e4m3/e5m2: `m64n<N>k32.f32.<a>.<b>` with A and B types in any mix, and no
  imm-trans operands: 8-bit operands are K-major only; A in registers:
  `{$N/2, ..., $N/2+3}` -- its 8 f16/bf16 elements as 4 "r" words -- in place
  of A's descriptor, and imm-trans-b alone after the scales)

  with N/2 "=f" outputs tied to the accumulator inputs ("0", "1", ...: the
  "+f" of CUDA C), the two descriptors as "l" (64-bit) operands, scale-d as an
  "r" operand (1: D = A*B + D; 0, D = A*B, where the accumulator is the constant +0.0, a fresh one,
  whose inputs are then undefined), imm-scale-a/b = 1 and imm-trans-a/b from the
  op's trans_a/trans_b. The asm has side effects, so it is never moved across
  the fences or dropped.

`check_op` rejects these ops on targets without the "wgmma" feature (only
sm_90a has it) before LLVM sees them: LLVM would abort on the intrinsics and
ptxas reject the asm.
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir.core import Operation
from tessera.ir.target import Target
from tessera.ir.wgmma_layouts import MatrixDescriptor

from ..llvm.types import F32, I32, I64
from .codegen_table import codegen_for

# Swizzled wgmma tiles at shared offset 0 must sit on a 1024-byte boundary (the 128B pattern's period).
SHARED_MEMORY_ALIGN = 1024
WARPGROUP_OPS = frozenset({"wgmma", "wgmma_desc", "wgmma_fence", "wgmma_commit", "wgmma_wait"})


def check_op(op: Operation, target: Target) -> str | None:
    """Why `op` cannot run on `target`, or None."""
    if op.name in WARPGROUP_OPS and not target.has("wgmma"):
        return (f"{op.name} is a Hopper warpgroup op (wgmma), which only sm_90a has; {target.name} lacks it: "
                "compile for sm_90a, or lower the kernel for this target (dot then uses mma.sync)")
    return None


@codegen_for("wgmma_fence")
def _wgmma_fence(lw, op):
    lw.intrinsic("llvm.nvvm.wgmma.fence.sync.aligned", [])


@codegen_for("wgmma_commit")
def _wgmma_commit(lw, op):
    lw.intrinsic("llvm.nvvm.wgmma.commit_group.sync.aligned", [])


@codegen_for("wgmma_wait")
def _wgmma_wait(lw, op):
    lw.intrinsic("llvm.nvvm.wgmma.wait_group.sync.aligned", [ir.Constant(I64, op.attrs["pending"])])


@codegen_for("wgmma_desc")
def _wgmma_desc(lw, op, ptr):
    bld = lw.builder
    fields = MatrixDescriptor(0, op.attrs["lbo"], op.attrs["sbo"], op.attrs["swizzle"]).signed()
    address = bld.trunc(bld.ptrtoint(ptr, I64), I32)       # a shared-window address: 32 bits hold it
    start = bld.lshr(bld.and_(address, ir.Constant(I32, 0x3FFFF)), ir.Constant(I32, 4))
    return bld.or_(bld.zext(start, I64), ir.Constant(I64, fields))


PTX_TYPES = {"f16": "f16", "bf16": "bf16", "f8e4m3": "e4m3", "f8e5m2": "e5m2"}


A_WORDS = 4        # 32-bit registers of a 64 x 16 f16/bf16 A slice in registers (two elements each, low first)


def wgmma_asm(n: int, dtype: str, trans_a: bool, trans_b: bool, dtype_b: str | None = None,
              a_in_registers: bool = False) -> str:
    """The inline PTX of one wgmma m64n{n}k16 (f16/bf16) or m64n{n}k32 (e4m3/e5m2, no imm-trans operands)
    (operand numbering: see the module docstring). `a_in_registers`: A is the 4 words after the accumulators
    ({$N/2, ..., $N/2+3}), then B's descriptor and scale-d, and only imm-trans-b follows the scales."""
    count = n // 2
    d = ", ".join(f"${i}" for i in range(count))
    a, b = PTX_TYPES[dtype], PTX_TYPES[dtype_b or dtype]
    fp8 = a in ("e4m3", "e5m2")
    if a_in_registers:
        a_operand = "{" + ", ".join(f"${count + i}" for i in range(A_WORDS)) + "}"
        b_at, scale_at, trans = count + A_WORDS, count + A_WORDS + 1, f", {int(trans_b)}"
    else:
        a_operand, b_at, scale_at = f"${count}", count + 1, count + 2
        trans = "" if fp8 else f", {int(trans_a)}, {int(trans_b)}"
    return ("{\n"
            ".reg .pred p;\n"
            f"setp.ne.b32 p, ${scale_at}, 0;\n"
            f"wgmma.mma_async.sync.aligned.m64n{n}k{32 if fp8 else 16}.f32.{a}.{b} {{{d}}}, {a_operand}, "
            f"${b_at}, p, 1, 1{trans};\n"
            "}")


@codegen_for("wgmma")
def _wgmma(lw, op, a, b_desc, acc):
    bld, n = lw.builder, op.attrs["n"]
    count, offset = n // 2, op.attrs.get("offset", 0)
    accumulators = [bld.extract_element(acc, ir.Constant(I32, offset + i)) for i in range(count)]
    in_registers = isinstance(a.type, ir.VectorType)
    if in_registers:                # A's 8 elements as 4 words, the lower-indexed element in the low half
        words = bld.bitcast(a, ir.VectorType(I32, A_WORDS))
        a_args, a_types = [bld.extract_element(words, ir.Constant(I32, i)) for i in range(A_WORDS)], ["r"] * A_WORDS
    else:
        a_args, a_types = [a], ["l"]
    ftype = ir.FunctionType(ir.LiteralStructType([F32] * count), [x.type for x in a_args] + [I64, I32]
                            + [F32] * count)
    constraints = ",".join(["=f"] * count + a_types + ["l", "r"] + [str(i) for i in range(count)])
    asm = wgmma_asm(n, op.attrs["dtype"], op.attrs.get("trans_a", False), op.attrs.get("trans_b", False),
                    op.attrs.get("dtype_b"), in_registers)
    fresh = _is_zero(acc)   # D = A*B (scale-d 0) and no zero registers: LLVM made one zero register of them all,
    if fresh:               # which ptxas tied to another group's accumulator in flight (an injected wait)
        accumulators = [ir.Constant(F32, ir.Undefined)] * count
    scale_d = ir.Constant(I32, 0 if fresh else 1)
    d = bld.asm(ftype, asm, constraints, [*a_args, b_desc, scale_d, *accumulators], side_effect=True)
    result = acc if "offset" in op.attrs else ir.Constant(acc.type, ir.Undefined)  # a stack: the rest passes
    for i in range(count):
        result = bld.insert_element(result, bld.extract_value(d, i), ir.Constant(I32, offset + i))
    return result


def _is_zero(value) -> bool:
    """Whether an LLVM value is +0.0 in every lane (a fresh accumulator: `tessera.zeros`, a `constant` op)."""
    if not isinstance(value, ir.Constant):
        return False
    if isinstance(value.constant, (list, tuple)):
        return all(_is_zero(lane) for lane in value.constant)
    return value.constant is None or value.constant in (0, "0x0000000000000000")    # zeroinitializer, or +0.0
