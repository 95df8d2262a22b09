"""Every LLVM intrinsic and libdevice function the NVPTX backend may call, in one table.

The table mechanism and the target-neutral families are the LLVM core's
(`tessera.backends.llvm.intrinsics`); this file names what is NVIDIA's.
`tests/backends/test_nvptx_intrinsics.py` assembles every entry, with every
overload the backend uses, for sm_80 and sm_90a (an entry in `NEEDS` only
for the targets with that feature: fp8 mma on sm_90a).

* `FIXED`: `llvm.nvvm.*` intrinsics with one signature.
* `OVERLOADED`: the common families (`llvm.minnum`, `llvm.fptosi.sat`, ...).
* `LIBDEVICE`: math functions from CUDA's libdevice (`__nv_expf`, ...), f32
  and f64 flavours, linked in when libdevice is found (see `toolkit.py`);
  `APPROX` holds the f32 hardware approximations used without it.
"""

from __future__ import annotations

from llvmlite import ir

from ..llvm.intrinsics import (BF16, COMMON_OVERLOADED, F16, VOID, Family, IntrinsicTable, get_or_declare,
                               overloaded_name)
from ..llvm.types import F32, F64, I1, I16, I32, I64

__all__ = ["APPROX", "BF16", "FAST_APPROX", "FIXED", "LIBDEVICE", "NVPTX_INTRINSICS", "OVERLOADED", "SM90_FIXED", "call", "declare",
           "declare_libdevice", "libdevice_functions", "overloaded_name"]

# -- fixed signatures ------------------------------------------------------------

FIXED: dict[str, tuple[ir.Type, tuple[ir.Type, ...]]] = {
    **{f"llvm.nvvm.read.ptx.sreg.{reg}.{axis}": (I32, ())
       for reg in ("tid", "ctaid", "nctaid", "ntid") for axis in "xyz"},
    # trap: ends the launch with an error (a failed device_assert, after it printed why).
    "llvm.trap": (VOID, ()),
    # nanosleep.u32 ns (sm_70+): a spin-wait's backoff; the operand may be a register.
    "llvm.nvvm.nanosleep": (VOID, (I32,)),
    # bar.sync 0: every thread of the block waits here.
    "llvm.nvvm.barrier.cta.sync.aligned.all": (VOID, (I32,)),
    # shfl.sync.<mode>.b32 (membermask, value, lane/delta, clamp|segmask << 8)
    **{f"llvm.nvvm.shfl.sync.{mode}.i32": (I32, (I32, I32, I32, I32)) for mode in ("bfly", "idx", "up", "down")},
    # f32 hardware approximations (MUFU), used when libdevice is not found.
    "llvm.nvvm.ex2.approx.f": (F32, (F32,)),
    "llvm.nvvm.lg2.approx.f": (F32, (F32,)),
    # ... their flush-to-zero forms (one instruction: the non-ftz ones scale around subnormals), for fast math
    "llvm.nvvm.ex2.approx.ftz.f": (F32, (F32,)),
    "llvm.nvvm.lg2.approx.ftz.f": (F32, (F32,)),
    "llvm.nvvm.sin.approx.f": (F32, (F32,)),
    "llvm.nvvm.cos.approx.f": (F32, (F32,)),
    "llvm.nvvm.tanh.approx.f32": (F32, (F32,)),
    "llvm.nvvm.rsqrt.approx.f": (F32, (F32,)),
    # int -> f32 rounding toward zero (cvt.rz.f32.{s,u}{32,64}): the first half of an
    # exact int -> bf16 conversion before sm_90 (round to odd, then to nearest).
    "llvm.nvvm.i2f.rz": (F32, (I32,)),
    "llvm.nvvm.ui2f.rz": (F32, (I32,)),
    "llvm.nvvm.ll2f.rz": (F32, (I64,)),
    "llvm.nvvm.ull2f.rz": (F32, (I64,)),
    # mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32: A as 4 and B as 2 registers of
    # two 16-bit values (<2 x half> for f16, i32 for bf16), C as 4 floats; D comes back as a struct.
    "llvm.nvvm.mma.m16n8k16.row.col.f32.f32": (ir.LiteralStructType([F32] * 4),
                                              (ir.VectorType(F16, 2),) * 6 + (F32,) * 4),
    "llvm.nvvm.mma.m16n8k16.row.col.bf16": (ir.LiteralStructType([F32] * 4), (I32,) * 6 + (F32,) * 4),
    # mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: A as 4 and B as 2 i32 registers of tf32 bits (from
    # cvt.rna.tf32.f32 = llvm.nvvm.f2tf32.rna), C and D as 4 floats.
    "llvm.nvvm.f2tf32.rna": (I32, (F32,)),
    "llvm.nvvm.mma.m16n8k8.row.col.tf32": (ir.LiteralStructType([F32] * 4), (I32,) * 6 + (F32,) * 4),
    # mma.sync.aligned.m16n8k32.row.col.s32.{s8,u8}.{s8,u8}.s32 (wrapping; .satfinite is another intrinsic):
    # A as 4 and B as 2 i32 registers of four bytes each, C and D as 4 i32.
    **{f"llvm.nvvm.mma.m16n8k32.row.col.{t}": (ir.LiteralStructType([I32] * 4), (I32,) * 10) for t in ("s8", "u8")},
    # mma.sync.aligned.m16n8k32.row.col.f32.<A>.<B>.f32 with A, B in {e4m3, e5m2}: packed like s8; sm_89+ and
    # PTX 8.4 (LLVM cannot select them otherwise: `NEEDS` below).
    **{f"llvm.nvvm.mma.m16n8k32.row.col.f32.{x}.{y}.f32": (ir.LiteralStructType([F32] * 4), (I32,) * 6 + (F32,) * 4)
       for x in ("e4m3", "e5m2") for y in ("e4m3", "e5m2")},
    # ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].b16 [row address in shared memory]: one 32-bit register
    # (two 16-bit elements) per matrix.
    **{f"llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{num}{trans}.b16":
       (I32 if num == 1 else ir.LiteralStructType([I32] * num), (ir.PointerType(addrspace=3),))
       for num in (1, 2, 4) for trans in ("", ".trans")},
    # stmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16 [row address in shared memory], {r0, ..}: one 32-bit
    # register (two 16-bit elements) per matrix; sm_90+ (`dialect.check_op`). Overloaded on the pointer: .p3.
    **{f"llvm.nvvm.stmatrix.sync.aligned.m8n8.x{num}{trans}.b16.p3":
       (VOID, (ir.PointerType(addrspace=3),) + (I32,) * num)
       for num in (1, 2, 4) for trans in ("", ".trans")},
    # cp.async.{cg,ca}.shared.global [dst], [src], bytes, src_size: the `.s` variants take the number of bytes
    # to read (the rest are zero-filled), which is how a false predicate becomes a zero fill. .cg (L2 only)
    # exists for 16 bytes; 4 and 8 go through .ca.
    **{f"llvm.nvvm.cp.async.{cache}.shared.global.{size}.s":
       (VOID, (ir.PointerType(addrspace=3), ir.PointerType(addrspace=1), I32))
       for cache, size in (("cg", 16), ("ca", 4), ("ca", 8), ("ca", 16))},
    "llvm.nvvm.cp.async.commit.group": (VOID, ()),
    "llvm.nvvm.cp.async.wait.group": (VOID, (I32,)),    # immarg: the number of groups left in flight
    # -- Hopper warpgroup MMA (sm_90a only: see NEEDS) --------------------------------------------------
    # wgmma.{fence,commit_group}.sync.aligned; wgmma.wait_group.sync.aligned N (immarg i64: groups left in
    # flight); fence.proxy.async.shared::cta (generic-proxy shared writes -> visible to wgmma's async proxy).
    # wgmma.mma_async itself has no intrinsic: warpgroup.py emits it as inline PTX.
    "llvm.nvvm.wgmma.fence.sync.aligned": (VOID, ()),
    "llvm.nvvm.wgmma.commit_group.sync.aligned": (VOID, ()),
    "llvm.nvvm.wgmma.wait_group.sync.aligned": (VOID, (I64,)),
    "llvm.nvvm.fence.proxy.async.shared_cta": (VOID, ()),
    "llvm.nvvm.fence.proxy.async.global": (VOID, ()),
    # -- warp specialization (warp_specialization.py) ---------------------------------------------------
    # setmaxnreg.{inc,dec}.sync.aligned.u32 N (immarg: registers per thread; sm_90a), elect.sync %r|%p, mask
    # (sm_90+: {the elected lane, whether this lane is it}), bar.sync id, count (a named barrier; every target).
    "llvm.nvvm.setmaxnreg.inc.sync.aligned.u32": (VOID, (I32,)),
    "llvm.nvvm.setmaxnreg.dec.sync.aligned.u32": (VOID, (I32,)),
    "llvm.nvvm.elect.sync": (ir.LiteralStructType([I32, I1]), (I32,)),
    "llvm.nvvm.barrier.cta.sync.aligned.count": (VOID, (I32, I32)),
    "llvm.nvvm.barrier.cta.arrive.aligned.count": (VOID, (I32, I32)),      # bar.arrive id, count
}

# -- sm_90+ only: mbarriers and TMA (bulk_async.py) --------------------------------
# Kept apart from FIXED because they cannot be selected for sm_80 (the table test assembles FIXED for sm_80;
# tests/backends/test_nvptx_tma.py assembles these for sm_90a). Checked with LLVM 22.1 and ptxas 13.0.

_SMEM = ir.PointerType(addrspace=3)
_CLUSTER_SMEM = ir.PointerType(addrspace=7)     # shared::cluster, where a TMA load writes
SM90_FIXED: dict[str, tuple[ir.Type, tuple[ir.Type, ...]]] = {
    "llvm.nvvm.mbarrier.init.shared": (VOID, (_SMEM, I32)),                          # mbarrier.init.shared.b64
    "llvm.nvvm.mbarrier.inval.shared": (VOID, (_SMEM,)),                             # mbarrier.inval.shared.b64
    "llvm.nvvm.mbarrier.arrive.scope.cta.space.cta": (I64, (_SMEM, I32)),            # mbarrier.arrive (count)
    "llvm.nvvm.mbarrier.arrive.expect.tx.scope.cta.space.cta": (I64, (_SMEM, I32)),  # mbarrier.arrive.expect_tx
    "llvm.nvvm.mbarrier.expect.tx.scope.cta.space.cta": (VOID, (_SMEM, I32)),          # mbarrier.expect_tx
    "llvm.nvvm.mbarrier.try.wait.parity.scope.cta.space.cta": (I1, (_SMEM, I32)),    # mbarrier.try_wait.parity
    "llvm.nvvm.fence.mbarrier_init.release.cluster": (VOID, ()),
    # cp.async.bulk.tensor.<r>d.shared::cluster.global.tile.mbarrier::complete_tx::bytes: (dst, mbarrier, tensor
    # map (generic address), r coordinates innermost first, multicast mask, cache hint, use-multicast flag,
    # use-cache-hint flag, cta_group (immarg, 0 = none)).
    **{f"llvm.nvvm.cp.async.bulk.tensor.g2s.tile.{rank}d":
       (VOID, (_CLUSTER_SMEM, _SMEM, ir.PointerType()) + (I32,) * rank + (I16, I64, I1, I1, I32))
       for rank in range(1, 6)},
    # cp.async.bulk.tensor.<r>d.global.shared::cta.tile.bulk_group: (src, tensor map (generic address), r
    # coordinates innermost first, cache hint, use-cache-hint flag).
    **{f"llvm.nvvm.cp.async.bulk.tensor.s2g.tile.{rank}d":
       (VOID, (_SMEM, ir.PointerType()) + (I32,) * rank + (I64, I1)) for rank in range(1, 6)},
    # -- thread-block clusters (cluster.py) --
    "llvm.nvvm.read.ptx.sreg.cluster.ctarank": (I32, ()),                           # %cluster_ctarank
    **{f"llvm.nvvm.read.ptx.sreg.clusterid.{axis}": (I32, ()) for axis in "xyz"},     # %clusterid.{x,y,z}
    "llvm.nvvm.barrier.cluster.arrive.aligned": (VOID, ()),                         # barrier.cluster.arrive.aligned
    "llvm.nvvm.barrier.cluster.wait.aligned": (VOID, ()),                           # barrier.cluster.wait.aligned
    "llvm.nvvm.mapa.shared.cluster": (_CLUSTER_SMEM, (_SMEM, I32)),                  # mapa.shared::cluster
    # mbarrier.arrive.shared::cluster.b64 _, [remote], count (release at CTA scope: `cluster.py`)
    "llvm.nvvm.mbarrier.arrive.scope.cta.space.cluster": (VOID, (_CLUSTER_SMEM, I32)),
    "llvm.nvvm.cp.async.bulk.commit.group": (VOID, ()),                               # cp.async.bulk.commit_group
    "llvm.nvvm.cp.async.bulk.wait.group.read": (VOID, (I32,)),                        # ...wait_group.read N (immarg)
    "llvm.nvvm.cp.async.bulk.wait.group": (VOID, (I32,)),                             # ...wait_group N (immarg)
}

OVERLOADED: dict[str, Family] = COMMON_OVERLOADED

# Entries only some targets can select, with the `Target` feature they need (the validator checks the op first).
NEEDS: dict[str, str] = {
    **{name: "mma.fp8" for name in FIXED if name.startswith("llvm.nvvm.mma.m16n8k32.row.col.f32.")},
    **{name: "wgmma" for name in FIXED if ".wgmma." in name},
    "llvm.nvvm.fence.proxy.async.shared_cta": "mbarrier",     # sm_90+
    "llvm.nvvm.fence.proxy.async.global": "tma",             # sm_90+
    "llvm.nvvm.setmaxnreg.inc.sync.aligned.u32": "setmaxnreg",
    "llvm.nvvm.setmaxnreg.dec.sync.aligned.u32": "setmaxnreg",
    "llvm.nvvm.elect.sync": "mbarrier",                        # sm_90+
}

# -- libdevice -----------------------------------------------------------------------

# IR math op -> (f32 function, f64 function); each takes and returns its float type.
LIBDEVICE: dict[str, tuple[str, str]] = {
    "exp": ("__nv_expf", "__nv_exp"),
    "exp2": ("__nv_exp2f", "__nv_exp2"),
    "log": ("__nv_logf", "__nv_log"),
    "log2": ("__nv_log2f", "__nv_log2"),
    "rsqrt": ("__nv_rsqrtf", "__nv_rsqrt"),
    "sin": ("__nv_sinf", "__nv_sin"),
    "cos": ("__nv_cosf", "__nv_cos"),
    "tanh": ("__nv_tanhf", "__nv_tanh"),
    "erf": ("__nv_erff", "__nv_erf"),
    "rem": ("__nv_fmodf", "__nv_fmod"),   # two arguments; exact, unlike LLVM's frem expansion
}
LIBDEVICE_ARITY = {"rem": 2}

# IR math op -> f32 approximation without libdevice (exp/log go through base 2).
APPROX: dict[str, str] = {
    "exp2": "llvm.nvvm.ex2.approx.f",
    "log2": "llvm.nvvm.lg2.approx.f",
    "exp": "llvm.nvvm.ex2.approx.f",
    "log": "llvm.nvvm.lg2.approx.f",
    "sin": "llvm.nvvm.sin.approx.f",
    "cos": "llvm.nvvm.cos.approx.f",
    "tanh": "llvm.nvvm.tanh.approx.f32",
    "rsqrt": "llvm.nvvm.rsqrt.approx.f",
}


# IR math op -> the f32 approximation a fast-math kernel uses (`@tessera.kernel(fast_math=True)`), libdevice or not.
FAST_APPROX: dict[str, str] = {
    "exp2": "llvm.nvvm.ex2.approx.ftz.f",
    "exp": "llvm.nvvm.ex2.approx.ftz.f",
    "log2": "llvm.nvvm.lg2.approx.ftz.f",
    "log": "llvm.nvvm.lg2.approx.ftz.f",
}


def libdevice_signature(op: str, float_type: ir.Type) -> tuple[ir.Type, tuple[ir.Type, ...]]:
    return float_type, (float_type,) * LIBDEVICE_ARITY.get(op, 1)


def libdevice_name(op: str, float_type: ir.Type) -> str:
    f32_name, f64_name = LIBDEVICE[op]
    return f64_name if float_type == F64 else f32_name


def libdevice_functions() -> list[str]:
    return [name for pair in LIBDEVICE.values() for name in pair]


# -- declaring and calling ----------------------------------------------------------

NVPTX_INTRINSICS = IntrinsicTable("NVPTX", {**FIXED, **SM90_FIXED}, OVERLOADED)
declare = NVPTX_INTRINSICS.declare
call = NVPTX_INTRINSICS.call


def declare_libdevice(module: ir.Module, op: str, float_type: ir.Type) -> ir.Function:
    ret, args = libdevice_signature(op, float_type)
    return get_or_declare(module, libdevice_name(op, float_type), ret, args)
