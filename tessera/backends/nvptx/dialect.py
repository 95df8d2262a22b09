"""`NvptxDialect`: what NVIDIA GPUs need of the LLVM core (see `tessera.backends.llvm.dialect`).

* the kernel is a `ptx_kernel` function with `"nvvm.maxntid"="<num_threads>"`
  (PTX `.maxntid`, the launch bound);
* shared memory is one dynamic `extern [0 x i8] addrspace(3)` buffer
  (`global_smem`, 16-byte aligned; 1024 in kernels that use wgmma); the launch must pass
  `fn.attrs["shared_bytes"]` as the dynamic size;
* `thread_id` is `%tid.x`; `program_id` / `num_programs` are `%ctaid` /
  `%nctaid` along the axis; `barrier` is `bar.sync 0`;
* a shuffle word is `shfl.sync.<mode>.b32` with the full-warp mask: `width`
  becomes the clamp operand `(32 - width) << 8 | (mode == up ? 0 : 31)`;
* math: `math.py` (libdevice, or MUFU approximations without it);
* an int -> bf16 conversion before sm_90 rounds to odd in f32 first, because
  there is no direct convert and LLVM's int -> f32 -> bf16 rounds twice;
* ordered accesses and atomics use their scope's syncscope ("block",
  "cluster" (sm_90+), "device" by default, "" for the system: PTX `.cta`,
  `.cluster`, `.gpu`, `.sys`); a native atomic at a scope other than the
  GPU's is inline PTX (`scoped_atomics.py`), since LLVM drops its scope.
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.core import Function, Operation
from tessera.ir.mma_layouts import FP8
from tessera.ir.types import scalar_dtype
from tessera.ir.target import Target

from ..llvm.dialect import TargetDialect, add_string_attribute
from ..llvm.types import F32, I8, I32, SHARED_ADDRSPACE, scalar_type
from . import bulk_async  # (also registers the mbarrier and TMA codegen)
from . import cluster  # (registers the cluster ops' codegen)
from . import math as nvptx_math
from . import scoped_atomics
from . import warp_specialization, warpgroup
from .bulk_async import REQUIRED_FEATURES
from .intrinsics import NVPTX_INTRINSICS
from .codegen_table import CODEGEN

SHARED_MEMORY_SYMBOL = "global_smem"
SHARED_MEMORY_ALIGN = 16
FULL_WARP = -1  # 0xffffffff as an i32
_AXES = "xyz"
_TO_F32_TOWARD_ZERO = {("int", 32): "llvm.nvvm.i2f.rz", ("uint", 32): "llvm.nvvm.ui2f.rz",
                       ("int", 64): "llvm.nvvm.ll2f.rz", ("uint", 64): "llvm.nvvm.ull2f.rz"}


class NvptxDialect(TargetDialect):
    name = "NVPTX"
    codegen_table = CODEGEN
    intrinsics = NVPTX_INTRINSICS
    syncscopes = {"cta": "block", "cluster": "cluster", "gpu": "device", "sys": ""}
    unsupported_ops = {
        "mfma": "mfma is an AMD matrix-core instruction that NVIDIA GPUs lack; lower the kernel for this "
                "target (dot then uses mma.sync or FMA)",
        "lds_read_tr": "lds_read_tr is gfx950's LDS transpose read, which NVIDIA GPUs lack; lower the kernel for "
                       "this target (dot operands then use ldmatrix .trans)",
        **{name: f"{name} is part of AMD's wave-group ping-pong (s_barrier / s_setprio / sched_barrier / "
                 f"readfirstlane), which NVIDIA GPUs do not run; on sm_90a take turns with "
                 f"tessera.pipeline(warp_specialize=True, pingpong=True)"
           for name in ("phase_barrier", "set_priority", "sched_fence", "wave_uniform")},
    }

    def __init__(self, target: Target, *, use_libdevice: bool):
        super().__init__(target)
        self.use_libdevice = use_libdevice

    def scope_problem(self, scope: str) -> str | None:
        if scope == "cluster" and not self.target.has("cluster"):
            return (f"scope='cluster' needs thread-block clusters (sm_90+), which {self.target.name} lacks; use "
                    f"scope='gpu' (every program), or 'cta' if only this program's threads take part, or compile "
                    f"for sm_90a")
        return super().scope_problem(scope)

    def scoped_atomic(self, lw, kind, dtype, address, value, scope):
        return scoped_atomics.scoped_atomic(lw, self.target, kind, dtype, address, value, scope)

    def configure_kernel(self, function: ir.Function, fn: Function) -> None:
        function.calling_convention = "ptx_kernel"
        add_string_attribute(function, f'"nvvm.maxntid"="{int(fn.attrs["num_threads"])}"')
        if cluster.cluster_attribute(fn):         # .explicitcluster, .reqnctapercluster X, Y, Z
            add_string_attribute(function, cluster.cluster_attribute(fn))
        if warp_specialization.uses_setmaxnreg(fn):   # ptxas ignores setmaxnreg unless the entry count is fixed
            add_string_attribute(function, '"nvvm.minctasm"="1"')

    def declare_shared_memory(self, module: ir.Module, fn: Function) -> ir.GlobalVariable:
        smem = ir.GlobalVariable(module, ir.ArrayType(I8, 0), SHARED_MEMORY_SYMBOL, addrspace=SHARED_ADDRSPACE)
        smem.linkage = "external"
        # wgmma's swizzle patterns are keyed by absolute shared addresses: start them on a 1024-byte boundary
        uses_wgmma = any(op.name in warpgroup.WARPGROUP_OPS for op in fn.walk())
        smem.align = warpgroup.SHARED_MEMORY_ALIGN if uses_wgmma else SHARED_MEMORY_ALIGN
        smem.type = ir.PointerType(addrspace=SHARED_ADDRSPACE)  # used as raw bytes through opaque pointers
        return smem

    def tensor_map_parameter(self, param: ir.Argument) -> None:
        bulk_async.tensor_map_parameter(param)

    def thread_id(self, lw, reread: bool = False) -> ir.Value:
        if reread:      # volatile: LLVM keeps it (and the index math computed from it) where it stands
            read = ir.InlineAsm(ir.FunctionType(ir.IntType(32), []), "mov.u32 $0, %tid.x;", "=r", side_effect=True)
            return lw.builder.call(read, [])
        return lw.intrinsic("llvm.nvvm.read.ptx.sreg.tid.x", [])

    def program_id(self, lw, axis: int) -> ir.Value:
        return lw.intrinsic(f"llvm.nvvm.read.ptx.sreg.ctaid.{_AXES[axis]}", [])

    def num_programs(self, lw, axis: int) -> ir.Value:
        return lw.intrinsic(f"llvm.nvvm.read.ptx.sreg.nctaid.{_AXES[axis]}", [])

    def barrier(self, lw) -> None:
        lw.intrinsic("llvm.nvvm.barrier.cta.sync.aligned.all", [ir.Constant(I32, 0)])

    def nanosleep(self, lw, ns: ir.Value) -> None:
        lw.intrinsic("llvm.nvvm.nanosleep", [ns])      # nanosleep.u32 (sm_70+): within [0, 2 * ns], at most 1 ms

    def shuffle_word(self, lw, mode: str, word: ir.Value, lane: ir.Value, width: int) -> ir.Value:
        warp = self.target.warp_size
        clamp = ir.Constant(I32, ((warp - width) << 8) | (0 if mode == "up" else warp - 1))
        return lw.intrinsic(f"llvm.nvvm.shfl.sync.{mode}.i32", [ir.Constant(I32, FULL_WARP), word, lane, clamp])

    def math(self, lw, name: str, x: ir.Value) -> ir.Value:
        return nvptx_math.math_function(lw, name, x, self.use_libdevice, lw.fast_math)

    def float_rem(self, lw, a: ir.Value, b: ir.Value) -> ir.Value:
        return nvptx_math.fmod(lw, a, b)

    def math_support(self, name: str, dtype: dt.DType) -> str | None:
        return nvptx_math.math_support(name, dtype, self.use_libdevice)

    def wide_int_to_bf16(self, lw, x: ir.Value, src: dt.DType) -> ir.Value:
        if sm_version(self.target) >= 90:
            return super().wide_int_to_bf16(lw, x, src)
        return lw.map_lanes(lambda v: _wide_int_to_bf16_by_odd_rounding(lw, v, src), x)

    def check_op(self, op: Operation) -> str | None:
        target = self.target
        if op.name in warpgroup.WARPGROUP_OPS:
            return warpgroup.check_op(op, target)
        if op.name in warp_specialization.NEEDS:
            return warp_specialization.check_op(op, target)
        if op.name == "mma" and not target.has("mma.sync"):
            return (f"mma needs mma.sync, which {target.name} lacks; lower the kernel for this target "
                    "(dot then uses FMA)")
        if op.name == "mma" and scalar_dtype(op.operands[0].type) in FP8 and not target.has("mma.fp8"):
            return (f"mma on fp8 (e4m3/e5m2) fragments needs sm_89+, which {target.name} is not; lower the kernel "
                    "for this target (dot then uses FMA)")
        if op.name == "ldmatrix" and not target.has("ldmatrix"):
            return (f"ldmatrix needs sm_75+, which {target.name} is not; lower the kernel for this target "
                    "(dot operands then go through plain shared-memory loads)")
        if op.name == "stmatrix" and not target.has("stmatrix"):
            return (f"stmatrix needs sm_90+, which {target.name} is not; lower the kernel for this target "
                    "(tiles then reach shared memory through st.shared)")
        if op.name in ("async_copy", "async_commit", "async_wait") and not target.has("cp.async"):
            return (f"{op.name} needs cp.async (sm_80+), which {target.name} lacks; lower the kernel for this "
                    "target (operands then go through registers)")
        if op.name in cluster.REQUIRED_FEATURES or op.attrs.get("multicast"):
            if not target.has("cluster"):
                return (f"{op.name}{' with multicast' if op.name == 'tma_load' else ''} needs thread-block "
                        f"clusters (sm_90+), which {target.name} lacks; compile for sm_90a or without clusters")
        if op.name in REQUIRED_FEATURES:
            feature, what = REQUIRED_FEATURES[op.name]
            if not target.has(feature):
                return (f"{op.name} needs {what}, which {target.name} lacks; compile for sm_90a or lower the kernel "
                        "for this target without sm_90's asynchronous units")
        return None


def sm_version(target: Target) -> int:
    """80 for sm_80, 90 for sm_90a."""
    digits = "".join(c for c in target.llvm_cpu.removeprefix("sm_") if c.isdigit())
    return int(digits)


def _wide_int_to_bf16_by_odd_rounding(lw, x, src: dt.DType):
    """One 32/64-bit int -> bf16, rounded once: round to f32 toward zero, set the last bit if that
    was inexact (round to odd, which keeps the information a second rounding needs), then round
    to bf16."""
    bld = lw.builder
    t = lw.intrinsic(_TO_F32_TOWARD_ZERO[(src.kind, src.bits)], [x])
    back = lw.intrinsic("llvm.fptosi.sat" if src.kind == "int" else "llvm.fptoui.sat", [t], (x.type, F32))
    inexact = bld.zext(bld.icmp_unsigned("!=", back, x), ir.IntType(32))
    odd = bld.bitcast(bld.or_(bld.bitcast(t, ir.IntType(32)), inexact), F32)
    return bld.fptrunc(odd, scalar_type(dt.bf16))
