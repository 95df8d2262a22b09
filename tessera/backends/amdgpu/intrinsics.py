"""Every LLVM intrinsic the AMDGPU backend may call, in one table.

`tests/backends/test_amdgpu_intrinsics.py` compiles every entry, with every
overload listed, for gfx90a, gfx942 and gfx950 in a child process (an
intrinsic the GPU cannot select aborts LLVM); the `GFX950_ONLY` entries for
gfx950 alone.

* `FIXED`: `llvm.amdgcn.*` intrinsics with one signature (`GFX950_ONLY`
  among them: gfx950's double-K and OCP fp8 MFMA).
* `OVERLOADED`: the common families plus the f32 math intrinsics AMDGPU
  selects natively (`llvm.exp2.f32` is `v_exp_f32`, ...). Their f64
  versions have no AMDGPU lowering (LLVM would need a libm call and aborts),
  so the examples are f32 only and the validator rejects f64 transcendentals.
"""

from __future__ import annotations

from llvmlite import ir

from ..llvm.intrinsics import COMMON_OVERLOADED, VOID, Family, IntrinsicTable, unary, vectors
from ..llvm.types import F32, I16, I32, I64, BFloatType

CONSTANT_ADDRSPACE = 4  # AMDGPU's read-only constant memory (the dispatch packet lives there)

# gfx950's double-K MFMA (`v_mfma_f32_{32x32x16,16x16x32}_{f16,bf16}`, target feature "mfma.wide"): A and B as
# <8 x half> / <8 x bfloat> (real bfloat here, not i16), then C and the three broadcast immediates as above.
# gfx90a/gfx942 cannot select them (LLVM aborts): `AmdgpuDialect.check_op` refuses them there first.
GFX950_ONLY: dict[str, tuple[ir.Type, tuple[ir.Type, ...]]] = {
    f"llvm.amdgcn.mfma.f32.{m}x{n}x{k}.{name}": (ir.VectorType(F32, m * n // 64),
                                                 (ir.VectorType(element, 8), ir.VectorType(element, 8),
                                                  ir.VectorType(F32, m * n // 64), I32, I32, I32))
    for m, n, k in ((32, 32, 16), (16, 16, 32))
    for name, element in (("f16", ir.HalfType()), ("bf16", BFloatType()))}
# v_mfma_f32_{32x32x16,16x16x32}_{fp8,bf8}_{fp8,bf8} (A format, B format): eight 8-bit values in an i64 per
# operand. gfx942 selects them too, but reads its fnuz fp8 in them; Tessera calls them for gfx950's OCP fp8 only
# ("mfma.fp8"; `AmdgpuDialect.check_op`), so they are listed, and tested, with gfx950's.
GFX950_ONLY.update({
    f"llvm.amdgcn.mfma.f32.{m}x{n}x{k}.{x}.{y}": (ir.VectorType(F32, m * n // 64),
                                                (I64, I64, ir.VectorType(F32, m * n // 64), I32, I32, I32))
    for m, n, k in ((32, 32, 16), (16, 16, 32)) for x in ("fp8", "bf8") for y in ("fp8", "bf8")})
# v_mfma_{scale_,}f32_{32x32x64,16x16x128}_f8f6f4, gfx950's double-rate fp8 (`codegen_table.f8f6f4_intrinsic`):
# A and B as <8 x i32> (32 8-bit values), C, then A's and B's formats (cbsz, blgp: immediates), A's scale op
# select (an immediate) and scale, B's; LLVM emits the unscaled instruction when the four scale operands are 0.
GFX950_ONLY.update({
    f"llvm.amdgcn.mfma.scale.f32.{m}x{n}x{k}.f8f6f4.v8i32.v8i32": (
        ir.VectorType(F32, m * n // 64),
        (ir.VectorType(I32, 8), ir.VectorType(I32, 8), ir.VectorType(F32, m * n // 64), I32, I32, I32, I32, I32, I32))
    for m, n, k in ((32, 32, 64), (16, 16, 128))})
# ds_read_b64_tr_b16 (the LDS transpose read, target feature "lds.read.tr"; thread op `lds_read_tr`): an LDS
# address in, four 16-bit elements out (overloaded on the result: .v4i16; codegen bitcasts to half/bfloat).
GFX950_ONLY["llvm.amdgcn.ds.read.tr16.b64.v4i16"] = (ir.VectorType(I16, 4), (ir.PointerType(addrspace=3),))

FIXED: dict[str, tuple[ir.Type, tuple[ir.Type, ...]]] = {
    **{f"llvm.amdgcn.workitem.id.{axis}": (I32, ()) for axis in "xyz"},
    **{f"llvm.amdgcn.workgroup.id.{axis}": (I32, ()) for axis in "xyz"},
    # The HSA kernel dispatch packet (hsa_kernel_dispatch_packet_t): block and grid sizes.
    "llvm.amdgcn.dispatch.ptr": (ir.PointerType(addrspace=CONSTANT_ADDRSPACE), ()),
    # s_sleep N (an immediate, 0..127): the wave sleeps about N * 64 clocks.
    "llvm.amdgcn.s.sleep": (VOID, (I32,)),
    # s_barrier: every wave of the work-group waits here (memory ordering comes from fences around it).
    "llvm.amdgcn.s.barrier": (VOID, ()),
    # The wave-group ping-pong (`passes/wave_pingpong.py`): s_setprio N (an immediate, 0..3: the wave's issue
    # priority), sched_barrier(0) (LLVM's scheduler moves nothing across it; emits no instruction), and
    # readfirstlane (the first active lane's value, in an SGPR: a branch on it is a scalar branch).
    "llvm.amdgcn.s.setprio": (VOID, (I16,)),
    "llvm.amdgcn.sched.barrier": (VOID, (I32,)),
    "llvm.amdgcn.readfirstlane.i32": (I32, (I32,)),
    # ds_bpermute_b32 (byte address = source lane * 4, value): each lane reads the value of another lane.
    "llvm.amdgcn.ds.bpermute": (I32, (I32, I32)),
    # This lane's index in the wave: mbcnt_hi(~0, mbcnt_lo(~0, 0)) counts the lanes below it.
    "llvm.amdgcn.mbcnt.lo": (I32, (I32, I32)),
    "llvm.amdgcn.mbcnt.hi": (I32, (I32, I32)),
    # v_mfma_f32_{32x32x8,16x16x16}_{f16,bf16}: A and B fragments as <4 x half> (bf16 as <4 x i16>), the C
    # fragment as <m*n/64 x float>, then cbsz, abid, blgp (broadcast controls; immediates, 0 = none).
    **{f"llvm.amdgcn.mfma.f32.{m}x{n}x{k}{suffix}": (ir.VectorType(F32, m * n // 64),
                                                   (operand, operand, ir.VectorType(F32, m * n // 64), I32, I32, I32))
       for m, n, k in ((32, 32, 8), (16, 16, 16))
       for suffix, operand in (("f16", ir.VectorType(ir.HalfType(), 4)), ("bf16.1k", ir.VectorType(I16, 4)))},
    **GFX950_ONLY,
    # Direct global -> LDS loads (`lds_dma.py`): global_load_lds_dword{,x4}(global source, LDS base, bytes,
    # instruction offset, aux); the LDS base goes in M0 (wave-uniform) and lane i writes at base + i * bytes.
    # The last three operands are immediates; bytes is 1, 2 or 4 (12 and 16 on gfx950 alone).
    "llvm.amdgcn.global.load.lds": (VOID, (ir.PointerType(addrspace=1), ir.PointerType(addrspace=3), I32, I32, I32)),
    # s_waitcnt (an immediate: vmcnt, expcnt and lgkmcnt packed as `lds_dma.waitcnt_vmcnt` packs them).
    "llvm.amdgcn.s.waitcnt": (VOID, (I32,)),
    # s_trap: ends the launch with an error (a failed device_assert). Last: code after it is unreachable.
    "llvm.trap": (VOID, ()),
}

# f32 math that AMDGPU selects (v_exp_f32, v_log_f32, v_sin_f32, v_cos_f32 with LLVM's accuracy fix-ups).
NATIVE_MATH = ("exp", "exp2", "log", "log2", "sin", "cos")

OVERLOADED: dict[str, Family] = {
    **COMMON_OVERLOADED,
    **{f"llvm.{name}": Family(unary, vectors((F32,))) for name in NATIVE_MATH},
}

AMDGPU_INTRINSICS = IntrinsicTable("AMDGPU", FIXED, OVERLOADED)
