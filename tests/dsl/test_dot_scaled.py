"""tessera.dot_scaled: block-scaled matrix products (MXFP8, MXFP6, MXFP4 with e8m0 scales; NVFP4 with e4m3 scales
and a per-tensor f32 scale), dequantized in registers.

Specification:

* for every format the interpreter computes acc + s * (a . sa) @ (b . sb)
  as numpy does on the exact values (each group of G elements along K
  shares its scale), to f32 accumulation;
* an operand without a scale may be bf16 (bf16 activations times MXFP4
  weights);
* lowered for mma.sync (sm_80) the SIMT simulator computes what the
  interpreter computes, and the kernel compiles for sm_80, sm_90a and
  gfx942 without spills;
* bad operands are errors at the call that say what to pass.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.backends.interp.storage import Memory
from tessera.backends.simt import run_threads
from tessera.ir import dtypes as dt
from tessera.passes.thread_passes import lower


@tessera.kernel
def scaled_matmul(a_ptr, sa_ptr, b_ptr, sb_ptr, c_ptr, t_scale, M, N, K, BM: tessera.constexpr,
                  BN: tessera.constexpr, BK: tessera.constexpr, G: tessera.constexpr,
                  TENSOR_SCALE: tessera.constexpr):
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    a, b = tessera.view(a_ptr, (M, K)), tessera.view(b_ptr, (K, N))
    sa, sb = tessera.view(sa_ptr, (M, K // G)), tessera.view(sb_ptr, (K // G, N))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in range(0, tessera.cdiv(K, BK)):
        a_k, b_k = a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load()
        sa_k, sb_k = sa.block((BM, BK // G), (pid_m, k)).load(), sb.block((BK // G, BN), (k, pid_n)).load()
        if TENSOR_SCALE:
            acc = tessera.dot_scaled(a_k, sa_k, b_k, sb_k, acc, tensor_scale=t_scale)
        else:
            acc = tessera.dot_scaled(a_k, sa_k, b_k, sb_k, acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc)


FORMATS = {   # name: (value type, scale type, group size)
    "mxfp8-e4m3": (dt.f8e4m3, dt.e8m0, 32), "mxfp8-e5m2": (dt.f8e5m2, dt.e8m0, 32),
    "mxfp6-e2m3": (dt.f6e2m3, dt.e8m0, 32), "mxfp6-e3m2": (dt.f6e3m2, dt.e8m0, 32),
    "mxfp4": (dt.f4e2m1, dt.e8m0, 32), "nvfp4": (dt.f4e2m1, dt.f8e4m3, 16),
}


def _quantized(rng, shape, dtype):
    """(stored bytes, exact values) of random finite values of `dtype`."""
    patterns = rng.integers(0, 1 << dtype.bits, shape)
    values = dtype.decode(patterns)
    patterns = np.where(np.isfinite(values), patterns, 0)
    stored = dt.pack(patterns.ravel(), dtype) if dtype.is_subbyte else patterns.astype(np.uint8)
    return stored, dtype.decode(patterns).astype(np.float64)


def _scales(rng, shape, dtype):
    values = 2.0 ** rng.integers(-3, 4, shape) if dtype == dt.e8m0 else rng.uniform(0.25, 4, shape)
    patterns = dtype.encode(values)
    return patterns, dtype.decode(patterns).astype(np.float64)


def problem(name: str, M=64, N=64, K=128, seed=0):
    """(kernel arguments as arrays, constexprs, numpy's product)."""
    values, scales, group = FORMATS[name]
    rng = np.random.default_rng(seed)
    a, a_exact = _quantized(rng, (M, K), values)
    b, b_exact = _quantized(rng, (K, N), values)
    sa, sa_exact = _scales(rng, (M, K // group), scales)
    sb, sb_exact = _scales(rng, (K // group, N), scales)
    t_scale = 0.75 if name == "nvfp4" else 1.0
    expected = t_scale * (a_exact * np.repeat(sa_exact, group, 1)) @ (b_exact * np.repeat(sb_exact, group, 0))
    arrays = [(a, values), (sa, scales), (b, values), (sb, scales)]
    return arrays, t_scale, dict(G=group, TENSOR_SCALE=name == "nvfp4"), expected


def arguments(arrays, t_scale, M, N, K, memories=False):
    typed = [Memory(x.copy(), d, numel=None) if memories else tessera.reinterpret(x.copy(), d) for x, d in arrays]
    return [*typed, np.zeros((M, N), np.float32), t_scale, M, N, K]


@pytest.mark.parametrize("name", FORMATS)
def test_the_interpreter_computes_the_block_scaled_product(name):
    arrays, t_scale, constexprs, expected = problem(name)
    args = arguments(arrays, t_scale, 64, 64, 128)
    scaled_matmul[(2, 2)](*args, BM=32, BN=32, BK=64, **constexprs)
    np.testing.assert_allclose(args[4], expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@tessera.kernel
def bf16_times_mxfp4(x_ptr, w_ptr, s_ptr, out_ptr, K: tessera.constexpr, N: tessera.constexpr):
    x = tessera.view(x_ptr, (16, K)).block((16, K), (0, 0)).load()
    w = tessera.view(w_ptr, (K, N)).block((K, N), (0, 0)).load()
    s = tessera.view(s_ptr, (K // 32, N)).block((K // 32, N), (0, 0)).load()
    tessera.view(out_ptr, (16, N)).block((16, N), (0, 0)).store(tessera.dot_scaled(x, None, w, s))


def test_an_operand_without_scales_may_be_bf16():
    rng = np.random.default_rng(1)
    x = dt.bf16.quantize(rng.standard_normal((16, 64))).astype(np.float64)
    w, w_exact = _quantized(rng, (64, 32), dt.f4e2m1)
    s, s_exact = _scales(rng, (2, 32), dt.e8m0)
    out = np.zeros((16, 32), np.float32)
    bf16_times_mxfp4[(1,)](tessera.reinterpret(dt.bf16.encode(x), dt.bf16), tessera.reinterpret(w, dt.f4e2m1),
                           tessera.reinterpret(s, dt.e8m0), out, K=64, N=32)
    np.testing.assert_allclose(out, x @ (w_exact * np.repeat(s_exact, 32, 0)), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4"])
def test_on_the_simt_simulator_the_mma_lowering_computes_what_the_interpreter_computes(name):
    arrays, t_scale, constexprs, _ = problem(name, M=32, N=32, K=64)
    spec = scaled_matmul.specialize(*arguments(arrays, t_scale, 32, 32, 64), BM=32, BN=32, BK=64, **constexprs)
    fn = lower(spec.module, "sm_80").functions[0]
    assert any(op.name == "mma" for op in fn.walk())
    expected, got = arguments(arrays, t_scale, 32, 32, 64), arguments(arrays, t_scale, 32, 32, 64, memories=True)
    scaled_matmul[(1, 1)](*expected, BM=32, BN=32, BK=64, **constexprs)
    run_threads(fn, got, (1, 1))
    np.testing.assert_allclose(got[4], expected[4], rtol=1e-5, atol=1e-5 * np.abs(expected[4]).max())


@pytest.mark.parametrize("target, name", [("sm_80", "mxfp4"), ("sm_90a", "nvfp4"), ("gfx942", "mxfp6-e2m3")])
def test_compiles_without_spills(target, name):
    arrays, t_scale, constexprs, _ = problem(name)
    compiled = scaled_matmul.compile(*arguments(arrays, t_scale, 64, 64, 128), BM=64, BN=64, BK=64, **constexprs,
                                     target=target)
    assert compiled.metadata.get("spill_stores", 0) == 0 and compiled.metadata.get("vgpr_spill_count", 0) == 0


@tessera.kernel
def misuse(a_ptr, s_ptr, CASE: tessera.constexpr):
    a = tessera.view(a_ptr, (32, 64)).block((32, 64), (0, 0)).load()
    s = tessera.view(s_ptr, (32, 2)).block((32, 2), (0, 0)).load()
    if CASE == "values":
        tessera.dot_scaled(a.to(tessera.f32), s, a.to(tessera.f32).T, None)
    elif CASE == "scale_dtype":
        tessera.dot_scaled(a, s.to(tessera.f32), a.T, None)
    elif CASE == "scale_shape":
        tessera.dot_scaled(a, s.T, a.T, None)


@pytest.mark.parametrize("case, message", [
    ("values", "dot_scaled's a must hold one of f8e4m3, f8e5m2, f6e2m3, f6e3m2, f4e2m1, got tile<32x64xf32>"),
    ("scale_dtype", "dot_scaled's a_scale must be a 2-D tile of e8m0 or f8e4m3 scales, got"),
    ("scale_shape", r"dot_scaled's a_scale is \(2, 32\), but a is \(32, 64\): it must be 32 x K/G"),
])
def test_misuse_is_a_compile_error_at_the_call(case, message):
    a = tessera.reinterpret(np.zeros(32 * 64 // 2, np.uint8), dt.f4e2m1)
    s = tessera.reinterpret(np.zeros((32, 2), np.uint8), dt.e8m0)
    with pytest.raises(tessera.CompileError, match=message) as info:
        misuse[(1,)](a, s, CASE=case)
    assert "tessera.dot_scaled" in str(info.value)
