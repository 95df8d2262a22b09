"""Every entry of the AMDGPU intrinsics table compiles to an object, for gfx90a, gfx942 and gfx950.

LLVM aborts the process on an intrinsic the GPU cannot select, and turns an
unknown name into an external call (the linker's `--no-undefined` would be
the first to notice). So each name in `FIXED` and each overload in
`OVERLOADED[...].examples` is called from one kernel per target, compiled
in a child process, and the assembly is checked to call nothing external.
The MFMA entries must become `v_mfma` instructions. The `GFX950_ONLY`
entries (the double-K and the OCP fp8 MFMA, the double-rate f8f6f4 through
the scale intrinsic with zero scales) are called for gfx950 alone and must
become their own, unscaled, instructions there.
"""

import re

import pytest
from llvmlite import ir

from tessera.backends.amdgpu.intrinsics import AMDGPU_INTRINSICS, FIXED, GFX950_ONLY, OVERLOADED
from tessera.backends.llvm.run import run_llvm_isolated
from tessera.backends.llvm.types import I8, I64

TARGETS = ("gfx90a", "gfx942", "gfx950")
IMMEDIATE_ARGS = 3   # the trailing cbsz, abid, blgp of an mfma must be constants
# s_sleep's, s_setprio's and sched_barrier's one operand is an immediate too
ONE_IMMEDIATE = ("llvm.amdgcn.s.sleep", "llvm.amdgcn.s.setprio", "llvm.amdgcn.sched.barrier", "llvm.amdgcn.s.waitcnt")
# global_load_lds's bytes, offset and aux are immediates, and bytes must be a width it has
IMMEDIATES = {"llvm.amdgcn.global.load.lds": (4, 0, 0)}
# the f8f6f4 MFMA's formats (e4m3), scale op selects (immediates) and scales: all 0, the unscaled instruction
IMMEDIATES.update({name: (0,) * 6 for name in GFX950_ONLY if ".mfma.scale." in name})


def _table_kernel(target: str) -> str:
    """One amdgpu_kernel calling every table entry on loaded (not constant-folded) arguments."""
    module = ir.Module("intrinsics")
    module.triple = "amdgcn-amd-amdhsa"
    ptr = ir.PointerType(addrspace=1)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr]), "intrinsics")
    fn.calling_convention = "amdgpu_kernel"
    src, dst = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    offset = 0

    def address(base):
        nonlocal offset
        offset += 256
        return b.gep(base, [ir.Constant(I64, offset)], source_etype=I8)

    def call(callee: ir.Function, name: str):
        types = callee.function_type.args
        fixed = IMMEDIATES.get(name)
        immediates = len(fixed) if fixed else IMMEDIATE_ARGS if ".mfma." in name else 1 if name in ONE_IMMEDIATE else 0
        loaded = [b.load(address(src), typ=t) for t in types[:len(types) - immediates]]
        values = fixed or [0] * immediates
        result = b.call(callee, loaded + [ir.Constant(t, v) for t, v in zip(types[len(types) - immediates:], values)])
        if not isinstance(callee.function_type.return_type, ir.VoidType):
            b.store(result, address(dst))

    for name in FIXED:
        if target == "gfx950" or name not in GFX950_ONLY:
            call(AMDGPU_INTRINSICS.declare(module, name), name)
    for family, spec in OVERLOADED.items():
        for overloads in spec.examples:
            callee = AMDGPU_INTRINSICS.declare(module, family, overloads)
            if family == "llvm.abs":       # its i1 operand is an immediate
                x = b.load(address(src), typ=overloads[0])
                b.store(b.call(callee, [x, ir.Constant(ir.IntType(1), 0)]), address(dst))
            else:
                call(callee, family)
    b.ret_void()
    return str(module)


@pytest.mark.parametrize("target", TARGETS)
def test_every_table_entry_compiles_for_the_target(target):
    reply = run_llvm_isolated({"llvm_ir": _table_kernel(target), "kernel": "intrinsics", "triple": "amdgcn-amd-amdhsa",
                               "cpu": target, "features": "", "opt_level": 3, "emit_object": True},
                              backend="AMDGPU")
    assembly = reply["assembly"]
    assert reply["object"][:4] == b"\x7fELF"
    assert not re.search(r"s_swappc|s_setpc|\bcall\b", assembly), "an intrinsic became an external call"
    mfma_entries = [name for name in FIXED if ".mfma." in name and (target == "gfx950" or name not in GFX950_ONLY)]
    assert len(mfma_entries) == (18 if target == "gfx950" else 4)
    assert len(re.findall(r"\bv_mfma_f32_\w+", assembly)) >= len(mfma_entries)
    wide = set(re.findall(r"\bv_mfma_f32_(32x32x16|16x16x32)_(f16|bf16)\b", assembly))
    every_wide = {(s, t) for s in ("32x32x16", "16x16x32") for t in ("f16", "bf16")}
    assert wide == (every_wide if target == "gfx950" else set())
    fp8 = set(re.findall(r"\bv_mfma_f32_(32x32x16|16x16x32)_(fp8|bf8)_(fp8|bf8)\b", assembly))
    every_fp8 = {(s, x, y) for s in ("32x32x16", "16x16x32") for x in ("fp8", "bf8") for y in ("fp8", "bf8")}
    assert fp8 == (every_fp8 if target == "gfx950" else set())
    f8f6f4 = set(re.findall(r"\bv_mfma_f32_(32x32x64|16x16x128)_f8f6f4\b", assembly))
    assert f8f6f4 == ({"32x32x64", "16x16x128"} if target == "gfx950" else set())
    assert "v_mfma_scale" not in assembly                   # zero scales: the unscaled instruction
