"""Every entry of the NVPTX intrinsics table assembles, for sm_80 and sm_90a.

An entry in `intrinsics.NEEDS` (fp8 mma: sm_89+; wgmma: sm_90a) is compiled only for the
targets with that feature, each target with its own PTX version (sm_90a:
+ptx84, which fp8 mma.sync needs).

LLVM turns an unknown intrinsic name into a call of an external function
(only ptxas notices) and aborts on one the GPU cannot select, so each name
in `intrinsics.FIXED`, each overload in `intrinsics.OVERLOADED[...].examples`
and each libdevice function is called from one kernel per target, compiled
in a child process, and the PTX is checked to call nothing external and
assembled.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
from llvmlite import ir

from tessera.backends.nvptx import find_libdevice, find_ptxas
from tessera.backends.nvptx import intrinsics as nv
from tessera.backends.nvptx.compile import _run_llvm_isolated
from tessera.backends.llvm.types import F32, F64, I8, I32
from tessera.backends.nvptx.ptxas import assemble
from tessera.ir.target import get_target

TARGETS = ("sm_80", "sm_90a")


class _Kernel:
    """A kernel that feeds each call loaded (so not constant-folded) arguments and stores its result."""

    def __init__(self):
        self.module = ir.Module("intrinsics")
        self.module.triple = "nvptx64-nvidia-cuda"
        ptr = ir.PointerType(addrspace=1)
        self.fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [ptr, ptr]), "intrinsics")
        self.fn.calling_convention = "ptx_kernel"
        self.src, self.dst = self.fn.args
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.offset = 0

    def _address(self, base, t: ir.Type):
        self.offset += 64
        return self.b.gep(base, [ir.Constant(ir.IntType(64), self.offset)], source_etype=I8)

    def call(self, callee: ir.Function, args=None):
        if args is None:
            args = [self.b.load(self._address(self.src, t), typ=t) for t in callee.function_type.args]
        result = self.b.call(callee, args)
        if not isinstance(callee.function_type.return_type, ir.VoidType):
            self.b.store(result, self._address(self.dst, result.type))

    def finish(self) -> str:
        self.b.ret_void()
        return str(self.module)


def _special_args(k: _Kernel, name: str):
    if name in ("llvm.nvvm.barrier.cta.sync.aligned.all", "llvm.nvvm.cp.async.wait.group"):
        return [ir.Constant(I32, 0)]
    if name.startswith("llvm.nvvm.setmaxnreg."):
        return [ir.Constant(I32, 64)]
    if name == "llvm.nvvm.wgmma.wait_group.sync.aligned":
        return [ir.Constant(ir.IntType(64), 0)]
    if name.startswith("llvm.nvvm.shfl.sync"):
        value, lane = (k.b.load(k._address(k.src, I32), typ=I32) for _ in range(2))
        return [ir.Constant(I32, -1), value, lane, ir.Constant(I32, 31)]
    return None


def _table_kernel(target: str, with_libdevice: bool) -> tuple[str, list[str]]:
    k = _Kernel()
    for name in nv.FIXED:
        if name in nv.NEEDS and not get_target(target).has(nv.NEEDS[name]):
            continue
        k.call(nv.declare(k.module, name), _special_args(k, name))
    for family, spec in nv.OVERLOADED.items():
        for overloads in spec.examples:
            callee = nv.declare(k.module, family, overloads)
            args = None
            if family == "llvm.abs":
                x = k.b.load(k._address(k.src, overloads[0]), typ=overloads[0])
                args = [x, ir.Constant(ir.IntType(1), 0)]
            k.call(callee, args)
    libdevice = []
    if with_libdevice:
        for op in nv.LIBDEVICE:
            for float_type in (F32, F64):
                callee = nv.declare_libdevice(k.module, op, float_type)
                libdevice.append(callee.name)
                k.call(callee)
    return k.finish(), libdevice


def _compile_and_assemble(target: str, libdevice) -> None:
    text, functions = _table_kernel(target, with_libdevice=libdevice is not None)
    request = {"llvm_ir": text, "kernel": "intrinsics", "triple": "nvptx64-nvidia-cuda", "cpu": target,
               "features": get_target(target).llvm_features, "bitcode_library": str(libdevice) if libdevice else None,
               "library_functions": functions}
    ptx = _run_llvm_isolated(request)["assembly"]  # a child process: an abort fails the test, not pytest
    # an unknown name would be left as a call of an external function
    assert ".extern .func" not in ptx and "llvm." not in ptx
    tool = find_ptxas()
    if tool is not None:
        cubin, info = assemble(ptx, target, tool)
        assert cubin


def test_every_table_entry_compiles_and_assembles_for_sm_80_and_sm_90a():
    libdevice = find_libdevice()
    with ThreadPoolExecutor(len(TARGETS)) as pool:  # the work is in child processes: run them side by side
        for done in [pool.submit(_compile_and_assemble, t, libdevice) for t in TARGETS]:
            done.result()


def test_feature_gated_entries_are_compiled_somewhere():
    assert nv.NEEDS and set(nv.NEEDS) <= set(nv.FIXED)
    assert all(any(get_target(t).has(feature) for t in TARGETS) for feature in nv.NEEDS.values())


def test_the_table_names_only_what_codegen_may_call():
    assert all(name.startswith("llvm.") for name in [*nv.FIXED, *nv.OVERLOADED])
    assert set(nv.APPROX.values()) <= set(nv.FIXED)
    assert set(nv.NEEDS) <= set(nv.FIXED) and "llvm.nvvm.wgmma.fence.sync.aligned" in nv.NEEDS
    assert {name for pair in nv.LIBDEVICE.values() for name in pair} == set(nv.libdevice_functions())
    with pytest.raises(KeyError, match="not in the intrinsics table"):
        nv.declare(ir.Module(), "llvm.nvvm.made.up")
    assert nv.overloaded_name("llvm.minnum", (ir.VectorType(nv.BF16, 4),)) == "llvm.minnum.v4bf16"
    assert nv.overloaded_name("llvm.fptosi.sat", (I8, F32)) == "llvm.fptosi.sat.i8.f32"
