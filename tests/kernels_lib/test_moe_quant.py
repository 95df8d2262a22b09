"""tessera.kernels_lib.moe with quantized expert weights (moe.quantized, moe.quantized_mlp).

Specification:

* `quantize_experts` gives int4 (group-wise, symmetric or with zeros) and fp8 e4m3 (per-tensor, per-channel,
  block) weights whose `dequantize()` is within one quantization step of the weight; `from_fp8_blocks` reads a
  DeepSeek-style [E, N/128, K/128] scale tensor; `interleave` of quantized gate and up is
  `interleave_gate_up` of their dequantized weights;
* `experts` with quantized w13 and w2 is the float64 reference run on the dequantized weights, for both
  formats and every fp8 granularity, SiLU and GELU, top-1 to top-8, odd sizes, experts with no tokens, the
  deterministic and the atomic top-k sum (interpreter, float32 activations; bfloat16 to its precision);
* `MoELayer.quantize_experts` gives the layer whose output is the bf16 layer's with the dequantized weights;
* lowered for sm_80, sm_90a and gfx950 (its 3-stage rings), both quantized kernels compute on the SIMT simulator
  what the interpreter computes, with the u4 codes unpacked in registers; every quantized plan compiles for
  sm_80, sm_90a, gfx942 and gfx950, pipelined at its target's plan (`plan.gpu_plans`), without register spills;
* opcheck passes for both ops; bad arguments name the fix.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import moe_reference as ref
from amd_spills import amd_spills
from moe_problem import random_moe
import tessera
from tessera.backends.interp.storage import Memory
from tessera.backends.simt import run_threads
from tessera.kernels_lib.moe import MoELayer, align, experts, interleave_gate_up, quantize_experts
from tessera.kernels_lib.moe import plan as plans
from tessera.kernels_lib.moe.common import kernel_arg
from tessera.kernels_lib import quant
from tessera.kernels_lib.moe.quantized import from_fp8_blocks, interleave, stack_int4
from tessera.kernels_lib.moe.quantized_mlp import down_quant, down_quant_kernel, gate_up_quant, gate_up_quant_kernel
from tessera.kernels_lib.targets import lds_bytes
from tessera.passes.thread_passes import lower

FORMATS = {     # name -> quantize_experts options (fp8 blocks of 16: several blocks per expert at test sizes)
    "int4-sym-g32": dict(format="int4", group_size=32),
    "int4-zeros-g16": dict(format="int4", group_size=16, symmetric=False),
    "fp8-tensor": dict(format="fp8", scales="tensor"),
    "fp8-channel": dict(format="fp8", scales="channel"),
    "fp8-block16": dict(format="fp8", scales="block", block=16),
}


def _problem(T, H, I, E, K, options, seed=0, empty=()):
    x, w1, w3, w2, (weights, ids, counts, chunk_counts) = random_moe(T, H, I, E, K, seed, empty)
    q1, q3, q2 = (quantize_experts(w, **options) for w in (w1, w3, w2))
    cat = torch.cat([q1.dequantize(), q3.dequantize()], 1)            # the reference's [E, 2I, H]: gate; up
    return x, interleave(q1, q3), q2, weights, ids, counts, chunk_counts, cat, q2.dequantize()


@pytest.mark.parametrize("name", list(FORMATS))
def test_dequantized_weights_are_within_a_quantization_step(name):
    w = torch.randn(3, 40, 64, generator=torch.Generator().manual_seed(1))
    q = quantize_experts(w, **FORMATS[name])
    error = (q.dequantize() - w).abs()
    if q.format == "int4":
        step = q.scales.float().repeat_interleave(q.group_size, 2)      # half a step, and |q - 8| <= 8 times
        assert (error <= step * (0.5 + 8 * 2 ** -8) + 1e-6).all()        # the bf16 scale's rounding
    else:           # e4m3 keeps 3 mantissa bits: relative error <= 2^-4, absolute near zero
        scale = q.scales.float().repeat_interleave(q.group_size, 2)[..., :64]
        assert (error <= w.abs() / 16 + scale * 2 ** -9 + 1e-7).all()
        assert q.scales.shape[2] == {"fp8-tensor": 1, "fp8-channel": 1, "fp8-block16": 4}[name]


@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_experts_are_quant_packs_layout(symmetric):
    """quantize_experts's codes and scales are `quant.quantize`'s, expert by expert, so GPTQ/AWQ weights
    (`quant.from_gptq`, `from_awq`) stack into the same layout (`stack_int4`)."""
    w = torch.randn(3, 24, 64, generator=torch.Generator().manual_seed(4))
    ours = quantize_experts(w, group_size=32, symmetric=symmetric)
    theirs = stack_int4([quant.quantize(e, bits=4, group_size=32, symmetric=symmetric, scale_dtype=torch.bfloat16)
                         for e in w])
    assert torch.equal(ours.qweight, theirs.qweight) and torch.equal(ours.scales, theirs.scales)
    assert torch.equal(ours.dequantize(), torch.stack([theirs.expert(e).dequantize() for e in range(3)]))


def test_deepseek_block_scales_and_interleaving():
    g = torch.Generator().manual_seed(2)
    codes = torch.randn(2, 200, 130, generator=g).to(torch.float8_e4m3fn)
    block_scales = torch.rand(2, 2, 2, generator=g) + 0.5
    q = from_fp8_blocks(codes, block_scales)
    expected = codes.float() * block_scales.repeat_interleave(128, 1)[:, :200].repeat_interleave(128, 2)[..., :130]
    assert torch.equal(q.dequantize(), expected)
    gate, up = (quantize_experts(torch.randn(2, 8, 32, generator=g), group_size=16) for _ in range(2))
    assert torch.equal(interleave(gate, up).dequantize(), interleave_gate_up(gate.dequantize(), up.dequantize()))


@pytest.mark.parametrize("name, T, H, I, E, K, activation, atomic", [
    ("int4-sym-g32", 9, 64, 32, 6, 2, "silu", False),
    ("int4-zeros-g16", 7, 48, 32, 5, 1, "gelu", False),       # hidden not a power of two, top-1
    ("fp8-block16", 5, 48, 32, 16, 8, "silu", True),          # top-8, atomic top-k sum
    ("fp8-channel", 6, 33, 20, 4, 2, "gelu", False),          # odd hidden size
    ("fp8-tensor", 8, 32, 24, 6, 2, "silu", True),
])
def test_quantized_experts_match_the_float64_reference(name, T, H, I, E, K, activation, atomic):
    x, q13, q2, weights, ids, counts, chunk_counts, cat, w2 = _problem(T, H, I, E, K, FORMATS[name], empty=(E - 1,))
    out = experts(x, q13, q2, weights, ids, activation=activation, atomic=atomic, counts=counts,
                  chunk_counts=chunk_counts)
    assert counts[E - 1] == 0
    expected = ref.experts(ref.as64(x), ref.as64(cat), ref.as64(w2), ref.as64(weights), ids.numpy(), activation)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_bfloat16_activations_and_a_larger_row_tile():
    x, q13, q2, weights, ids, _, _, cat, w2 = _problem(20, 32, 16, 4, 2, FORMATS["int4-zeros-g16"])
    out = experts(x.bfloat16(), q13, q2, weights, ids, block_m=64)
    assert out.dtype == torch.bfloat16
    expected = ref.experts(ref.as64(x.bfloat16()), ref.as64(cat), ref.as64(w2), ref.as64(weights), ids.numpy())
    assert np.abs(out.double().numpy() - expected).max() <= 2e-2 * np.abs(expected).max()


def test_a_quantized_layer_is_the_layer_with_dequantized_weights():
    torch.manual_seed(0)
    layer = MoELayer(32, 16, 4, 2)
    x = torch.randn(6, 32)
    with torch.no_grad():
        layer.quantize_experts("fp8", scales="channel")
        out = layer(x)
        plain = MoELayer(32, 16, 4, 2)
        plain.gate.weight.copy_(layer.gate.weight)
        plain.w13.copy_(layer.w13.dequantize())
        plain.w2.copy_(layer.w2.dequantize())
        torch.testing.assert_close(out, plain(x), rtol=1e-5, atol=1e-5)
    assert "w13" not in dict(layer.named_parameters())
    torch.testing.assert_close(layer(x), out)            # grad mode on: differentiable in x and the router


def _layer_from(state, E, **options):
    state = {"gate.weight": torch.randn(E, 32, generator=torch.Generator().manual_seed(5)), **state}
    return MoELayer.from_state_dict(state, "qwen3", 2, **options)


@pytest.mark.parametrize("checkpoint", ["deepseek-fp8", "gptq", "awq"])
def test_quantized_checkpoints_load_into_the_layer(checkpoint):
    """A layer from a quantized checkpoint's expert tensors computes what the layer with the weights those
    tensors mean (their own formulas, dequantized) computes."""
    from test_quant_gemm import _pack_int32
    E, H, I = 4, 32, 16
    g = torch.Generator().manual_seed(6)
    state, plain = {}, {}
    for i in range(E):
        for name, (n, k) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            prefix = f"experts.{i}.{name}"
            if checkpoint == "deepseek-fp8":
                codes, scale = torch.randn(n, k, generator=g).to(torch.float8_e4m3fn), torch.rand(1, 1, generator=g)
                state |= {f"{prefix}.weight": codes, f"{prefix}.weight_scale_inv": scale}
                plain[f"{prefix}.weight"] = codes.float() * scale
                continue
            q = torch.randint(0, 16, (k, n), generator=g)
            zeros = torch.randint(1 if checkpoint == "gptq" else 0, 16, (k // 16, n), generator=g)   # GPTQ: 1..15
            scales = (torch.rand(k // 16, n, generator=g) * 0.1).half()
            if checkpoint == "gptq":        # packed along K, zeros stored minus one
                state |= {f"{prefix}.qweight": _pack_int32(q, 4, 0), f"{prefix}.qzeros": _pack_int32(zeros - 1, 4, 1)}
            else:                           # packed along N in AWQ's nibble order
                state |= {f"{prefix}.qweight": _pack_int32(q, 4, 1, quant.AWQ_ORDER),
                          f"{prefix}.qzeros": _pack_int32(zeros, 4, 1, quant.AWQ_ORDER)}
            state[f"{prefix}.scales"] = scales
            plain[f"{prefix}.weight"] = ((q - zeros.repeat_interleave(16, 0)) *
                                         scales.float().repeat_interleave(16, 0)).t()
    layer = _layer_from(state, E, quant_method="awq" if checkpoint == "awq" else "gptq")
    assert "w13" not in dict(layer.named_parameters())
    assert layer.w13.format == ("fp8" if checkpoint == "deepseek-fp8" else "int4")
    x = torch.randn(5, H, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), _layer_from(plain, E)(x), rtol=1e-5, atol=1e-5)


# -- the kernels as the GPU gets them ------------------------------------------------------------------


def _memory(a):
    """An interpreter argument as the SIMT simulator takes it: typed bytes (bf16, fp8, u4) as a Memory."""
    if isinstance(a, np.ndarray):
        return a.copy()
    return Memory(a.array.copy(), a.dtype) if hasattr(a, "array") else a


def _simt_matches_interpreter(kernel, args, grid, target, out, expect_ops, **constexprs):
    fn = lower(kernel.specialize(*args, **constexprs).module, target).functions[0]
    assert expect_ops <= {op.name for op in fn.walk()}
    expected = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    kernel[grid](*expected, **constexprs)
    got = [_memory(a) for a in args]
    run_threads(fn, got, grid)
    np.testing.assert_allclose(got[out].astype(np.float32), expected[out].astype(np.float32), rtol=2e-3, atol=2e-3)
    return expected[out]


def _weight_args(q):
    codes = kernel_arg(q.qweight.view(torch.uint8), tessera.u4 if q.format == "int4" else tessera.f8e4m3)
    return [codes, kernel_arg(q.scales), kernel_arg(q.zeros if q.zeros is not None else q.scales)]


@pytest.mark.parametrize("target, BM, name, expect_ops", [
    ("sm_80", 16, "int4-zeros-g16", {"unpack_bits", "mma", "async_copy"}),
    ("sm_80", 16, "fp8-block16", {"mma", "async_copy"}),          # no fp8 tensor cores: e4m3 -> f16 in registers
    ("sm_90a", 64, "int4-sym-g32", {"unpack_bits", "wgmma", "mbarrier_wait"}),
    ("sm_90a", 64, "fp8-block16", {"wgmma", "mbarrier_wait"}),
    ("gfx950", 64, "int4-sym-g32", {"mfma", "async_copy"}),     # x's 3-stage ring (direct to LDS)
    ("gfx950", 64, "fp8-block16", {"mfma", "async_copy"}),
])
def test_both_kernels_on_the_simt_simulator(target, BM, name, expect_ops):
    """gfx950 (`plan.gpu_plans`): the middle plan's 3-stage ring over 4 K steps, so that it wraps."""
    T, H, I, E, K = 6, 32, 32, 4, 2
    stages = 2
    if target == "gfx950":
        H, I, stages = 64, 64, plans.QUANTIZED["middle"].gate_up.stages
    x, q13, q2, weights, ids, counts, chunk_counts, _, _ = _problem(T, H, I, E, K, FORMATS[name])
    sorted_ids, block_expert, offsets = (t.numpy() for t in align(ids, E, BM, counts, chunk_counts))
    rows, numel, grid_rows = sorted_ids.shape[0], T * K, sorted_ids.shape[0] // BM
    xs = x.half().numpy()[np.minimum(sorted_ids, numel - 1) // K] * (sorted_ids < numel)[:, None]
    common = dict(FORMAT=q13.format, G=q13.group_size, ZEROS=q13.zeros is not None, BM=BM, BN=16, BK=16,
                  STAGES=stages)
    h = _simt_matches_interpreter(
        gate_up_quant_kernel, [xs, *_weight_args(q13), np.zeros((rows, I), np.float16), block_expert, offsets, rows, H,
                               I, E, 2 * I * E, q13.scales.shape[2]], (grid_rows, I // 16, 1), target, 4, expect_ops,
        ACTIVATION="silu", **common)
    _simt_matches_interpreter(
        down_quant_kernel, [h, *_weight_args(q2), np.zeros((numel, H), np.float16), weights.numpy(), sorted_ids,
                            block_expert, offsets, rows, H, I, E, E * H, q2.scales.shape[2], numel],
        (grid_rows, H // 16, 1), target, 4, expect_ops, TOP_K=K, ATOMIC=False, **common)


def _signature(kernel: str, fmt: str) -> str:
    w, s = ("*u4:16", "*bf16:16") if fmt == "int4" else ("*f8e4m3:16", "*f32:16")
    if kernel == "gate_up":
        return f"*bf16:16,{w},{s},{s},*bf16:16,*i32:16,*i32:16,i32:16,i32:16,i32:16,i32,i32:16,i32"
    return f"*bf16:16,{w},{s},{s},*bf16:16,*f32:16,*i32:16,*i32:16,*i32:16,i32:16,i32:16,i32:16,i32,i32:16,i32,i32"


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "gfx942", "gfx950"])
@pytest.mark.parametrize("regime", list(plans.QUANTIZED))
def test_the_quantized_plans_compile_without_spills(target, regime):
    """Each target's plans (`plan.gpu_plans`), pipelined (strict, so every stage is kept) within its LDS: gfx942's
    prefill x ring at 2 stages (3 need 66,552 bytes of its 65,536); on AMD no SGPR / VGPR spills or scratch."""
    amd = target.startswith("gfx")
    p = plans.gpu_plans("nvidia" if not amd else target, "quantized")[regime]
    for fmt in ("int4", "fp8"):
        for name, kernel, t, extra in (("gate_up", gate_up_quant_kernel, p.gate_up, dict(ACTIVATION="silu")),
                                       ("down", down_quant_kernel, p.down, dict(TOP_K=8, ATOMIC=False))):
            compiled = kernel.compile(signature=_signature(name, fmt), target=target, strict=True, FORMAT=fmt, G=128,
                                      ZEROS=fmt == "int4", BM=p.BM, BN=t.BN, BK=t.BK, STAGES=t.stages,
                                      num_warps=t.num_warps, **extra)
            spills = compiled.metadata.get("spill_stores", 0) + compiled.metadata.get("vgpr_spill_count", 0)
            assert spills == 0, f"{fmt} {name} spills on {target} ({regime}): {compiled.metadata}"
            if amd:
                assert not amd_spills(compiled.metadata), compiled.metadata
                assert compiled.metadata["shared_bytes"] <= lds_bytes(target)
                assert "global_load_lds" in compiled.stages["amdgcn"]


@pytest.mark.parametrize("regime", list(plans.QUANTIZED))
@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_dequantized_weights_reach_shared_memory_in_16_byte_stores(regime, fmt):
    """sm_90a PTX of the shipped gate_up plans: each thread stores its dequantized B block (2BN x BK bf16, held
    in runs along K) as 16-byte st.shared.v4 -- N x K for mma.sync (read by plain ldmatrix), K-major for wgmma
    -- not one st.shared.b16 per element (main, 2026-11-26: 32-64 scalar stores a thread per K step, 4-way
    conflicts, the MoE int4/fp8 layers at 9-13% of HBM). The one b16 store left is the scale's broadcast."""
    p = plans.QUANTIZED[regime]
    t = p.gate_up
    compiled = gate_up_quant_kernel.compile(signature=_signature("gate_up", fmt), target="sm_90a", strict=True,
                                            FORMAT=fmt, G=128, ZEROS=False, ACTIVATION="silu", BM=p.BM, BN=t.BN,
                                            BK=t.BK, STAGES=t.stages, num_warps=t.num_warps)
    ptx = compiled.stages["ptx"]
    per_thread = 2 * t.BN * t.BK // (32 * t.num_warps)
    assert ptx.count("st.shared.v4.b32") >= per_thread // 8
    assert ptx.count("st.shared.b16") <= 1
    assert ".trans" not in "".join(line for line in ptx.splitlines() if "ldmatrix" in line)


@pytest.mark.parametrize("regime", ["decode", "prefill"])
@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_weight_codes_and_scales_are_loaded_a_k_step_ahead(regime, fmt):
    """sm_90a SASS of the gate_up plans: the K loop's global loads (the codes' LDG.E.64/.128, the scales')
    land in registers that nothing in the rest of that iteration reads -- they are the next step's, so their
    latency overlaps a step's conversion, shared-memory exchange and multiplies. (On main each step waited
    for its own codes and scales: one exposed DRAM latency per K step, with 1-2 programs per SM to hide it.)"""
    from tessera.backends.nvptx.sass import disassemble, find_cuobjdump, loop_containing
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found (nvidia-cuda-cuobjdump wheel)")
    p = plans.QUANTIZED[regime]
    t = p.gate_up
    compiled = gate_up_quant_kernel.compile(signature=_signature("gate_up", fmt), target="sm_90a", strict=True,
                                            FORMAT=fmt, G=128, ZEROS=False, ACTIVATION="silu", BM=p.BM,
                                            BN=t.BN, BK=t.BK, STAGES=t.stages, num_warps=t.num_warps)
    code = disassemble(compiled.binary)
    assert not any(inst.opcode.startswith("I2F") for inst in code)      # int4: the load-fused unpack, carried
    body = loop_containing(code, "HGMMA" if p.BM >= 64 else "HMMA")
    loads = [(i, inst) for i, inst in enumerate(body) if inst.opcode.startswith("LDG")]
    wide = {"LDG.E.64": 8, "LDG.E.128": 16}
    code_bytes = 2 * t.BN * t.BK * (4 if fmt == "int4" else 8) // 8 // (32 * t.num_warps)
    assert sum(wide.get(inst.opcode, 0) for _, inst in loads) == code_bytes
    assert any(inst.opcode not in wide for _, inst in loads)                                 # and the scales'
    for i, inst in loads:
        first = int(re.search(r"LDG\S*\s+R(\d+)", inst.text).group(1))
        written = {f"R{first + j}" for j in range(4 if ".128" in inst.opcode else 2 if ".64" in inst.opcode else 1)}
        later = [x.text.split(None, 1 + x.text.startswith("@"))[-1] for x in body[i + 1:]]
        assert not any(re.search(rf"\b{r}\b", text) for text in later for r in written), inst.text


# -- the ops ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["int4-zeros-g16", "fp8-block16"])
def test_opcheck(name):
    x, q13, q2, weights, ids, counts, chunk_counts, _, _ = _problem(5, 32, 16, 4, 2, FORMATS[name])
    sorted_ids, block_expert, offsets = align(ids, 4, 16, counts, chunk_counts)
    xs = torch.zeros(sorted_ids.shape[0], 32)
    real = sorted_ids < 10
    xs[real] = x[sorted_ids[real].long() // 2]
    c13, c2 = q13.qweight.view(torch.uint8), q2.qweight.view(torch.uint8)
    h = gate_up_quant(xs, c13, q13.scales, q13.zeros, block_expert, offsets, "silu", 16, q13.format,
                      q13.group_size)
    torch.library.opcheck(gate_up_quant, (xs, c13, q13.scales, q13.zeros, block_expert, offsets, "gelu", 16,
                                          q13.format, q13.group_size))
    for atomic in (False, True):
        torch.library.opcheck(down_quant, (h, c2, q2.scales, q2.zeros, weights, sorted_ids, block_expert,
                                           offsets, 16, atomic, q2.format, q2.group_size))


def test_bad_arguments_name_the_fix():
    x, q13, q2, weights, ids, *_ = _problem(5, 32, 32, 4, 2, FORMATS["int4-sym-g32"])
    with pytest.raises(ValueError, match="quantize both w13 and w2"):
        experts(x, q13, torch.randn(4, 32, 32), weights, ids)
    with pytest.raises(ValueError, match="K \\(48\\) must be a multiple of group_size \\(32\\)"):
        quantize_experts(torch.randn(2, 8, 48), group_size=32)
    with pytest.raises(ValueError, match="format must be one of"):
        quantize_experts(torch.randn(2, 8, 32), "int8")
    with pytest.raises(ValueError, match="a multiple of 16"):       # blocks of 8 split the interpreter's K step
        experts(x, q13, quantize_experts(torch.randn(4, 32, 32), "fp8", block=8), weights, ids)
    with pytest.raises(ValueError, match=r"block_scales must be \[E, cdiv\(N, 128\), cdiv\(K, 128\)\]"):
        from_fp8_blocks(torch.zeros(1, 130, 128).to(torch.float8_e4m3fn), torch.ones(1, 1, 1))


# -- on a GPU --------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [3, 100, 700])                 # the decode, middle and prefill plans
@pytest.mark.parametrize("name", ["int4-zeros-g128", "fp8-tensor", "fp8-channel", "fp8-block128"])
def test_on_the_gpu_every_quantized_plan_matches_float32(name, tokens):
    H, I, E, K = 512, 384, 8, 2
    options = {"int4-zeros-g128": dict(format="int4", group_size=128, symmetric=False),
               "fp8-block128": dict(format="fp8", scales="block")}.get(name) or FORMATS[name]
    x, q13, q2, weights, ids, counts, chunk_counts, cat, w2 = _problem(tokens, H, I, E, K, options, seed=tokens)
    with torch.no_grad():
        out = experts(x.cuda().bfloat16(), q13.to("cuda"), q2.to("cuda"), weights.cuda(), ids.cuda())
    expected = ref.experts(ref.as64(x.bfloat16()), ref.as64(cat), ref.as64(w2), ref.as64(weights), ids.numpy())
    assert np.abs(out.cpu().double().numpy() - expected).max() <= 2e-2 * np.abs(expected).max()
