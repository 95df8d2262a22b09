"""tessera.kernels_lib.moe: the routed experts as grouped GEMMs over the aligned token order.

Specification:

* `experts(x, w13, w2, weights, ids)` is sum_j w_j * down_e(act(gate_e(x)) * up_e(x)) as the float64 reference
  computes it, for SiLU and GELU, top-1 to top-8, odd hidden sizes, experts that get no tokens, with the
  deterministic top-k sum and with the atomic one, in float32 and bfloat16;
* its gradients in x, w13, w2 and the routing weights are the float64 reference's (autograd);
* lowered for sm_80 (mma.sync, cp.async rings) and sm_90a (wgmma on TMA-filled rings), each kernel computes on
  the SIMT simulator what the interpreter computes;
* every target's plans (`plan.gpu_plans`) keep rings its LDS holds, and their kernels compile for sm_80, sm_90a,
  gfx942 and gfx950 with no register spills and, in strict mode, no pipeline shortfall;
* opcheck passes for every op; bad arguments name the fix.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import moe_reference as ref
from amd_spills import amd_spills
from moe_problem import random_moe
from tessera.backends.simt import run_threads
from tessera.kernels_lib.moe import align, route
from tessera.kernels_lib.moe import plan as plans
from tessera.kernels_lib.targets import amd_plan_target, lds_bytes
from tessera.kernels_lib.moe.autograd import experts_op, grouped_gemm, weight_grad
from tessera.kernels_lib.moe.experts import down_kernel, gate_up_kernel, grouped_gemm_kernel, permute_kernel, \
    weight_grad_kernel
from tessera.kernels_lib.moe.mlp import combine, down, experts, gate_up, interleave_gate_up, permute
from tessera.passes.thread_passes import lower


def _problem(T, H, I, E, K, seed=0, dtype=torch.float32, empty=()):
    x, w1, w3, w2, (weights, ids, counts, chunk_counts) = random_moe(T, H, I, E, K, seed, empty)
    w13 = interleave_gate_up(w1, w3)
    return [t.to(dtype) for t in (x, w13, w2)] + [weights, ids, counts, chunk_counts, torch.cat([w1, w3], 1)]


def _aligned_f16(T, H, I, E, K, BM):
    """`_problem` in float16 with its token rows aligned to BM-row blocks (`align`): x, w13, w2, the routing
    weights, then as numpy the sorted token ids, each block's expert and the experts' row offsets, the aligned
    row count and the T * K routed rows."""
    x, w13, w2, weights, ids, counts, chunk_counts, _ = _problem(T, H, I, E, K, dtype=torch.float16)
    sorted_ids, block_expert, offsets = (t.numpy() for t in align(ids, E, BM, counts, chunk_counts))
    return x, w13, w2, weights, sorted_ids, block_expert, offsets, sorted_ids.shape[0], T * K


def _reference(x, w13_cat, w2, weights, ids, activation="silu"):
    return ref.experts(ref.as64(x), ref.as64(w13_cat), ref.as64(w2), ref.as64(weights), ids.numpy(), activation)


@pytest.mark.parametrize("T, H, I, E, K, activation, atomic", [
    (9, 40, 24, 6, 2, "silu", False),
    (7, 33, 20, 5, 1, "gelu", False),           # odd hidden size, top-1
    (5, 24, 16, 16, 8, "silu", True),           # top-8, atomic top-k sum
    (12, 48, 32, 8, 2, "gelu", True),
])
def test_experts_match_the_float64_reference(T, H, I, E, K, activation, atomic):
    x, w13, w2, weights, ids, counts, chunk_counts, w13_cat = _problem(T, H, I, E, K, empty=(E - 1,))
    out = experts(x, w13, w2, weights, ids, activation=activation, atomic=atomic, counts=counts,
                  chunk_counts=chunk_counts)
    assert counts[E - 1] == 0
    np.testing.assert_allclose(out.numpy(), _reference(x, w13_cat, w2, weights, ids, activation), rtol=1e-5,
                               atol=1e-5)


def test_bfloat16_and_a_larger_row_tile():
    x, w13, w2, weights, ids, _, _, w13_cat = _problem(20, 32, 16, 4, 2, dtype=torch.bfloat16)
    out = experts(x, w13, w2, weights, ids, block_m=64)
    assert out.dtype == torch.bfloat16
    expected = _reference(x, w13_cat.bfloat16(), w2, weights, ids)
    assert np.abs(out.double().numpy() - expected).max() <= 2e-2 * np.abs(expected).max()


def test_gradients_match_the_float64_reference():
    x, w13, w2, weights, ids, _, _, _ = _problem(6, 20, 12, 4, 2, seed=2, empty=(3,))

    def reference(x, w13, w2, weights):
        out = torch.zeros(x.shape[0], w2.shape[1], dtype=x.dtype)
        for t in range(x.shape[0]):
            for j in range(ids.shape[1]):
                e = int(ids[t, j])
                h = w13[e] @ x[t]
                out[t] = out[t] + weights[t, j] * (w2[e] @ (torch.nn.functional.silu(h[0::2]) * h[1::2]))
        return out

    grad = torch.randn(6, 20, generator=torch.Generator().manual_seed(3))
    ours = [t.clone().requires_grad_() for t in (x, w13, w2, weights)]
    experts(*ours, ids).backward(grad)
    theirs = [t.clone().double().requires_grad_() for t in (x, w13, w2, weights)]
    reference(*theirs).backward(grad.double())
    for name, a, b in zip(("x", "w13", "w2", "weights"), ours, theirs):
        np.testing.assert_allclose(a.grad.double().numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    assert ours[1].grad[3].abs().max() == 0          # the expert nobody picked gets no gradient


# -- the kernels as the GPU gets them ------------------------------------------------------------------


def _simt_matches_interpreter(kernel, args, grid, target, outputs, expect_ops, **constexprs):
    fn = lower(kernel.specialize(*args, **constexprs).module, target).functions[0]
    assert expect_ops <= {op.name for op in fn.walk()}
    expected = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    kernel[grid](*expected, **constexprs)
    got = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_threads(fn, got, grid)
    for i in outputs:
        np.testing.assert_allclose(got[i].astype(np.float32), expected[i].astype(np.float32), rtol=2e-3, atol=2e-3)
    return expected


@pytest.mark.parametrize("target, BM, pipelined_by", [("sm_80", 16, {"mma", "async_copy"}),
                                                      ("sm_90a", 64, {"wgmma", "mbarrier_wait"})])
def test_each_kernel_on_the_simt_simulator(target, BM, pipelined_by):
    T, H, I, E, K = 6, 32, 32, 4, 2
    x, w13, w2, weights, sorted_ids, block_expert, offsets, rows, numel = _aligned_f16(T, H, I, E, K, BM)
    grid_rows = (rows + BM - 1) // BM
    aligned = dict(BM=BM, BN=16, BK=16, STAGES=2)
    xs = _simt_matches_interpreter(
        permute_kernel, [x.numpy(), sorted_ids, np.zeros((rows, H), np.float16), rows, H, numel],
        (grid_rows, 1, 1), target, [2], set(), TOP_K=K, BR=BM, BH=32)[2]
    h = _simt_matches_interpreter(
        gate_up_kernel, [xs, w13.numpy(), np.zeros((rows, I), np.float16), block_expert, offsets, rows, H, I, E,
                         2 * I * E], (grid_rows, I // 16, 1), target, [2], pipelined_by, ACTIVATION="silu", **aligned)[2]
    _simt_matches_interpreter(
        down_kernel, [h, w2.numpy(), np.zeros((numel, H), np.float16), weights.numpy(), sorted_ids, block_expert,
                      offsets, rows, H, I, E, E * H, numel], (grid_rows, H // 16, 1), target, [2], pipelined_by,
        TOP_K=K, ATOMIC=False, **aligned)
    _simt_matches_interpreter(
        grouped_gemm_kernel, [h, w2.numpy(), np.zeros((rows, I), np.float32), block_expert, offsets, rows, I, H, E,
                              E * H], (grid_rows, I // 16, 1), target, [2], pipelined_by, TRANS_B=False, **aligned)
    _simt_matches_interpreter(
        weight_grad_kernel, [xs, h, np.zeros((E, H, I), np.float32), offsets, rows, H, I, E], (E, H // 16, I // 16),
        target, [2], pipelined_by - {"wgmma"}, BN=16, BK=16, BR=16, STAGES=2)       # 16-row tiles: mma.sync


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_gate_up_and_down_with_amd_rings_on_the_simt_simulator(target):
    """The AMD targets' pipelined expert GEMMs (`plan.gpu_plans`): the middle plan's 64-row tile on 4 waves and its
    rings filled by direct-to-LDS loads (gfx942: 2 stages of 4-byte-a-lane copies; gfx950: 3 of 16-byte ones),
    over 4 K steps (the ring wraps), at blocks that fill whole waves (32 x 32), compute on the simulator what the
    interpreter computes."""
    stages = plans.gpu_plans(target)["middle"].gate_up.stages
    assert stages == plans.gpu_plans(target)["middle"].down.stages == {"gfx942": 2, "gfx950": 3}[target]
    T, H, I, E, K, BM = 6, 128, 128, 4, 2, 64
    x, w13, w2, weights, sorted_ids, block_expert, offsets, rows, numel = _aligned_f16(T, H, I, E, K, BM)
    grid_rows = (rows + BM - 1) // BM
    aligned = dict(BM=BM, BN=32, BK=32, STAGES=stages)
    xs = _simt_matches_interpreter(
        permute_kernel, [x.numpy(), sorted_ids, np.zeros((rows, H), np.float16), rows, H, numel],
        (grid_rows, 1, 1), target, [2], set(), TOP_K=K, BR=BM, BH=32)[2]
    h = _simt_matches_interpreter(
        gate_up_kernel, [xs, w13.numpy(), np.zeros((rows, I), np.float16), block_expert, offsets, rows, H, I, E,
                         2 * I * E], (grid_rows, I // 32, 1), target, [2], {"mfma", "async_copy"},
        ACTIVATION="silu", **aligned)[2]
    _simt_matches_interpreter(
        down_kernel, [h, w2.numpy(), np.zeros((numel, H), np.float16), weights.numpy(), sorted_ids, block_expert,
                      offsets, rows, H, I, E, E * H, numel], (grid_rows, H // 32, 1), target, [2],
        {"mfma", "async_copy"}, TOP_K=K, ATOMIC=False, **aligned)


def test_the_decode_plans_tiles_on_the_simt_simulator_for_sm_90a():
    """plan.DECODE's own tiles as the H100 runs them: TMA-filled rings of 128-byte rows (the 128B swizzle) read
    by ldmatrix into mma.sync, gate_up and down, compute on the simulator what the interpreter computes."""
    T, H, I, E, K = 5, 256, 128, 4, 2
    p = plans.DECODE
    x, w13, w2, weights, sorted_ids, block_expert, offsets, rows, numel = _aligned_f16(T, H, I, E, K, p.BM)
    xs = np.zeros((rows, H), np.float16)
    permute_kernel[(rows // p.BM, 1, 1)](x.numpy(), sorted_ids, xs, rows, H, numel, TOP_K=K, BR=p.BM, BH=H)
    up, down = p.gate_up, p.down
    h = _simt_matches_interpreter(
        gate_up_kernel, [xs, w13.numpy(), np.zeros((rows, I), np.float16), block_expert, offsets, rows, H, I, E,
                         2 * I * E], (rows // p.BM, I // up.BN, 1), "sm_90a", [2], {"mma", "tma_load"},
        ACTIVATION="silu", BM=p.BM, BN=up.BN, BK=up.BK, STAGES=up.stages)[2]
    _simt_matches_interpreter(
        down_kernel, [h, w2.numpy(), np.zeros((numel, H), np.float16), weights.numpy(), sorted_ids, block_expert,
                      offsets, rows, H, I, E, E * H, numel], (rows // p.BM, H // down.BN, 1), "sm_90a", [2],
        {"mma", "tma_load"}, TOP_K=K, ATOMIC=False, BM=p.BM, BN=down.BN, BK=down.BK, STAGES=down.stages)
    for name in ("gate_up", "down"):        # 256-byte rows took no swizzle: 8-way ldmatrix bank conflicts
        compiled = KERNELS[name].compile(signature=SIGNATURES[name], target="sm_90a", strict=True,
                                         **_launch_constexprs(name, p))
        assert {m["swizzle"] for m in compiled.metadata["tensor_maps"]} == {"128B"}, compiled.metadata["tensor_maps"]


SIGNATURES = {      # bf16 operands, 16-byte aligned pointers and sizes, as the op launches them
    "gate_up": "*bf16:16,*bf16:16,*bf16:16,*i32:16,*i32:16,i32:16,i32:16,i32:16,i32,i32:16",
    "down": "*bf16:16,*bf16:16,*bf16:16,*f32:16,*i32:16,*i32:16,*i32:16,i32:16,i32:16,i32:16,i32,i32:16,i32",
    "grouped_gemm": "*bf16:16,*bf16:16,*f32:16,*i32:16,*i32:16,i32:16,i32:16,i32:16,i32,i32:16",
    "weight_grad": "*bf16:16,*bf16:16,*f32:16,*i32:16,i32:16,i32:16,i32:16,i32",
}


def _launch_constexprs(kernel: str, p: plans.Plan) -> dict:
    t = p.gate_up if kernel in ("gate_up", "weight_grad") else p.down
    tiles = dict(BN=t.BN, BK=t.BK, STAGES=t.stages, num_warps=t.num_warps)
    extra = {"gate_up": dict(ACTIVATION="silu", BM=p.BM), "down": dict(TOP_K=8, ATOMIC=False, BM=p.BM),
             "grouped_gemm": dict(TRANS_B=True, BM=p.BM), "weight_grad": dict(BR=min(p.BM, t.BK))}[kernel]
    return {**tiles, **extra}


KERNELS = {"gate_up": gate_up_kernel, "down": down_kernel, "grouped_gemm": grouped_gemm_kernel,
           "weight_grad": weight_grad_kernel}


GPU_TARGETS = ("sm_80", "sm_90a", "gfx942", "gfx950")


def _plan_key(target: str) -> str:
    """The plan key (`targets.plan_target`) a GPU of `target` runs: NVIDIA's one table, else the AMD target."""
    return "nvidia" if target.startswith("sm_") else amd_plan_target(target)


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize("regime", list(plans.SHIPPED))
def test_the_shipped_plans_compile_without_spills(target, regime):
    """Each target's plans (`plan.gpu_plans`) pipelined, strict (every stage kept), within its LDS; on AMD with
    direct-to-LDS rings and no SGPR / VGPR spills or scratch."""
    amd = target.startswith("gfx")
    p = plans.gpu_plans(_plan_key(target))[regime]
    for name in (("gate_up", "down") if regime != "middle" else KERNELS):      # the backward GEMMs: one plan
        compiled = KERNELS[name].compile(signature=SIGNATURES[name], target=target, strict=True,
                                         **_launch_constexprs(name, p))
        spills = amd_spills(compiled.metadata) if amd else compiled.metadata.get("spill_stores", 0)
        assert not spills, f"{name} spills on {target} ({regime}): {compiled.metadata}"
        assert compiled.metadata["shared_bytes"] <= lds_bytes(target), (name, compiled.metadata["shared_bytes"])
        if amd:
            assert "global_load_lds" in compiled.stages["amdgcn"], name
        if amd and name in ("gate_up", "down"):     # the ring is all the LDS it takes: the model the plans fit by
            assert compiled.metadata["shared_bytes"] == plans.gemm_ring_bytes(p, name), name


@pytest.mark.parametrize("target", GPU_TARGETS)
def test_every_targets_rings_fit_its_lds(target):
    """Each target's bf16 plans keep the shipped tiles, pipelined (2+ stages), with rings (`plan.ring_bytes`) its
    LDS holds, each GEMM's as deep as shipped or as deep as fits: gfx942 (64 KiB) cannot hold the shipped rings
    (decode's gate_up: 4 x 18,432 bytes), gfx950 (160 KiB) and NVIDIA's run them."""
    own = plans.gpu_plans(_plan_key(target))
    assert {r: p.BM for r, p in own.items()} == {r: p.BM for r, p in plans.SHIPPED.items()}
    for regime, p in own.items():
        assert plans.ring_bytes(p) <= lds_bytes(target), (target, regime, plans.ring_bytes(p))
        for gemm in ("gate_up", "down"):
            t, shipped = getattr(p, gemm), getattr(plans.SHIPPED[regime], gemm)
            assert replace(t, stages=shipped.stages) == shipped and t.stages >= 2, (regime, gemm, t)
            deeper = replace(p, **{gemm: replace(t, stages=t.stages + 1)})
            assert t.stages == shipped.stages or plans.gemm_ring_bytes(deeper, gemm) > lds_bytes(target), \
                (regime, gemm)
    assert (own == plans.SHIPPED) == (plans.ring_bytes(plans.DECODE) <= lds_bytes(target))


# -- the ops ---------------------------------------------------------------------------------------------


def test_opcheck():
    x, w13, w2, weights, ids, counts, chunk_counts, _ = _problem(5, 16, 16, 4, 2)
    sorted_ids, block_expert, offsets = align(ids, 4, 16, counts, chunk_counts)
    xs = permute(x, sorted_ids, 2, 16)
    h = gate_up(xs, w13, block_expert, offsets, "silu", 16)
    torch.library.opcheck(permute, (x, sorted_ids, 2, 16))
    torch.library.opcheck(gate_up, (xs, w13, block_expert, offsets, "gelu", 16))
    torch.library.opcheck(down, (h, w2, weights, sorted_ids, block_expert, offsets, 16, False))
    torch.library.opcheck(combine, (torch.randn(10, 16), 2, torch.float32))
    torch.library.opcheck(weight_grad, (xs, h, offsets, 16))
    torch.library.opcheck(grouped_gemm, (h, w2, block_expert, offsets, 16, False))
    args = (x.requires_grad_(), w13, w2, weights, sorted_ids, block_expert, offsets, 16, "silu", False)
    torch.library.opcheck(experts_op, args, test_utils=("test_schema", "test_autograd_registration",
                                                        "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("change, message", [
    (dict(x=torch.randn(5, 16, dtype=torch.float64)), "x must be a float16/bfloat16/float32"),
    (dict(w13=torch.randn(4, 15, 16)), r"w13 must be \[experts, 2 \* intermediate, 16\]"),
    (dict(w2=torch.randn(4, 16, 9)), r"w2 must be \[experts, hidden, intermediate\] = \[4, 16, 8\]"),
    (dict(w2=torch.randn(4, 16, 8).half()), r"cast the weights with \.to\(torch\.float32\)"),
    (dict(activation="relu"), "activation must be one of"),
])
def test_bad_arguments_name_the_fix(change, message):
    g = torch.Generator().manual_seed(0)
    args = dict(x=torch.randn(5, 16, generator=g), w13=torch.randn(4, 16, 16, generator=g),
                w2=torch.randn(4, 16, 8, generator=g), activation="silu")
    args.update(change)
    weights, ids, _, _ = route(torch.randn(5, 4, generator=g), 2)
    with pytest.raises(ValueError, match=message):
        experts(args["x"], args["w13"], args["w2"], weights, ids, activation=args["activation"])


@pytest.mark.parametrize("target, registers", [("sm_90a", 128), ("sm_80", 168)])
def test_a_vllm_style_port_fits_once_its_columns_are_known_contiguous(target, registers):
    """The issue's spilling port (docs/moe.md): `pid_n` comes from a division by `min(num_pid_m - first_pid_m,
    GROUP_M)`, which the alignment analysis cannot prove positive, so `(pid_n * BN + arange) % N` may be
    negative and loses its contiguity; B is then read element by element with a live 64-bit address per
    element. Stating `pid_n >= 0` gives back 128-bit loads and Triton's register budget (127 on sm_90a)."""
    from moe_vllm_port import SIGNATURE, fused_moe_kernel
    # not strict: the port reads its blocks through tiles of pointers, which the compiler does not pipeline on
    # its own (strict mode says so at its K loop: tests/passes/test_auto_pipeline.py)
    compiled = fused_moe_kernel.compile(signature=SIGNATURE, target=target, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64,
                                        GROUP_M=8, top_k=2, PID_N_NONNEGATIVE=True, num_warps=4, strict=False)
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["registers"] <= registers
    assert "ld.global.b16" not in compiled.stages["ptx"]            # every operand load is 128 bits wide
