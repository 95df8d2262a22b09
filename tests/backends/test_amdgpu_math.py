"""The AMDGPU math expansions (tanh, erf, rsqrt) meet the accuracy `amdgpu/math.py` documents.

They are plain LLVM IR over `llvm.exp` / `llvm.sqrt` / `llvm.fabs`, so the
very IR the backend emits is JIT-compiled for this CPU and compared with
numpy in f64 (no AMD GPU needed; the GPU's `llvm.exp` is ~1 ulp too).
"""

import ctypes
import math

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from tessera.backends.amdgpu import math as amdgpu_math
from tessera.backends.amdgpu.intrinsics import AMDGPU_INTRINSICS
from tessera.backends.llvm.codegen import Codegen
from tessera.backends.llvm.types import F32


class _HostCodegen:
    """What the math codegen uses of `Codegen`, for a plain CPU function."""

    map_lanes = Codegen.map_lanes

    def __init__(self, builder):
        self.builder = builder

    def intrinsic(self, name, args, overloads=()):
        return AMDGPU_INTRINSICS.call(self.builder, name, args, overloads)


def _run_on_host(name: str, x: np.ndarray) -> np.ndarray:
    module = ir.Module("host")
    module.triple = llvm.get_process_triple()
    ptr = ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, ir.IntType(64)]), "f")
    src, dst, n = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    entry, loop, body, done = b.block, fn.append_basic_block("loop"), fn.append_basic_block("body"), \
        fn.append_basic_block("done")
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(ir.IntType(64))
    i.add_incoming(ir.Constant(ir.IntType(64), 0), entry)
    b.cbranch(b.icmp_signed("<", i, n), body, done)
    b.position_at_end(body)
    value = b.load(b.gep(src, [i], source_etype=F32), typ=F32)
    b.store(amdgpu_math.math_function(_HostCodegen(b), name, value), b.gep(dst, [i], source_etype=F32))
    i.add_incoming(b.add(i, ir.Constant(ir.IntType(64), 1)), b.block)
    b.branch(loop)
    b.position_at_end(done)
    b.ret_void()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    tm = llvm.Target.from_default_triple().create_target_machine()
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(module)), tm)
    engine.finalize_object()
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros_like(x)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(engine.get_function_address("f"))(
        x.ctypes.data, out.ctypes.data, len(x))
    return out


def _inputs():
    rng = np.random.default_rng(0)
    dense = np.linspace(-6, 6, 20001, dtype=np.float32)
    tiny = np.float32(10.0) ** rng.uniform(-30, -1, 2000).astype(np.float32)
    return np.concatenate([dense, tiny, -tiny, np.float32([0.0, -0.0, 0.125, 0.5, 20.0, -20.0, 1e30])])


REFERENCES = {"tanh": np.tanh, "erf": np.vectorize(math.erf), "rsqrt": lambda v: 1 / np.sqrt(v)}
# (relative error bound, absolute error bound) per function, as math.py documents
BOUNDS = {"tanh": (2e-6, 1e-7), "erf": (1e-6, 3e-7), "rsqrt": (2.5e-7, 0.0)}


@pytest.mark.parametrize("name", ["tanh", "erf", "rsqrt"])
def test_expansion_accuracy(name):
    x = _inputs()
    if name == "rsqrt":
        x = np.abs(x[x != 0])
    got = _run_on_host(name, x).astype(np.float64)
    want = REFERENCES[name](x.astype(np.float64))
    relative, absolute = BOUNDS[name]
    assert np.all(np.abs(got - want) <= np.maximum(relative * np.abs(want), absolute)), \
        f"worst error {np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30))}"


@pytest.mark.parametrize("name", ["tanh", "erf"])
def test_special_values(name):
    got = _run_on_host(name, np.float32([np.inf, -np.inf, np.nan, -0.0]))
    assert got[0] == 1 and got[1] == -1 and np.isnan(got[2]) and got[3] == 0 and np.signbit(got[3])


REM_KERNEL = """
import sys, tessera
@tessera.kernel
def rem(x_ptr, y_ptr, out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    tessera.store(out_ptr + offs, tessera.load(x_ptr + offs) % tessera.load(y_ptr + offs))
dtype, target = sys.argv[1:]
rem.compile(signature=f"*{dtype},*{dtype},*{dtype}", target=target, BLOCK=16)
print("compiled")
"""


@pytest.mark.parametrize("target", ["gfx90a", "gfx942", "gfx950"])
@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32", "f64"])
def test_float_remainder_compiles_for_every_amd_target_and_dtype(dtype, target, tmp_path):
    """`%` on bf16 used to end the process inside LLVM ("no libcall available for frem"): InstCombine shrank the
    f32 frem of the widened operands back to a bfloat one. Compiled in a child process, so a regression fails
    this test instead of killing the test run."""
    import subprocess
    import sys
    script = tmp_path / "rem.py"                       # kernels live in files: tessera reads their source
    script.write_text(REM_KERNEL)
    done = subprocess.run([sys.executable, str(script), dtype, target], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "compiled", done.stderr[-2000:]


def test_bf16_remainder_widened_through_its_bits_is_exact():
    """math.fmod widens bf16 operands by shifting their bits (so InstCombine cannot shrink the frem): on the host,
    4-lane bf16 vectors give numpy's fmod of the same values, which bf16 represents exactly."""
    from tessera.backends.llvm.intrinsics import BF16

    lanes = 4
    module = ir.Module("host")
    module.triple = llvm.get_process_triple()
    ptr, vec16 = ir.PointerType(), ir.VectorType(ir.IntType(16), lanes)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, ptr]), "f")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    x, y = (b.bitcast(b.load(p, typ=vec16), ir.VectorType(BF16, lanes)) for p in fn.args[:2])
    wide = ir.VectorType(F32, lanes)
    result = amdgpu_math.fmod(_HostCodegen(b), b.fpext(x, wide), b.fpext(y, wide))
    b.store(result, fn.args[2])                 # f32: fmod of bf16 values is exact in f32 (and in bf16)
    b.ret_void()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(module)),
                                        llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(engine.get_function_address("f"))
    rng = np.random.default_rng(3)
    to_bf16 = lambda v: (np.asarray(v, np.float32).view(np.uint32) >> 16).astype(np.uint16)      # noqa: E731
    from_bf16 = lambda bits: (bits.astype(np.uint32) << 16).view(np.float32)                    # noqa: E731
    for _ in range(50):
        xs, ys = to_bf16(rng.standard_normal(lanes) * 100), to_bf16(rng.standard_normal(lanes) * 3)
        out = np.zeros(lanes, np.float32)
        run(xs.ctypes.data, ys.ctypes.data, out.ctypes.data)
        np.testing.assert_array_equal(out, np.fmod(from_bf16(xs), from_bf16(ys)))
        np.testing.assert_array_equal(from_bf16(to_bf16(out)), out)          # representable in bf16
