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
