"""Asynchronous copies into LDS on CDNA3 (gfx942, gfx950): `async_copy` as `global_load_lds`, waits as vmcnt.

The thread ops are NVIDIA's cp.async ones (`async_copy {bytes}`, `async_commit`, `async_wait {pending}`);
here they become:

* `async_copy dst, src, pred {bytes}` -> `llvm.amdgcn.global.load.lds(src, base, bytes, 0, 0)`. The LDS
  address is not per lane: M0 holds one base for the wave and lane i writes at base + i * bytes. So the
  base is dst - lane * bytes (LLVM reads it from the first active lane), which is right only when the
  wave's lanes copy to consecutive LDS chunks: the lowering (`shared_buffers.copy_plan`) emits LDS copies
  only in such layouts, and the SIMT simulator checks every one (`simt/lds_dma.py`). A lane whose
  predicate is false copies `bytes` of zeros from `tessera_lds_dma_zeros` (a 16-byte constant in the code
  object) instead: the zero fill of cp.async, with the instruction issued by every lane (see the waits).
* `async_commit` -> nothing: vmcnt counts instructions, not groups.
* `async_wait {pending = P}` -> `s_waitcnt vmcnt(P * C)`, C the fewest copies any commit group of the
  function holds (static count of `async_copy` ops between commits, in program order). Vector memory
  loads complete in issue order, so at most P * C outstanding means every group older than the last P
  has landed; other loads issued since only make the wait longer. This needs C to be a lower bound on
  what each wave issues: a group with a copy outside its commit's block (under a branch a whole wave
  may skip) makes C 0, so every wait is vmcnt(0); the lowering emits no such copy.
* LLVM would add `s_waitcnt vmcnt(0)` before every LDS access and at every workgroup release fence while
  an LDS DMA may be in flight, which serializes the copies with the compute. So LDS DMA calls carry the
  alias scope `tessera.lds_dma` and every other LDS access `tessera.lds_access` with `noalias` to the
  DMA (the author's waits order them, as with cp.async), and `barrier` in a kernel with LDS DMA is
  `s_waitcnt lgkmcnt(0); s_barrier` between wavefront-scope fences: what LLVM's workgroup fences emit on
  gfx942 (no vmcnt wait outside tgsplit mode) minus the DMA wait. The wavefront fences emit nothing but
  keep LLVM's IR passes from moving memory accesses across the barrier or a wait (the s_waitcnt and
  s_barrier intrinsics are `memory(none)`; inline asm would do, but llvmlite's LLVM has no AMDGPU asm
  parser to emit an object with it). Checked on LLVM 22 (llvmlite 0.50): `tests/backends/test_amdgpu_lds_dma.py`.
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir.core import Function
from tessera.ir.target import lds_dma_bytes

from ..llvm.types import I8, I32

ZEROS_SYMBOL = "tessera_lds_dma_zeros"
ZEROS_BYTES = 16
MAX_VMCNT = 63                       # gfx9's vmcnt field: 6 bits (bits 3:0 and 15:14)
_NO_EXPCNT, _NO_LGKMCNT = 0x7 << 4, 0xF << 8
_NO_VMCNT = 0xF | (0x3 << 14)


def waitcnt_vmcnt(n: int) -> int:
    """s_waitcnt's immediate on gfx9 that waits for vmcnt <= n only (expcnt and lgkmcnt at their maxima)."""
    n = min(n, MAX_VMCNT)
    return (n & 0xF) | ((n >> 4) << 14) | _NO_EXPCNT | _NO_LGKMCNT


WAITCNT_LGKMCNT_0 = _NO_VMCNT | _NO_EXPCNT      # s_waitcnt lgkmcnt(0): this wave's LDS accesses are done


def copies_per_group(fn: Function) -> int:
    """The fewest `async_copy` ops between two `async_commit`s of `fn`, in program order (0: no commit). A group
    with a copy in another block than its commit's (under an `if`, or in a loop that may run no iteration)
    may issue fewer than it shows: then 0, and every wait is vmcnt(0)."""
    counts, group = [], []
    for op in fn.walk():
        if op.name == "async_copy":
            group.append(op)
        elif op.name == "async_commit":
            counts.append(0 if any(copy.parent is not op.parent for copy in group) else len(group))
            group = []
    return min(counts, default=0)


def check_copy(target, nbytes: int) -> str | None:
    """Why `async_copy {bytes = nbytes}` has no LDS DMA on `target` (None: it has)."""
    widths = lds_dma_bytes(target)
    if nbytes in widths:
        return None
    if not widths:
        return (f"async_copy (a direct global->LDS load) needs CDNA3 (gfx942, gfx950); {target.name} lacks it, "
                f"so lower the kernel for {target.name} (its copies then go through registers)")
    return (f"async_copy of {nbytes} bytes a lane has no direct-to-LDS load on {target.name} (it has "
            f"{', '.join(map(str, widths))} bytes); lower the kernel for {target.name}, which picks a width it has")


class LdsDma:
    """The LDS DMA state of one kernel's codegen: scopes, the zero source, the copies per commit group."""

    def __init__(self, lw):
        self.lw = lw
        self.group = copies_per_group(lw.fn)
        module = lw.module
        domain = module.add_metadata([ir.MetaDataString(module, "tessera.lds")])
        dma = module.add_metadata([ir.MetaDataString(module, "tessera.lds_dma"), domain])
        access = module.add_metadata([ir.MetaDataString(module, "tessera.lds_access"), domain])
        self.dma_scope = module.add_metadata([dma])
        self.access_scope = module.add_metadata([access])
        zeros_type = ir.ArrayType(I8, ZEROS_BYTES)
        self.zeros = ir.GlobalVariable(module, zeros_type, ZEROS_SYMBOL, addrspace=1)
        self.zeros.global_constant = True
        self.zeros.linkage = "internal"
        self.zeros.initializer = ir.Constant(zeros_type, None)
        self.zeros.align = ZEROS_BYTES

    def copy(self, dst: ir.Value, src: ir.Value, pred: ir.Value, nbytes: int) -> None:
        lw, bld = self.lw, self.lw.builder
        zeros = bld.bitcast(self.zeros, src.type)
        source = src if isinstance(pred, ir.Constant) and pred.constant else bld.select(pred, src, zeros)
        all_lanes = ir.Constant(I32, -1)
        lane = lw.intrinsic("llvm.amdgcn.mbcnt.hi",
                            [all_lanes, lw.intrinsic("llvm.amdgcn.mbcnt.lo", [all_lanes, ir.Constant(I32, 0)])])
        back = bld.sub(ir.Constant(I32, 0), bld.mul(lane, ir.Constant(I32, nbytes)))
        base = bld.gep(dst, [back], source_etype=I8)
        call = lw.intrinsic("llvm.amdgcn.global.load.lds",
                            [source, base, ir.Constant(I32, nbytes), ir.Constant(I32, 0), ir.Constant(I32, 0)])
        call.set_metadata("alias.scope", self.dma_scope)

    def wait(self, pending: int) -> None:
        self.lw.intrinsic("llvm.amdgcn.s.waitcnt", [ir.Constant(I32, waitcnt_vmcnt(pending * self.group))])
        self.lw.builder.fence("acquire", "wavefront")   # no instruction; keeps LLVM from hoisting loads above

    def barrier(self) -> None:
        bld = self.lw.builder
        bld.fence("release", "wavefront")                # no instruction: orders memory accesses for LLVM's
        self.lw.intrinsic("llvm.amdgcn.s.waitcnt", [ir.Constant(I32, WAITCNT_LGKMCNT_0)])    # optimizer only
        self.lw.intrinsic("llvm.amdgcn.s.barrier", [])
        bld.fence("acquire", "wavefront")

    def tag_lds_accesses(self) -> None:
        """Every LDS load and store other than the DMA: in scope `tessera.lds_access`, not aliasing the DMA."""
        for block in self.lw.function.blocks:
            for instr in block.instructions:
                if isinstance(instr, ir.LoadInstr):
                    pointer = instr.operands[0]
                elif isinstance(instr, ir.StoreInstr):
                    pointer = instr.operands[1]
                else:
                    continue
                if getattr(pointer.type, "addrspace", 0) == 3:
                    instr.set_metadata("alias.scope", self.access_scope)
                    instr.set_metadata("noalias", self.dma_scope)


def lds_dma(lw) -> LdsDma | None:
    """The kernel's `LdsDma` when its thread IR has an async_copy (made on first use), else None."""
    state = getattr(lw, "_lds_dma", False)
    if state is False:
        state = LdsDma(lw) if any(op.name == "async_copy" for op in lw.fn.walk()) else None
        lw._lds_dma = state
    return state
