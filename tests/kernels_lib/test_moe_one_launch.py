"""The one-launch MoE layer (tessera.kernels_lib.moe.persistent): routing or counting, alignment, permute,
gate_up, down and combine in one persistent kernel whose programs take ticketed work items.

Specification:

* on the interpreter it computes what the multi-kernel path computes, bit for bit with the deterministic top-k
  sum (the same tile bodies in the same order per element), for bf16 and float32, SiLU and GELU, top-1 and
  top-8, experts that get no tokens, several routing chunks (a real prefix scan), DeepSeek-V3's grouped
  sigmoid routing with a correction bias, and any number of persistent programs, one included;
* the atomic top-k sum matches to rounding;
* lowered for sm_80 (mma.sync) and sm_90a (wgmma on TMA-filled rings), the SIMT simulator computes what the
  interpreter computes, 1 or more blocks resident;
* `experts(..., one_launch=True)` and `MoELayer(one_launch=True)` use it; opcheck passes for both ops;
  training through it is refused with the fix;
* at every shipped plan it compiles for sm_80 and sm_90a without register spills, and at every AMD plan of gfx942
  (`plan.AMD_ONE_LAUNCH`) and gfx950's deepest (decode's 4-stage rings) without spills or scratch, pipelined (strict),
  within the target's LDS (`plan.ring_bytes`); its waits poll with acquire loads and nanosleep backoff, and on
  sm_90a every TMA fill is fenced for the async proxy;
* lowered for gfx950 with 3-stage rings filled by direct-to-LDS loads, the simulator computes what the interpreter
  computes.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from amd_spills import amd_spills
from moe_problem import random_moe
from tessera.backends.simt import run_threads
from tessera.kernels_lib.moe import MoELayer, experts, interleave_gate_up, plan as plans, route
from tessera.kernels_lib.moe.persistent import (OUT_ARG, SIGNATURE, constexprs_for, experts_op, experts_one_launch,
                                                layer_launch, layer_op, moe_layer, moe_layer_kernel)
from tessera.kernels_lib.targets import AMD_PLAN_TARGETS, lds_bytes
from tessera.passes.thread_passes import lower


def _problem(T, H, I, E, K, dtype=torch.float32, empty=(), seed=0):
    x, w1, w3, w2, (weights, ids, counts, _) = random_moe(T, H, I, E, K, seed, empty)
    return x.to(dtype), interleave_gate_up(w1, w3).to(dtype), w2.to(dtype), weights, ids, counts


@pytest.mark.parametrize("T, H, I, E, K, dtype, activation, programs", [
    (9, 40, 24, 6, 2, torch.float32, "silu", 1),        # one program takes every ticket in order
    (7, 33, 20, 5, 1, torch.float32, "gelu", 3),        # odd hidden size, top-1
    (5, 24, 16, 16, 8, torch.bfloat16, "silu", 2),      # top-8, bf16
    (20, 32, 16, 128, 8, torch.bfloat16, "silu", 4),    # 3 routing chunks: the prefix scan runs for real
])
def test_experts_in_one_launch_equal_the_multi_kernel_path(T, H, I, E, K, dtype, activation, programs):
    x, w13, w2, weights, ids, counts = _problem(T, H, I, E, K, dtype, empty=(0, E - 1))
    assert counts[0] == counts[E - 1] == 0
    expected = experts(x, w13, w2, weights, ids, activation=activation)
    out = experts_one_launch(x, w13, w2, weights, ids, activation=activation, programs=programs)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_the_atomic_top_k_sum_matches_to_rounding():
    x, w13, w2, weights, ids, _ = _problem(12, 48, 32, 8, 2, empty=(3,))
    expected = experts(x, w13, w2, weights, ids, atomic=True)
    torch.testing.assert_close(experts(x, w13, w2, weights, ids, atomic=True, one_launch=True), expected,
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("options", [
    dict(scoring="softmax"),
    dict(scoring="sigmoid", n_group=4, topk_group=2, scaling_factor=2.5, bias=True),     # DeepSeek-V3 style
])
def test_routing_in_the_same_launch_equals_route_then_experts(options):
    T, H, I, E, K = 11, 24, 16, 16, 4
    x, w13, w2, *_ = _problem(T, H, I, E, K)
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(T, E, generator=g)
    logits[:, 5] = -30                                  # an expert nobody picks
    bias = torch.randn(E, generator=g) * 0.1 if options.pop("bias", False) else None
    weights, ids, counts, _ = route(logits, K, bias=bias, **options)
    expected = experts(x, w13, w2, weights, ids)
    out, got_weights, got_ids, got_counts = moe_layer(x, w13, w2, logits, K, bias=bias, programs=2, **options)
    assert torch.equal(got_ids, ids) and torch.equal(got_weights, weights) and torch.equal(got_counts, counts)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_the_layer_module_runs_in_one_launch():
    torch.manual_seed(0)
    layer = MoELayer(32, 16, 8, 2, dtype=torch.bfloat16)
    fused = MoELayer(32, 16, 8, 2, dtype=torch.bfloat16, one_launch=True)
    fused.load_state_dict(layer.state_dict())
    x = torch.randn(3, 5, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        expected, routing = layer(x, return_routing=True)
        out, fused_routing = fused(x, return_routing=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert torch.equal(fused_routing.ids, routing.ids) and torch.equal(fused_routing.counts, routing.counts)


def test_training_through_one_launch_is_refused_with_the_fix():
    layer = MoELayer(16, 8, 4, 2, one_launch=True)
    with pytest.raises(ValueError, match=r"one_launch=True is inference-only.*torch.no_grad\(\).*one_launch=False"):
        layer(torch.randn(3, 16))


def test_quantized_experts_are_refused_with_the_fix():
    layer = MoELayer(16, 16, 4, 2, one_launch=True).quantize_experts("fp8")
    with torch.no_grad(), pytest.raises(ValueError, match="quantized experts run with one_launch=False"):
        layer(torch.randn(3, 16))


def test_opcheck():
    x, w13, w2, weights, ids, _ = _problem(5, 16, 16, 4, 2)
    torch.library.opcheck(experts_op, (x, w13, w2, weights, ids, "silu", False, None, 2))
    logits = torch.randn(5, 4)
    torch.library.opcheck(layer_op, (x, w13, w2, logits, None, 2, "softmax", 1, 1, True, 1.0, "silu", False, None, 2))


ROUTING = {"qwen3": (128, 8, {}),
           "deepseek_v3": (256, 8, dict(scoring="sigmoid", has_bias=True, n_group=8, topk_group=4))}


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("regime", list(plans.SHIPPED))
@pytest.mark.parametrize("model", list(ROUTING))
def test_every_shipped_plan_compiles_without_spills(target, regime, model):
    """Qwen3-30B-A3B's and DeepSeek-V3's routing with each shipped plan (strict: no pipeline shortfall). Before
    `rematerialize_index`, every phase's hoisted index math lived across the ticket loop: 255 registers and
    260-372 bytes of spills at the middle and prefill plans on sm_80."""
    E, K, options = ROUTING[model]
    p = plans.SHIPPED[regime]
    compiled = moe_layer_kernel.compile(signature=SIGNATURE, target=target, strict=True, num_warps=p.gate_up.num_warps,
                                        **constexprs_for(p, E, K, 1, route=True, **options))
    assert compiled.metadata.get("spill_stores", 0) == 0, compiled.metadata
    assert compiled.metadata["registers"] <= 200, compiled.metadata
    ptx, thread_ir = compiled.stages["ptx"], compiled.stages["thread_ir"]
    # `wait_for` polls politely: acquire loads and nanosleep, no read-modify-write of the counter
    assert "ld.acquire.gpu" in ptx and "nanosleep.u32" in ptx and "atom.global.or" not in ptx
    if target == "sm_90a" and "cp.async.bulk.tensor" in ptx:        # rows other programs wrote reach TMA
        fills = len(re.findall(r"^\s*mbarrier_arrive_expect_tx ", thread_ir, re.M))   # through the proxy fence,
        assert fills and len(re.findall(r"^\s*fence_proxy_async_global$", thread_ir, re.M)) == fills  # every fill


def test_each_amd_targets_one_launch_plans_pipeline_within_its_lds():
    """One plan per regime for every AMD plan target, at the regime's BM (the layer picks its plan by BM), with
    rings of 2+ stages for both GEMMs that fit the target's LDS; gfx950's outgrow gfx942's 64 KiB (decode's
    4 x 18,432 bytes), so gfx942 cannot run them."""
    assert set(plans.AMD_ONE_LAUNCH) == set(AMD_PLAN_TARGETS)
    assert plans.ring_bytes(plans.DECODE) == 4 * (16 + 2 * 64) * 64 * 2
    for target, regimes in plans.AMD_ONE_LAUNCH.items():
        assert {r: p.BM for r, p in regimes.items()} == {r: p.BM for r, p in plans.SHIPPED.items()}, target
        for regime, p in regimes.items():
            assert min(p.gate_up.stages, p.down.stages) >= 2, (target, regime)
            assert plans.ring_bytes(p) <= lds_bytes(target), (target, regime, plans.ring_bytes(p))
    assert plans.ring_bytes(plans.AMD_ONE_LAUNCH["gfx950"]["decode"]) > lds_bytes("gfx942")


AMD_COMPILES = [("gfx942", regime, model) for regime in plans.AMD_ONE_LAUNCH["gfx942"] for model in ROUTING] + [
    ("gfx950", "decode", "qwen3")]      # gfx950: its deepest rings with the routing that needs the most VGPRs


@pytest.mark.parametrize("target, regime, model", AMD_COMPILES)
def test_every_amd_plan_compiles_without_spills(target, regime, model):
    """The plans the layer launches on AMD (strict: every stage kept), its rings filled by direct-to-LDS loads in
    the LDS `plan.ring_bytes` counts: no spills, no scratch. With the NVIDIA prefill plan's 8 waves a wave has 256
    VGPRs, and the qwen3 and deepseek_v3 kernels spilled 18 and 29 VGPRs to 76 and 120 bytes of scratch. SGPRs:
    the 18 buffers' base addresses, the uniform bounds and offsets LICM hoists out of the ticket loop, and a tile
    of booleans read from LDS across a barrier outnumbered the ~100 a wave has (spills 66-74 with the pointers
    alone reread); the spill retry rereads every argument where used, recomputes what is computed from them alone
    there, and computes lane masks after the barrier their use follows (`backends/llvm/reload_arguments.py`,
    `sink_vectors.py`). On gfx942 deeper rings spill SGPRs again (`plan.AMD_ONE_LAUNCH`'s comment)."""
    E, K, options = ROUTING[model]
    p = plans.AMD_ONE_LAUNCH[target][regime]
    compiled = moe_layer_kernel.compile(signature=SIGNATURE, target=target, strict=True,
                                        num_warps=p.gate_up.num_warps, **constexprs_for(p, E, K, 1, route=True,
                                                                                       **options))
    assembly = compiled.stages["amdgcn"]
    assert "v_mfma_f32_" in assembly and "global_load_lds_dword" in assembly
    assert amd_spills(compiled.metadata) == {}, (model, regime, compiled.metadata)
    assert compiled.metadata["shared_bytes"] == plans.ring_bytes(p) <= lds_bytes(target), compiled.metadata


SIMT_CASES = {   # target -> (plan, tokens, hidden, intermediate): mma.sync tiles, or wgmma tiles on TMA-filled rings
    "sm_80": (plans.CPU_PLAN, 5, 16, 16),
    "sm_90a": (plans.Plan(64, plans.GemmTiles(16, 32, 2, 4), plans.GemmTiles(16, 32, 2, 4)), 6, 64, 32),
    # 3-stage rings over 4 K steps of each GEMM (they wrap), blocks that fill whole waves (32 x 32)
    "gfx950": (plans.Plan(64, plans.GemmTiles(32, 32, 3, 4), plans.GemmTiles(32, 32, 3, 4)), 6, 128, 128),
}
SIMT_OPS = {"sm_80": {"mma"}, "sm_90a": {"wgmma", "tma_load", "mbarrier_wait"}, "gfx950": {"mfma", "async_copy"}}


@pytest.mark.parametrize("target, programs, resident", [("sm_80", 2, None), ("sm_80", 3, 1), ("sm_90a", 2, None),
                                                         ("gfx950", 2, None)])
def test_the_lowered_kernel_on_the_simt_simulator_computes_what_the_interpreter_computes(target, programs, resident):
    """Thread IR (mma.sync on sm_80; wgmma reading TMA-filled rings, whose mbarriers each tile sets up, on sm_90a;
    one thread's atomics broadcast through shared memory between barriers): blocks spin on each other's counters
    in the simulator's cooperative scheduler, and the result is the interpreter's, bit for bit. With the
    happens-before check: every row a block reads another wrote before a release it acquired (on sm_90a the
    combine's TMA store too, completed by the full wait before each release: `schedule/tma_store.py`)."""
    plan, T, H, I = SIMT_CASES[target]
    x, w13, w2, weights, ids, _ = _problem(T, H, I, 4, 2, torch.float16, empty=(3,))
    launch = layer_launch(x, w13, w2, None, None, weights, ids, 2, "softmax", 1, 1, True, 1.0, "silu", False, plan.BM,
                          plan=plan)
    fn = lower(moe_layer_kernel.specialize(*launch.args, **launch.constexprs).module, target).functions[0]
    assert SIMT_OPS[target] | {"atomic_rmw", "while", "barrier"} <= {op.name for op in fn.walk()}
    expected = [a.copy() if isinstance(a, np.ndarray) else a for a in launch.args]
    got = [a.copy() if isinstance(a, np.ndarray) else a for a in launch.args]
    moe_layer_kernel[(programs,)](*expected, **launch.constexprs)
    got[OUT_ARG][...] = np.nan
    if target == "sm_90a":
        assert {"tma_store", "bulk_wait_group"} <= {op.name for op in fn.walk()}
    run_threads(fn, got, programs, resident=resident, global_races=True)
    np.testing.assert_array_equal(got[OUT_ARG], expected[OUT_ARG])
    reference = experts(x.float(), w13.float(), w2.float(), weights, ids).numpy()
    np.testing.assert_allclose(got[OUT_ARG].astype(np.float32), reference, rtol=2e-3, atol=2e-3)
