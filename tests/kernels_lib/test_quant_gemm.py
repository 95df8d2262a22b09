"""tessera.kernels_lib.quant_gemm and quant: weight-quantized GEMM, and weights laid out for it.

Specification:

* `quant.quantize` / `quant.pack` give a QuantizedWeight whose
  `dequantize()` is the weight the format means: integer codes of 1..8
  bits, symmetric or asymmetric, groups of 32/64/128, act order (K
  permuted so groups are contiguous); MXFP4 and NVFP4;
* `from_gptq` and `from_awq` read those checkpoints' int32 tensors (GPTQ:
  packed along K, 3-bit codes across words, zeros stored minus one, g_idx; AWQ: packed along N in
  nibble order 0,2,4,6,1,3,5,7) into the weight their formulas define;
* `quant_gemm(x, w)` is x @ w.dequantize().T for every format (W4A8: fp8
  x times its row scales), to the precision of the output dtype, on the CPU
  interpreter (which runs the split-K atomic path) and, marked `gpu`, on a
  GPU for decode and tensor-core shapes;
* lowered for sm_80, the decode kernel computes on the SIMT simulator what
  the interpreter computes, and every kernel compiles for sm_80, sm_90a and
  gfx942 without spills (W4A8 for sm_89, sm_90a and gfx950: fp8 tensor cores);
* `torch.library.opcheck` passes on the CPU; bad arguments name the fix.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tessera
from amd_spills import amd_spills
from tessera.kernels_lib.targets import lds_bytes
from tessera.backends.interp.storage import Memory
from tessera.backends.simt import run_threads
from tessera.kernels_lib import quant
from tessera.kernels_lib.quant_gemm import AMD_STAGES, fp4_gemm_kernel, plan, quant_gemm, quant_gemm_kernel, \
    quant_gemm_op, w4a8_kernel
from tessera.passes.thread_passes import lower

N, K = 64, 256


def _weight(seed=0):
    return torch.randn(N, K, generator=torch.Generator().manual_seed(seed))


def _close(y: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype = torch.float16):
    tolerance = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-4}[dtype]
    err = (y.float() - expected).abs().max().item()
    assert err <= tolerance * expected.abs().max().item(), f"max error {err} vs max |y| {expected.abs().max()}"


@pytest.mark.parametrize("bits, group, symmetric", [(4, 128, True), (4, 64, False), (8, 128, True), (3, 64, True),
                                                     (2, 32, False), (5, 32, True), (1, 128, False)])
def test_integer_weights_on_the_interpreter(bits, group, symmetric):
    w = quant.quantize(_weight(), bits=bits, group_size=group, symmetric=symmetric)
    assert (w.dequantize() - _weight()).abs().max() <= w.scales.float().max() * (1.0 if bits > 1 else 2.0)
    x = torch.randn(3, K, dtype=torch.float16)
    _close(quant_gemm(x, w), x.float() @ w.dequantize().t())



@pytest.mark.parametrize("k", [96, 160, 256])
def test_the_split_k_steps_carried_ahead_match_numpy(k):
    """The K loop loads each step's codes, scales and zeros a step ahead and a split's last step re-reads its
    own (`quant_gemm_kernel`): with the CPU plan (steps of 32, two K splits) K = 96 and 160 leave the second
    split a step past K, K = 256 splits evenly. The interpreter's product equals numpy's float64 one of the
    dequantized weights."""
    w = quant.quantize(torch.randn(N, k, generator=torch.Generator().manual_seed(k)), bits=4, group_size=32,
                       symmetric=False)
    x = torch.randn(5, k, dtype=torch.float16, generator=torch.Generator().manual_seed(1))
    expected = x.numpy().astype(np.float64) @ w.dequantize().numpy().astype(np.float64).T
    got = quant_gemm(x, w, out_dtype=torch.float32).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())

def test_bfloat16_activations_and_leading_dims():
    w = quant.quantize(_weight(), bits=4, group_size=128, scale_dtype=torch.bfloat16)
    x = torch.randn(2, 2, K, dtype=torch.bfloat16)
    y = quant_gemm(x, w)
    assert y.shape == (2, 2, N) and y.dtype == torch.bfloat16
    _close(y, x.float() @ w.dequantize().t(), torch.bfloat16)


def test_act_order_permutes_k_so_that_groups_are_contiguous():
    g_idx = torch.randperm(K, generator=torch.Generator().manual_seed(1)) % (K // 64)
    codes = torch.randint(0, 16, (N, K))
    scales = (torch.rand(N, K // 64) * 0.1).half()
    w = quant.pack(codes, scales, bits=4, group_size=64, g_idx=g_idx)
    exact = (codes.float() - 8) * scales.float()[:, g_idx]
    assert torch.equal(w.dequantize(), exact) and w.perm is not None
    x = torch.randn(5, K, dtype=torch.float16)
    _close(quant_gemm(x, w), x.float() @ exact.t())


@pytest.mark.parametrize("format", ["mxfp4", "nvfp4"])
def test_fp4_weights(format):
    w = quant.quantize(_weight(), format=format)
    assert (w.dequantize() - _weight()).abs().max() < 1.5
    x = torch.randn(3, K, dtype=torch.bfloat16)
    _close(quant_gemm(x, w), x.float() @ w.dequantize().t(), torch.bfloat16)


@pytest.mark.parametrize("symmetric", [True, False])
def test_w4a8_scales_fp8_activations_by_row(symmetric):
    w = quant.quantize(_weight(), bits=4, group_size=128, symmetric=symmetric)
    x = torch.randn(3, K)
    x_scale = x.abs().amax(1) / 448
    x8 = (x / x_scale[:, None]).to(torch.float8_e4m3fn)
    y = quant_gemm(x8, w, x_scale)
    _close(y, (x8.float() * x_scale[:, None]) @ w.dequantize().t(), torch.bfloat16)


# -- checkpoint importers ---------------------------------------------------------------------------


def _pack_int32(codes: torch.Tensor, bits: int, axis: int, order=None) -> torch.Tensor:
    """Codes packed 32/bits to an int32 along `axis` (code j of a word at bits j*bits), as GPTQ/AWQ do."""
    per_word = 32 // bits
    c = codes.movedim(axis, -1)
    c = c.reshape(*c.shape[:-1], c.shape[-1] // per_word, per_word).to(torch.int64)
    if order is not None:       # slot j holds column order[j]
        c = c[..., list(order)]
    words = sum(c[..., j] << (j * bits) for j in range(per_word))
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    return words.movedim(-1, axis)


def _pack_int32_3bit(codes: torch.Tensor, axis: int) -> torch.Tensor:
    """3-bit codes packed along `axis` as AutoGPTQ's QuantLinear.pack writes them: 32 codes in 3 words, ten per
    word and one split across each of the first two word boundaries."""
    c = codes.movedim(axis, -1).to(torch.int64)
    words = torch.zeros(*c.shape[:-1], c.shape[-1] * 3 // 32, dtype=torch.int64)
    i = row = 0
    while row < words.shape[-1]:
        for shift in range(3):                          # word `row`: its share of a split code, then ten codes
            if shift:
                words[..., row] |= (c[..., i] >> (3 - shift)) & ((1 << shift) - 1)
                i += 1
            for j in range(10):
                words[..., row] |= c[..., i + j] << (3 * j + shift)
            i += 10
            if shift < 2:                               # the low bits of the code that crosses into the next word
                words[..., row] |= (c[..., i] << (30 + shift)) & 0xFFFFFFFF
            row += 1
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    return words.movedim(-1, axis)


@pytest.mark.parametrize("bits, act_order", [(4, False), (4, True), (8, False), (2, True), (3, False), (3, True)])
def test_gptq_checkpoints(bits, act_order):
    group = 64
    q = torch.randint(0, 2 ** bits, (K, N))
    zeros = torch.randint(1, 2 ** bits, (K // group, N))
    scales = (torch.rand(K // group, N) * 0.1).half()
    g_idx = (torch.randperm(K) % (K // group)) if act_order else torch.arange(K) // group
    packer = _pack_int32_3bit if bits == 3 else lambda codes, axis: _pack_int32(codes, bits, axis)
    w = quant.from_gptq(packer(q, 0), packer(zeros - 1, 1), scales,
                        g_idx if act_order else None, bits=bits, group_size=group)
    expected = (scales.float()[g_idx] * (q.float() - zeros.float()[g_idx])).t()       # GPTQ's own formula
    assert torch.allclose(w.dequantize(), expected)
    x = torch.randn(2, K, dtype=torch.float16)
    _close(quant_gemm(x, w), x.float() @ expected.t())


def test_awq_checkpoints():
    group = 64
    q, zeros = torch.randint(0, 16, (K, N)), torch.randint(0, 16, (K // group, N))
    scales = (torch.rand(K // group, N) * 0.1).half()
    w = quant.from_awq(_pack_int32(q, 4, 1, quant.AWQ_ORDER), _pack_int32(zeros, 4, 1, quant.AWQ_ORDER), scales,
                       group_size=group)
    expected = ((q.float() - zeros.float().repeat_interleave(group, 0)) * scales.float().repeat_interleave(group, 0))
    assert torch.allclose(w.dequantize(), expected.t())


# -- the kernels as the GPU gets them -----------------------------------------------------------------


def test_the_split_k_decode_kernel_on_the_simt_simulator():
    w = quant.quantize(_weight(), bits=4, group_size=64, symmetric=False)
    x = torch.randn(3, K, dtype=torch.float16)
    codes = tessera.reinterpret(w.qweight.numpy(), tessera.u4)
    args = [x.numpy(), codes, w.scales.numpy(), w.zeros.numpy(), np.zeros((3, N), np.float32), 3, N, K]
    constexprs = dict(G=64, ZEROS=True, HALF=8.0, BM=16, BN=32, BK=64, SPLIT_K=2, STAGES=1)
    spec = quant_gemm_kernel.specialize(*args, **constexprs)
    fn = lower(spec.module, "sm_80").functions[0]
    assert {"unpack_bits", "mma", "atomic_rmw"} <= {op.name for op in fn.walk()}
    got = simulated_matches_interpreted(fn, args, (1, N // 32, 2), constexprs, w)
    _close(torch.from_numpy(got), x.float() @ w.dequantize().t())


def simulated_matches_interpreted(fn, args, grid, constexprs, w) -> np.ndarray:
    """Run `quant_gemm_kernel` over `args` on the interpreter and its lowered form `fn` on the SIMT simulator,
    each on copies (the simulator reads w's packed codes as u4 memory), assert the outputs (args[4]) agree, and
    return the simulator's."""
    expected = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    quant_gemm_kernel[grid](*expected, **constexprs)
    got = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    got[1] = Memory(w.qweight.numpy().copy(), tessera.u4)
    run_threads(fn, got, grid)
    np.testing.assert_allclose(got[4], expected[4], rtol=1e-5, atol=1e-3)
    return got[4]


@pytest.mark.parametrize("target, pipelined_by", [("sm_80", "async_copy"), ("sm_90a", "mbarrier_wait"),
                                                  ("gfx950", "async_copy")])
def test_the_pipelined_tensor_core_kernel_on_the_simt_simulator(target, pipelined_by):
    """x's blocks stream through the ring (cp.async; TMA on sm_90a, where wgmma reads them; direct-to-LDS loads on
    gfx950, 3 stages as its plan has: `AMD_STAGES`) while W's codes are loaded as bytes and unpacked in registers
    each step."""
    assert AMD_STAGES["gfx950"] == 3
    M = 64
    w = quant.quantize(_weight(), bits=4, group_size=64, symmetric=False)
    x = torch.randn(M, K, dtype=torch.float16)
    args = [x.numpy(), tessera.reinterpret(w.qweight.numpy(), tessera.u4), w.scales.numpy(), w.zeros.numpy(),
            np.zeros((M, N), np.float16), M, N, K]
    constexprs = dict(G=64, ZEROS=True, HALF=8.0, BM=64, BN=64, BK=64, SPLIT_K=1, STAGES=3)
    fn = lower(quant_gemm_kernel.specialize(*args, **constexprs).module, target).functions[0]
    assert {"unpack_bits", pipelined_by} <= {op.name for op in fn.walk()}
    expected = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    quant_gemm_kernel[(1, 1, 1)](*expected, **constexprs)
    got = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    got[1] = Memory(w.qweight.numpy().copy(), tessera.u4)
    run_threads(fn, got, (1, 1, 1))
    np.testing.assert_allclose(got[4].astype(np.float32), expected[4].astype(np.float32), rtol=2e-3, atol=2e-2)


def _signature(kernel, plan_, fmt):
    out = "f32" if plan_.split_k > 1 else "f16"
    if kernel is quant_gemm_kernel:
        return f"*f16:16,*u4:16,*f16:16,*f16:16,*{out}:16,i32,i32:16,i32:16", dict(ZEROS=True, HALF=8.0,
                                                                                   BK=plan_.BK)
    if kernel is fp4_gemm_kernel:
        return (f"*bf16:16,*f4e2m1:16,*{fmt}:16,*{out.replace('f16', 'bf16')}:16,f32,i32,i32:16,i32:16",
                dict(BK=plan_.BK))
    return (f"*f8e4m3:16,*f32:16,*u4:16,*f16:16,*f16:16,*{out.replace('f16', 'bf16')}:16,i32,i32:16,i32:16",
            dict(ZEROS=False, HALF=8.0))


KERNELS = {"w4a16-decode": (quant_gemm_kernel, 1), "w4a16-large": (quant_gemm_kernel, 4096),
           "mxfp4": (fp4_gemm_kernel, 16), "w4a8": (w4a8_kernel, 256)}


@pytest.mark.parametrize("target, case", [("sm_90a", case) for case in KERNELS] + [
    ("sm_80", "w4a16-decode"), ("sm_80", "w4a16-large"), ("sm_89", "w4a8")] + [
    (target, case) for target in ("gfx942", "gfx950") for case in ("w4a16-decode", "w4a16-large", "mxfp4")] + [
    ("gfx950", "w4a8")])
def test_the_kernels_compile_without_spills(target, case):
    """Each plan the op picks on that target compiles without spills (and, on AMD, its rings fit in the target's
    LDS, `targets.lds_bytes`: gfx950's 3-stage ring of the large tile would not fit gfx942's)."""
    kernel, M = KERNELS[case]
    group = 32 if kernel is fp4_gemm_kernel else 128
    amd = target.startswith("gfx")
    p = plan(M, 4096, 4096, group, 132, w4a8=kernel is w4a8_kernel, target=target if amd else "nvidia")
    signature, extra = _signature(kernel, p, "e8m0")
    compiled = kernel.compile(signature=signature, target=target, G=group, BM=p.BM, BN=p.BN,
                              SPLIT_K=p.split_k, STAGES=p.stages, num_warps=p.num_warps, **extra)
    if amd:
        assert amd_spills(compiled.metadata) == {}, compiled.metadata
        assert compiled.metadata["shared_bytes"] <= lds_bytes(target)
        if case == "w4a16-large":
            assert p.stages == AMD_STAGES[target] and ("global_load_lds" in compiled.stages["amdgcn"])
            assert (compiled.metadata["shared_bytes"] > lds_bytes("gfx942")) == (target == "gfx950")
        if case == "w4a8":      # the e4m3 codes on gfx950's double-rate OCP fp8 MFMA, x streamed through LDS rings
            assert set(re.findall(r"\bv_mfma_\w+", compiled.stages["amdgcn"])) == {"v_mfma_f32_32x32x64_f8f6f4"}
            assert "global_load_lds" in compiled.stages["amdgcn"]
    else:
        assert compiled.metadata.get("spill_stores", 0) == 0, compiled.metadata


# -- the op ---------------------------------------------------------------------------------------


def _op_args(w: quant.QuantizedWeight, x: torch.Tensor, x_scale=None):
    return (x, w.qweight, w.scales, w.zeros, w.perm, x_scale, w.bits, w.group_size, w.format, w.global_scale)


@pytest.mark.parametrize("case", ["w4-asymmetric", "w3-act-order", "nvfp4"])
def test_opcheck(case):
    if case == "w4-asymmetric":
        w, x = quant.quantize(_weight(), bits=4, group_size=64, symmetric=False), torch.randn(2, K).half()
    elif case == "w3-act-order":
        w = quant.pack(torch.randint(0, 8, (N, K)), (torch.rand(N, K // 64) * 0.1).half(), bits=3, group_size=64,
                       g_idx=torch.arange(K) % (K // 64))
        x = torch.randn(2, K).half()
    else:
        w, x = quant.quantize(_weight(), format="nvfp4"), torch.randn(2, K).bfloat16()
    torch.library.opcheck(quant_gemm_op, _op_args(w, x))


@pytest.mark.parametrize("change, message", [
    (dict(x=torch.randn(2, 128).half()), "x has 128 columns but the weight has K = 256"),
    (dict(x=torch.randn(2, K)), "x must be float16 or bfloat16"),
    (dict(scales=torch.ones(N, 3).half()), r"scales must be \[N, K // group_size\] = \[64, 4\]"),
    (dict(x_scale=torch.ones(2)), "x_scale .* goes with float8_e4m3fn x only"),
])
def test_bad_arguments_name_the_fix(change, message):
    w = quant.quantize(_weight(), bits=4, group_size=64)
    args = dict(zip(("x", "qweight", "scales", "zeros", "perm", "x_scale", "bits", "group_size", "format",
                     "global_scale"), _op_args(w, torch.randn(2, K).half())))
    args.update(change)
    with pytest.raises(ValueError, match=message):
        quant_gemm_op(**args)


# -- on a GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16, 256])
@pytest.mark.parametrize("case", ["w4-g128", "w4-g32-asym", "w8-g128", "w3-g64", "w2-g32", "act-order", "mxfp4",
                                  "nvfp4", "w4a8"])
def test_on_the_gpu_every_format_matches_the_dequantized_product(case, M):
    n, k = 512, 1024
    w0 = torch.randn(n, k)
    bits, group, symmetric = {"w4-g128": (4, 128, True), "w4-g32-asym": (4, 32, False), "w8-g128": (8, 128, True),
                              "w3-g64": (3, 64, True), "w2-g32": (2, 32, False), "act-order": (4, 128, True),
                              "mxfp4": (4, 32, True), "nvfp4": (4, 16, True), "w4a8": (4, 128, False)}[case]
    if case in ("mxfp4", "nvfp4"):
        w = quant.quantize(w0, format=case)
    elif case == "act-order":
        w = quant.pack(torch.randint(0, 16, (n, k)), (torch.rand(n, k // group) * 0.02).half(), bits=4,
                       group_size=group, g_idx=torch.randperm(k) % (k // group))
    else:
        w = quant.quantize(w0, bits=bits, group_size=group, symmetric=symmetric)
    cuda = quant.QuantizedWeight(*(t.cuda() if isinstance(t, torch.Tensor) else t for t in (
        w.qweight, w.scales, w.zeros, w.perm)), w.bits, w.group_size, w.format, w.global_scale)
    dtype = torch.bfloat16 if case in ("mxfp4", "nvfp4") else torch.float16
    x = torch.randn(M, k, device="cuda", dtype=torch.float32)
    if case == "w4a8":
        x_scale = x.abs().amax(1) / 448
        x8 = (x / x_scale[:, None]).to(torch.float8_e4m3fn)
        y = quant_gemm(x8, cuda, x_scale)
        expected = (x8.float() * x_scale[:, None]) @ w.dequantize().cuda().t()
        dtype = torch.bfloat16
    else:
        x = x.to(dtype)
        y = quant_gemm(x, cuda)
        expected = x.float() @ w.dequantize().cuda().t()
    _close(y.cpu(), expected.cpu(), dtype)


def _loop_loads(code, mma):
    """(bytes, computed_on) for each global load in the K loop of `code` (SASS): computed_on when something
    later in the same iteration other than a register move (the loop's carry: MOV, PRMT) reads its result."""
    import re
    from tessera.backends.nvptx.sass import loop_containing
    body = loop_containing(code, mma)
    loads = []
    for i, inst in enumerate(body):
        if not inst.opcode.startswith("LDG") or inst.opcode == "LDGDEPBAR" or inst.opcode.startswith("LDGSTS"):
            continue
        first = int(re.search(r"LDG\S*\s+R(\d+)", inst.text).group(1))
        words = 4 if ".128" in inst.opcode else 2 if ".64" in inst.opcode else 1
        written = [f"R{first + j}" for j in range(words)]
        later = [(x.opcode, x.text.split(None, 1 + x.text.startswith("@"))[-1]) for x in body[i + 1:]]
        used = any(re.search(rf"\b{r}\b", text) and not re.match(r"(IMAD\.MOV|MOV|PRMT)", op)
                   for op, text in later for r in written)
        loads.append((4 * words if words > 1 else 2, used))
    return loads


@pytest.mark.parametrize("case", ["decode", "decode-fragment", "prefill"])
def test_weight_codes_and_scales_are_loaded_a_k_step_ahead(case):
    """sm_90a SASS: the K loop's loads of W's codes, scales and zeros land in registers that the rest of the
    iteration only moves into the loop's carry -- they are the next step's, so their DRAM latency overlaps a
    step's unpacking, shared-memory exchange and multiplies (main, 2026-11-26: every step waited for its own,
    the decode GEMM at 9% of HBM on an H100). The decode plans (no ring) carry x's block too; the prefill
    plan's x arrives by TMA."""
    from tessera.backends.nvptx.sass import disassemble, find_cuobjdump
    from tessera.kernels_lib.quant_fragment import DECODE_TILING
    from tessera.kernels_lib.quant_gemm import fragment_plan
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found (nvidia-cuda-cuobjdump wheel)")
    M = 256 if case == "prefill" else 1
    p = plan(M, 4096, 4096, 128, 132)
    extra = {}
    if case == "decode-fragment":
        p, extra = fragment_plan(p, M, 4096), dict(DECODE_TILING.constexprs(128))
    signature, more = _signature(quant_gemm_kernel, p, None)
    compiled = quant_gemm_kernel.compile(signature=signature, target="sm_90a", strict=True, G=128, BM=p.BM,
                                         BN=p.BN, SPLIT_K=p.split_k, STAGES=p.stages, num_warps=p.num_warps,
                                         **more, **extra)
    code = disassemble(compiled.binary)
    assert not any(inst.opcode.startswith("I2F") for inst in code)
    loads = _loop_loads(code, "HGMMA" if p.BM >= 64 else "HMMA")
    threads = 32 * p.num_warps
    x_bytes = 0 if p.stages > 1 else p.BM * p.BK * 2 // threads
    assert not any(used for _, used in loads), loads
    assert sum(n for n, _ in loads) >= p.BN * p.BK * 4 // 8 // threads + x_bytes + 2, loads
