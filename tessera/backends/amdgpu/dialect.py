"""`AmdgpuDialect`: what AMD GPUs (gfx90a, gfx942, gfx950) need of the LLVM core.

* the kernel is an `amdgpu_kernel` function with
  `"amdgpu-flat-work-group-size"="1,<num_threads>"` (the launch bound, which
  also sizes the register budget), in a module flagged for code object v5
  (`amdhsa_code_object_version` = 500);
* shared memory is LDS: one static `[shared_bytes x i8] addrspace(3)`
  global (`tessera_lds`, 16-byte aligned), so the code object's
  `.group_segment_fixed_size` already covers it and a launch passes 0
  dynamic bytes (`DYNAMIC_SHARED_BYTES`);
* `thread_id` / `program_id` are `llvm.amdgcn.workitem.id.x` /
  `workgroup.id.<axis>`; `num_programs` reads the HSA dispatch packet:
  grid_size (u32 at byte 12 + 4 axis, in work-items, as HIP sets it) /
  workgroup_size (u16 at byte 4 + 2 axis);
* `barrier` is a workgroup-scope release fence, `s_barrier`, and an acquire
  fence (s_barrier alone orders execution, not LDS or global memory); in a
  kernel with direct-to-LDS copies (`async_copy`, `lds_dma.py`) it is
  `s_waitcnt lgkmcnt(0); s_barrier`, so that it does not wait for them;
* a shuffle word moves with `ds_bpermute_b32`: each lane computes the lane
  it reads (the same rule as PTX `shfl.sync` and the SIMT simulator, with
  `width` segments) and asks for its byte address, lane * 4 (wave64);
* math: `math.py`; ordered accesses and atomics use their scope's
  syncscope: "workgroup" (cta), "agent" (gpu, the default), "" (sys); no
  cluster scope (gfx9 has no clusters);
* `nanosleep` is `s_sleep`, whose immediate counts 64 clocks (about 30 ns
  at gfx942's 2.1 GHz): a constant becomes one `s_sleep` of up to 127
  units, a value known only at run time a loop of `s_sleep 1` per whole unit (at
  most 1 ms).
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.core import Function, Operation
from tessera.ir.mfma_layouts import MFMA_FP8, MFMA_WIDE_SHAPES
from tessera.ir.types import scalar_dtype

from ..llvm.dialect import TargetDialect, add_string_attribute
from ..llvm.types import I8, I16, I32, SHARED_ADDRSPACE
from . import lds_dma, math as amdgpu_math
from .intrinsics import AMDGPU_INTRINSICS
from .codegen_table import CODEGEN

CODE_OBJECT_VERSION = 500
LDS_SYMBOL = "tessera_lds"
LDS_ALIGN = 16
DYNAMIC_SHARED_BYTES = 0  # all LDS is static: the launch passes no dynamic group segment
SLEEP_UNIT_NS = 30        # one s_sleep unit: 64 clocks at ~2.1 GHz (gfx942's peak engine clock)
MAX_SLEEP_UNITS = 127     # s_sleep's immediate is 7 bits
MAX_SLEEP_NS = 1_000_000  # a sleep known only at run time is cut at 1 ms, NVIDIA's bound
# hsa_kernel_dispatch_packet_t byte offsets
WORKGROUP_SIZE_OFFSET = 4   # u16 workgroup_size_{x,y,z}
GRID_SIZE_OFFSET = 12       # u32 grid_size_{x,y,z}, in work-items
_AXES = "xyz"

_NVIDIA_ONLY = "is an NVIDIA instruction that AMD GPUs lack; lower the kernel for this AMD target ({target}) so "
UNSUPPORTED_OPS = {
    "mma": "mma (mma.sync) " + _NVIDIA_ONLY + "dot uses MFMA or FMA",
    "ldmatrix": "ldmatrix " + _NVIDIA_ONLY + "dot operands go through plain LDS loads",
    "stmatrix": "stmatrix " + _NVIDIA_ONLY + "tiles reach LDS through plain stores",
    **{name: f"{name} (sm_90 mbarriers) " + _NVIDIA_ONLY + "blocks synchronize with barriers"
       for name in ("mbarrier_init", "mbarrier_arrive", "mbarrier_arrive_expect_tx", "mbarrier_wait",
                    "fence_mbarrier_init", "fence_proxy_async", "fence_proxy_async_global")},
    "tma_load": "tma_load (the Tensor Memory Accelerator) " + _NVIDIA_ONLY + "tiles are loaded by the threads",
    **{name: f"{name} (the Tensor Memory Accelerator) " + _NVIDIA_ONLY + "tiles are stored by the threads"
       for name in ("tma_store", "bulk_commit_group", "bulk_wait_group_read", "bulk_wait_group")},
    **{name: f"{name} (Hopper warpgroup MMA) " + _NVIDIA_ONLY + "dot uses MFMA"
       for name in ("wgmma", "wgmma_desc", "wgmma_fence", "wgmma_commit", "wgmma_wait")},
    "setmaxnreg": "setmaxnreg (Hopper register rebalancing) " + _NVIDIA_ONLY + "it runs without warp specialization",
    "print": ("device-side print on AMD GPUs needs the ROCm device library's printf (ockl's hostcall buffer), "
              "which Tessera does not link yet; print in the CPU interpreter (TESSERA_INTERPRET=1), or build "
              "without debug (TESSERA_DEBUG unset) to drop it; device_assert works on {target} (it traps)"),
    "elect_sync": "elect_sync (elect.sync) " + _NVIDIA_ONLY + "one lane is chosen by its lane id",
    "named_barrier": "named_barrier (bar.sync id, count) " + _NVIDIA_ONLY + "threads meet at the block-wide barrier",
}


class AmdgpuDialect(TargetDialect):
    name = "AMDGPU"
    codegen_table = CODEGEN
    intrinsics = AMDGPU_INTRINSICS
    syncscopes = {"cta": "workgroup", "gpu": "agent", "sys": ""}

    def scope_problem(self, scope: str) -> str | None:
        if scope == "cluster":
            return (f"scope='cluster' has no meaning on {self.target.name}: AMD GPUs of this generation have no "
                    f"thread-block clusters (nor LLVM a cluster syncscope for them); use scope='cta' (the "
                    f"workgroup) if only this program's threads take part, else scope='gpu' (the agent)")
        return super().scope_problem(scope)

    @property
    def unsupported_ops(self) -> dict[str, str]:
        return {name: reason.format(target=self.target.name) for name, reason in UNSUPPORTED_OPS.items()}

    def check_op(self, op: Operation) -> str | None:
        """gfx950's double-K MFMA shapes need the target's "mfma.wide" (LLVM aborts on them elsewhere), fp8
        ones its "mfma.fp8" (gfx942 would read the OCP bytes as fnuz fp8); an async_copy needs a direct-to-LDS
        load of its width (`lds_dma.check_copy`)."""
        if op.name == "async_copy":
            return lds_dma.check_copy(self.target, op.attrs["bytes"])
        if op.name == "lds_read_tr" and not self.target.has("lds.read.tr"):
            return (f"lds_read_tr (ds_read_b64_tr_b16) is a gfx950 (\"lds.read.tr\") instruction that "
                    f"{self.target.name} lacks; lower the kernel for {self.target.name} (its MFMA operands are then "
                    f"read from LDS element by element) or compile for gfx950")
        if op.name == "mfma" and scalar_dtype(op.operands[0].type) in MFMA_FP8 and not self.target.has("mfma.fp8"):
            return (f"mfma on fp8 (e4m3/e5m2) fragments needs gfx950's OCP fp8 MFMA (\"mfma.fp8\"), which "
                    f"{self.target.name} lacks (gfx942's fp8 MFMA reads the fnuz formats, which would misread these "
                    f"bytes); lower the kernel for {self.target.name} (its fp8 dots then run exactly on FMA) or "
                    f"compile for gfx950")
        if op.name == "mfma" and (op.attrs["m"], op.attrs["n"], op.attrs["k"]) in MFMA_WIDE_SHAPES \
                and not self.target.has("mfma.wide"):
            return (f"mfma {op.attrs['m']}x{op.attrs['n']}x{op.attrs['k']} is a gfx950 (\"mfma.wide\") instruction "
                    f"that {self.target.name} lacks; lower the kernel for {self.target.name} (its dots then use "
                    f"32x32x8 or 16x16x16) or compile for gfx950")
        return None

    def configure_kernel(self, function: ir.Function, fn: Function) -> None:
        function.calling_convention = "amdgpu_kernel"
        add_string_attribute(function, f'"amdgpu-flat-work-group-size"="1,{int(fn.attrs["num_threads"])}"')
        module = function.module
        flag = module.add_metadata([ir.Constant(I32, 1), ir.MetaDataString(module, "amdhsa_code_object_version"),
                                    ir.Constant(I32, CODE_OBJECT_VERSION)])
        module.add_named_metadata("llvm.module.flags", flag)

    def declare_shared_memory(self, module: ir.Module, fn: Function) -> ir.GlobalVariable:
        array = ir.ArrayType(I8, int(fn.attrs.get("shared_bytes", 0)))
        lds = ir.GlobalVariable(module, array, LDS_SYMBOL, addrspace=SHARED_ADDRSPACE)
        lds.linkage = "internal"
        lds.initializer = ir.Constant(array, ir.Undefined)  # LDS cannot be initialized
        lds.align = LDS_ALIGN
        lds.type = ir.PointerType(addrspace=SHARED_ADDRSPACE)  # used as raw bytes through opaque pointers
        return lds

    def thread_id(self, lw, reread: bool = False) -> ir.Value:
        # the work-item id arrives in v0 and has no register to read again: `reread` reads the intrinsic too.
        # Its range is the block's: LLVM then folds bounds checks such as (tid >> 6) + 124 < 128, which it
        # would otherwise keep (a wave64 lane mask: two SGPRs for each element of a checked tile)
        tid = lw.intrinsic("llvm.amdgcn.workitem.id.x", [])
        tid.set_metadata("range", lw.module.add_metadata([ir.Constant(I32, 0), ir.Constant(I32, int(lw.fn.attrs["num_threads"]))]))
        return tid

    def program_id(self, lw, axis: int) -> ir.Value:
        return lw.intrinsic(f"llvm.amdgcn.workgroup.id.{_AXES[axis]}", [])

    def num_programs(self, lw, axis: int) -> ir.Value:
        bld = lw.builder
        packet = lw.intrinsic("llvm.amdgcn.dispatch.ptr", [])
        size_address = bld.gep(packet, [ir.Constant(I32, WORKGROUP_SIZE_OFFSET + 2 * axis)], source_etype=I8)
        grid_address = bld.gep(packet, [ir.Constant(I32, GRID_SIZE_OFFSET + 4 * axis)], source_etype=I8)
        block = bld.zext(bld.load(size_address, typ=I16, align=2), I32)
        grid = bld.load(grid_address, typ=I32, align=4)
        return bld.udiv(grid, block)

    def barrier(self, lw) -> None:
        state = lds_dma.lds_dma(lw)
        if state is not None:       # fences would wait for every LDS DMA in flight (see lds_dma.py)
            state.barrier()
            return
        lw.builder.fence("release", "workgroup")
        lw.intrinsic("llvm.amdgcn.s.barrier", [])
        lw.builder.fence("acquire", "workgroup")

    def finish_kernel(self, lw) -> None:
        state = lds_dma.lds_dma(lw)
        if state is not None:
            state.tag_lds_accesses()

    def nanosleep(self, lw, ns: ir.Value) -> None:
        if isinstance(ns, ir.Constant):
            units = min(MAX_SLEEP_UNITS, -(-int(ns.constant) // SLEEP_UNIT_NS))
            if units > 0:
                lw.intrinsic("llvm.amdgcn.s.sleep", [ir.Constant(I32, units)])
            return
        # s_sleep takes only an immediate: sleep one unit at a time, ceil(ns / unit) times
        bld = lw.builder
        units = bld.udiv(ns, ir.Constant(I32, SLEEP_UNIT_NS))
        most = ir.Constant(I32, MAX_SLEEP_NS // SLEEP_UNIT_NS)        # as NVIDIA's, at most 1 ms (ns is unsigned)
        units = bld.select(bld.icmp_unsigned("<", units, most), units, most)
        start = bld.block
        head, body, done = lw.new_block("sleep.head"), lw.new_block("sleep.body"), lw.new_block("sleep.done")
        bld.branch(head)
        bld.position_at_end(head)
        slept = bld.phi(I32)
        slept.add_incoming(ir.Constant(I32, 0), start)
        bld.cbranch(bld.icmp_unsigned("<", slept, units), body, done)
        bld.position_at_end(body)
        lw.intrinsic("llvm.amdgcn.s.sleep", [ir.Constant(I32, 1)])
        slept.add_incoming(bld.add(slept, ir.Constant(I32, 1)), bld.block)
        bld.branch(head)
        bld.position_at_end(done)

    def shuffle_word(self, lw, mode: str, word: ir.Value, lane: ir.Value, width: int) -> ir.Value:
        bld = lw.builder
        warp = self.target.warp_size

        def c(v):
            return ir.Constant(I32, v)

        all_lanes = c(-1)
        lane_id = lw.intrinsic("llvm.amdgcn.mbcnt.hi", [all_lanes, lw.intrinsic("llvm.amdgcn.mbcnt.lo",
                                                                                 [all_lanes, c(0)])])
        b = bld.and_(lane, c(warp - 1))
        first = bld.and_(lane_id, c(~(width - 1)))           # this lane's segment is [first, last]
        last = bld.or_(first, c(width - 1))
        if mode == "up":
            src = bld.sub(lane_id, b)
            src = bld.select(bld.icmp_signed(">=", src, first), src, lane_id)
        elif mode == "down":
            src = bld.add(lane_id, b)
            src = bld.select(bld.icmp_signed("<=", src, last), src, lane_id)
        elif mode == "bfly":
            src = bld.xor(lane_id, b)
            src = bld.select(bld.icmp_signed("<=", src, last), src, lane_id)
        else:  # idx
            src = bld.or_(first, bld.and_(b, c(width - 1)))
        return lw.intrinsic("llvm.amdgcn.ds.bpermute", [bld.shl(src, c(2)), word])

    def math(self, lw, name: str, x: ir.Value) -> ir.Value:
        return amdgpu_math.math_function(lw, name, x)

    def float_rem(self, lw, a: ir.Value, b: ir.Value) -> ir.Value:
        return amdgpu_math.fmod(lw, a, b)

    def math_support(self, name: str, dtype: dt.DType) -> str | None:
        return amdgpu_math.math_support(name, dtype)
