"""The attention kernels as GPU code: every shipped plan compiles without register spills (ptxas for sm_80 and
sm_90a, LLVM's AMDGPU backend for gfx942 and gfx950), on the instructions meant, and the lowered per-thread code
computes on the SIMT simulator what numpy computes."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera import PipelineWarning  # noqa: E402
from tessera.backends.nvptx import find_ptxas  # noqa: E402
from tessera.kernels_lib.attention import GPU_PLANS, WS_GPU_PLANS  # noqa: E402
from tessera.kernels_lib.attention_fwd import LOG2E, attention_fwd_kernel  # noqa: E402

from attention_reference import attention as reference, nan_padded_kv  # noqa: E402
from amd_spills import amd_spills  # noqa: E402
from tessera.kernels_lib.targets import lds_bytes  # noqa: E402
from sass_checks import assert_wgmma_descriptors_built  # noqa: E402

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")


# q, k, v, o, lse, cu_q, cu_k, Sq, Sk, H, H_KV, qk_scale, softcap, left, right, 4 x (b, s, h, d) strides, lse's,
# then the fusion hooks' slots (unused here): score_mod's 2 pointers and 2 scalars, the epilogue's tensor, its
# 4 strides and scalar; the fp8 descales and V's length
FORWARD_SIGNATURE = ",".join(["*{t}:16"] * 4 + ["*f32:16", "*i32:16", "*i32:16"] + ["i32"] * 4 + ["f32", "f32"]
                             + ["i32", "i32"] + ["i32:16", "i32:16", "i32:16", "i32:1"] * 4 + ["i32", "i32"]
                             + ["*{t}:16", "*{t}:16", "f32", "f32", "*{t}:16", "i32", "i32", "i32", "i32", "f32"]
                             + ["*f32:16", "i32"])
VARIANTS = {    # the plain kernel, and the one with every option compiled in (the most registers)
    "plain": dict(HAS_LEFT=False, HAS_RIGHT=False, SOFTCAP=False, VARLEN=False),
    "window-softcap-varlen": dict(HAS_LEFT=True, HAS_RIGHT=True, SOFTCAP=True, VARLEN=True),
}


def compile_checked(kernel, target, **options):
    """`kernel.compile(target=target, **options)`, strict (no schedule shortfall) except where TMA cannot stream
    K and V on sm_90a: with VARLEN the blocks' bounds (each sequence's length) and the decode kernel's (a page's
    tokens) are loaded from memory, which a tensor map, built by the host from the launch's arguments, cannot
    hold; so those blocks come by cp.async, with that shortfall seen and no other. Both kernels accept it
    (`tessera.kernel(tolerate=...)`), so they compile strict, as a user's $TESSERA_STRICT launch does.
    (FA3's way, one map over the packed (total, H, D) tensor at row cu_seqlens[b] + n * BN, compiles to TMA here,
    but fails the NaN-neighbour check on the SIMT simulator: the next sequence's K rows in a tail block are
    masked to -inf, while its V rows meet P = 0 in P V, and 0 * Inf or NaN there is NaN in this sequence's O.)"""
    owes_tma = options.get("VARLEN", False) or kernel.name == "attention_decode_kernel"
    if not (target.startswith("sm_90") and owes_tma):
        return kernel.compile(target=target, strict=True, **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")     # the kernel accepts the shortfall itself (tolerate=): strict compiles it
        compiled = kernel.compile(target=target, strict=True, **options)
    shortfalls = [str(w.message) for w in caught if issubclass(w.category, PipelineWarning)]
    assert shortfalls and all("cp.async instead of TMA" in m and "sizes and row stride are not constants or "
                              "kernel arguments" in m for m in shortfalls), shortfalls   # and no other
    return compiled


def streams_by_tma(ptx, rank=4):
    """Whether every pipelined block of `ptx` comes by TMA over the whole (B, S, H, D) tensor (a rank-4 map,
    coordinates (d, s, h, b)), none by cp.async."""
    return f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile" in ptx and "cp.async.cg" not in ptx


def compile_forward(target, D, plan, variant, dtype="bf16"):
    return compile_checked(attention_fwd_kernel, target, signature=FORWARD_SIGNATURE.format(t=dtype),
                             num_warps=plan.num_warps, D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages,
                             WS=plan.ws, **VARIANTS[variant])


@needs_ptxas
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("D", sorted(GPU_PLANS["nvidia"]))
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_every_nvidia_plan_compiles_without_spills(target, D, variant):
    """sm_80: both products on mma.sync, K and V streamed by cp.async; sm_90a: both on wgmma (Q staged in
    shared memory once, before the key loop; P fed from registers), K and V streamed by TMA (4-D maps over (B, S, H, D) at
    coordinates (0, block, kv head, batch); with VARLEN by cp.async: see `compile_checked`)."""
    plan = GPU_PLANS["nvidia"][D]
    compiled = compile_forward(target, D, plan, variant)
    metadata, ptx = compiled.metadata, compiled.stages["ptx"]
    assert metadata["spill_stores"] == metadata["spill_loads"] == 0, f"{metadata['registers']} registers"
    if target == "sm_90a" and not VARIANTS[variant]["VARLEN"]:
        assert streams_by_tma(ptx)
        # Q loaded and O stored by TMA too (`passes/schedule/tma_operand.py`, `tma_store.py`): no thread reads
        # Q or writes O itself (the one st.global left is the LSE's)
        assert [r["pointer"] for r in metadata["tensor_maps"]] == ["q_ptr", "k_ptr", "v_ptr", "o_ptr"]
        assert "ld.global" not in ptx and ptx.count("st.global") == 1
        # O: stmatrix into a 128B-swizzled tile, one TMA store per 64-column block (`stmatrix_store.py`)
        assert len(re.findall(r"cp\.async\.bulk\.tensor\.4d\.global\.shared::cta", ptx)) == D // 64
        assert "stmatrix.sync.aligned" in ptx
    else:
        assert "cp.async.cg.shared.global" in ptx and "cp.async.bulk.tensor" not in ptx
    if target == "sm_90a":
        assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{plan.BN}k16\S* \{{[^}}]*\}}, %rd", ptx), \
            "S = Q K^T on wgmma, Q from shared memory"
        p_from_registers = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{D}k16\S* \{{[^}}]*\}}, "
                                      r"\{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+", ptx)
        assert len(p_from_registers) == plan.BN // 16 * (plan.BM // 64 // (plan.num_warps // 4)), \
            "O += P V on wgmma, P from registers (each 64-row slab, each K slice of 16)"
        assert "mma.sync" not in ptx
        assert_wgmma_descriptors_built(compiled)
    else:
        assert "mma.sync.aligned.m16n8k16" in ptx and "wgmma" not in ptx


def test_warp_specialized_plans_are_the_default_tiles_with_a_producer():
    """No GPU_PLANS entry warp-specializes; WS_GPU_PLANS are the same tiles with ws set (which one a call takes:
    test_attention_plan_choice.py)."""
    import dataclasses

    assert not any(plan.ws for plans in GPU_PLANS.values() for plan in plans.values())
    assert all(plan.ws and dataclasses.replace(plan, ws=False) == GPU_PLANS["nvidia"][D]
               for D, plan in WS_GPU_PLANS.items()) and sorted(WS_GPU_PLANS) == [64, 128]


WS_VARIANTS = {"plain": VARIANTS["plain"],       # (not varlen: the producer would need the bounds cu_seqlens holds)
               "window-softcap": dict(VARIANTS["window-softcap-varlen"], VARLEN=False)}


@needs_ptxas
@pytest.mark.parametrize("variant", list(WS_VARIANTS))
@pytest.mark.parametrize("D", sorted(WS_GPU_PLANS))
def test_warp_specialized_plans_split_producer_and_consumers_without_spills(D, variant):
    """sm_90a, WS: 384 threads; the producer warpgroup (`setmaxnreg.dec 40`) issues every TMA fill of K and V
    and nothing else of the kernel; the consumers (`setmaxnreg.inc 232`) read Q, wait on the full mbarriers,
    run both products on wgmma (P from registers) and release slots by mbarrier arrivals; no spills."""
    plan = WS_GPU_PLANS[D]
    compiled = attention_fwd_kernel.compile(target="sm_90a", strict=True, signature=FORWARD_SIGNATURE.format(t="bf16"),
                                            num_warps=plan.num_warps, D=D, BM=plan.BM, BN=plan.BN,
                                            STAGES=plan.stages, WS=True, **WS_VARIANTS[variant])
    metadata, ptx = compiled.metadata, compiled.stages["ptx"]
    assert metadata["num_threads"] == 384 and re.search(r"\.maxntid 384\b", ptx)
    assert metadata["spill_stores"] == metadata["spill_loads"] == 0, metadata["log"]
    lines = ptx.splitlines()
    dec = next(i for i, line in enumerate(lines) if "setmaxnreg.dec.sync.aligned.u32 \t40;" in line)
    inc = next(i for i, line in enumerate(lines) if "setmaxnreg.inc.sync.aligned.u32 \t232;" in line)
    tma = [i for i, line in enumerate(lines) if "cp.async.bulk.tensor.4d.shared" in line]
    assert tma and sum(dec < i < inc for i in tma) == 2 * D // 64, "K and V: TMA fills in the producer's branch"
    assert "cp.async.cg" not in ptx
    assert [r["pointer"] for r in metadata["tensor_maps"]] == ["q_ptr", "k_ptr", "v_ptr", "o_ptr"]
    consumers = "\n".join(lines[inc:])
    # Q: thread 0 issues its TMA load before the split (ahead of the producer's first fill), the consumers wait
    assert len([i for i in tma if i < dec]) == D // 64, "Q by TMA: a box of 64 columns (128B swizzle) each"
    assert "ld.global" not in ptx
    assert "mbarrier.try_wait.parity" in consumers and "mbarrier.arrive" in consumers
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.4d\.global\.shared::cta", consumers)) == D // 64, \
        "O by TMA store, a box per 64 columns"
    assert "stmatrix.sync.aligned" in consumers
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{plan.BN}k16\S* \{{[^}}]*\}}, %rd", consumers)
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{D}k16\S* \{{[^}}]*\}}, \{{%r\d+, %r\d+, %r\d+, "
                     r"%r\d+\}, %rd\d+", consumers), "O += P V with P from registers"
    assert "wgmma" not in "\n".join(lines[:inc])
    assert_wgmma_descriptors_built(compiled)


def sass_opcodes(compiled) -> list[str]:
    """The SASS opcodes (predicate and modifiers dropped) ptxas made of `compiled`."""
    from tessera.backends.nvptx.sass import disassemble
    return [re.sub(r"^@!?U?P\w+\s+", "", i.text).split()[0].split(".")[0] for i in disassemble(compiled.binary)]


@needs_ptxas
@pytest.mark.parametrize("ws", [False, True])
def test_a_positive_scale_folds_into_one_fma_a_score_on_sm_90a(ws):
    """Head dim 128 on sm_90a (both Hopper plans): with POSITIVE_SCALE the key loop takes the row max of the raw
    q.k and computes exp2's argument as one fma a score, q.k * c - m (FlashAttention-3's softmax), where scaling
    the scores first took a multiply and a subtract: 32 scores a consumer thread (128 x 64 over 256) each one
    instruction fewer. POSITIVE_SCALE=False (a scale <= 0, where the max does not commute) keeps the old code."""
    plan = (WS_GPU_PLANS if ws else GPU_PLANS["nvidia"])[128]
    scores = plan.BM * plan.BN // (plan.num_warps * 32)
    built = {folded: attention_fwd_kernel.compile(
        target="sm_90a", strict=True, signature=FORWARD_SIGNATURE.format(t="bf16"), num_warps=plan.num_warps,
        D=128, BM=plan.BM, BN=plan.BN, STAGES=plan.stages, WS=ws, POSITIVE_SCALE=folded, **VARIANTS["plain"])
        for folded in (True, False)}
    fmas = {folded: c.stages["ptx"].count("fma.rn.f32") for folded, c in built.items()}
    muls = {folded: len(re.findall(r"\bmul\.f32", c.stages["ptx"])) for folded, c in built.items()}
    # (2 rows a thread: each row max times c is one multiply more)
    assert fmas[True] - fmas[False] == scores and muls[False] - muls[True] >= scores - 2, (fmas, muls)
    from tessera.backends.nvptx.sass import find_cuobjdump
    if find_cuobjdump() is None or built[True].binary is None:
        return
    ops = {folded: sass_opcodes(c) for folded, c in built.items()}
    assert ops[True].count("FFMA") - ops[False].count("FFMA") == scores
    mul_adds = {folded: o.count("FMUL") + o.count("FADD") for folded, o in ops.items()}
    assert mul_adds[False] - mul_adds[True] == 2 * scores - 2, "a multiply and a subtract a score for one fma"
    assert ops[True].count("MUFU") == ops[False].count("MUFU") and ops[True].count("HGMMA") == 12


# A register budget every variant of the head-dim-256 forward meets on sm_90a without spills (measured: under
# `.maxnreg` the plain kernel needs 200, the window-softcap-varlen one 216; 184 spills both).
D256_REGISTER_BUDGET = 216


@needs_ptxas
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_head_dim_256_forward_has_register_headroom_on_sm_90a(variant):
    """ptxas, unbounded, takes 255 registers for the head-dim-256 plan (there is no occupancy to win: one
    warpgroup and ~100 KB of shared memory a CTA); the kernel's need is what it fits in under a `.maxnreg` cap
    without spilling: D256_REGISTER_BUDGET, leaving room below FA3's 240-register consumer warpgroups."""
    from tessera.backends.nvptx.ptxas import assemble
    plan = GPU_PLANS["nvidia"][256]
    ptx = compile_forward("sm_90a", 256, plan, variant).stages["ptx"]
    assert ptx.count(".maxntid") == 1 and ".maxnreg" not in ptx
    cap = D256_REGISTER_BUDGET
    _, info = assemble(ptx.replace(".maxntid", f".maxnreg {cap}\n.maxntid"), "sm_90a", find_ptxas())
    assert info["registers"] <= cap < 255, "the cap is honoured"
    assert info["spill_stores"] == info["spill_loads"] == 0, f"under .maxnreg {cap}: {info['spill_stores']} bytes"


# SGPR spills left where every plan has none (bench/amd_registers.py; a ceiling, so a regression fails): with
# every option compiled in, the head-dim-128 forward on gfx942 keeps its window and softcap lane masks (two
# SGPRs a lane of S) and its varlen bounds live at once; LLVM's register-minimizing scheduler, which gets
# head dims 64 and 256 to none, spills 7 VGPRs to scratch there instead (worse). The spill retry's argument
# reloads and cones (`backends/llvm/reload_arguments.py`) took it from 27 to 19 and the dQ kernel's 5 (gfx950:
# 1) to none.
SGPR_SPILLS_LEFT = {("forward", "gfx942", 128): 19}


def assert_amd_spills_within(metadata, *key):
    """No VGPR spills and no scratch; SGPR spills at most `SGPR_SPILLS_LEFT[key]` (none unless listed)."""
    spills = amd_spills(metadata)
    assert spills.get("sgpr_spill_count", 0) <= SGPR_SPILLS_LEFT.get(key, 0), (key, spills)
    assert set(spills) <= {"sgpr_spill_count"}, (key, spills)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("target, mfma", [("gfx942", "v_mfma_f32_32x32x8_bf16"),
                                          ("gfx950", "v_mfma_f32_32x32x16_bf16")])    # gfx950: double-K
@pytest.mark.parametrize("D", sorted(GPU_PLANS["gfx942"]))
def test_every_amd_plan_compiles_on_mfma_without_spills(D, target, mfma, variant):
    """Each AMD target's own plan (`GPU_PLANS[target]`), plain and with every option compiled in: MFMA only,
    no VGPR spills or scratch, and within the target's LDS (`targets.lds_bytes`). On gfx950 the key loop writes
    P (the first product's accumulator, the second's A operand) to LDS 4 elements a lane at once and reads it
    back with transpose reads (`mfma_operands.plan_lds_transpose_read`); gfx942, without them, writes it
    element-wise (`ds_write_b16_d16_hi`)."""
    plan = GPU_PLANS[target][D]
    compiled = compile_forward(target, D, plan, variant)
    assert set(re.findall(r"\bv_mfma_f32_\w+", compiled.stages["amdgcn"])) == {mfma}
    if target == "gfx950":      # the owners' writes may sit out of the loop's line range (an exec-masked block)
        assert "ds_write_b16" not in compiled.stages["amdgcn"] and "ds_write_b64" in compiled.stages["amdgcn"]
    assert_amd_spills_within(compiled.metadata, "forward", target, D)
    assert_lds_ring_without_scratch(compiled, plan.stages)
    assert compiled.metadata["shared_bytes"] <= lds_bytes(target)


def test_gfx950_forward_plans_keep_rings_deeper_than_gfx942_fits():
    """gfx950's 160 KiB of LDS holds a ring one stage deeper than gfx942's 64 KiB at every head dim, with the same
    tiles (so a gfx950 GPU falling back to gfx942's plan would show here as equal stages)."""
    assert lds_bytes("gfx950") > lds_bytes("gfx942")
    for D, plan in GPU_PLANS["gfx942"].items():
        deeper = GPU_PLANS["gfx950"][D]
        assert (deeper.BM, deeper.BN, deeper.num_warps) == (plan.BM, plan.BN, plan.num_warps)
        assert deeper.stages == plan.stages + 1, D


@pytest.mark.parametrize("D", [128, 256])
def test_gfx950s_deeper_forward_ring_would_not_fit_gfx942(D):
    """Why the plans differ: gfx950's two-stage head-dim 128 / 256 forward asks more than gfx942's LDS, and the
    compile says so naming the loop and the stages that fit (`passes/shared_memory.py`)."""
    with pytest.raises(tessera.CompileError, match=r"pipelined loop at line \d+ keeps 2 stages.*stages=1"):
        compile_forward("gfx942", D, GPU_PLANS["gfx950"][D], "plain")


def assert_lds_ring_without_scratch(compiled, stages):
    """A plan of more than one stage fills its K and V rings with direct-to-LDS loads; none uses scratch (SGPR
    spills go to VGPR lanes), and the object links into a loadable code object."""
    assert ("global_load_lds_dword" in compiled.stages["amdgcn"]) == (stages > 1)
    assert compiled.metadata["private_segment_fixed_size"] == 0
    from tessera.backends.amdgpu import CodeObject, find_linker
    if find_linker() is not None:
        assert CodeObject(compiled.binary).elf_type == "ET_DYN"


def forward_on_the_simulator(target, num_warps, BM, causal=True, seed=0, ws=False, window=(-1, -1), softcap=0.0,
                             overlap=False, check_waits=None, pingpong=False, stages=2, Sk=50):
    """The forward kernel lowered for `target` on the SIMT simulator, 2 x 70 queries x 50 keys, 4 query heads on
    2 KV heads: (O, LSE) and the float64 reference's. K and V are the first 50 rows of 64-row tensors whose
    other rows are NaN: a block that read past a sequence's end into them (rather than zeros, or masked lanes)
    would poison O; on sm_90a their blocks come by TMA at per-(batch, head) coordinates. `overlap`: in
    FlashAttention-3's loop order (OVERLAP), `pingpong` with its two consumer warpgroups taking turns
    (PINGPONG); `check_waits(fn)`, when given, must hold of the lowered kernel; `stages` deep K and V rings (and
    `Sk` keys, in 64-row buffers or the next multiple of 64)."""
    from tessera.backends.simt import run_threads
    from tessera.passes.thread_passes import lower
    B, Sq, H, H_kv, D, BN = 2, 70, 4, 2, 32, 32
    left, right = window[0], 0 if causal else window[1]
    q, k, v, k_rows, v_rows = nan_padded_kv(B, Sq, Sk, H, H_kv, D, seed, rows=-(-(Sk + 1) // 64) * 64)
    o, lse = torch.zeros_like(q), torch.zeros(B, H, Sq)
    unused = np.zeros(1, np.int32)
    strides = [s for x in (q, k, v, o) for s in x.stride()]
    args = [q.numpy(), k_rows.numpy(), v_rows.numpy(), o.numpy(), lse.numpy(), unused, unused, Sq, Sk, H, H_kv,
            LOG2E / math.sqrt(D) if not softcap else 1 / (math.sqrt(D) * softcap), softcap,
            max(left, 0), max(right, 0), *strides, *lse.stride()[:2],
            o.numpy(), o.numpy(), 0.0, 0.0, o.numpy(), 0, 0, 0, 0, 0.0,      # the fusion hooks' slots, unused
            lse.numpy(), Sk]                                                 # the fp8 descales (unused), V's length
    options = dict(D=D, BM=BM, BN=BN, HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, SOFTCAP=softcap > 0, VARLEN=False,
                   STAGES=1 if pingpong and target.startswith("gfx") else stages, WS=ws, OVERLAP=overlap,
                   PINGPONG=pingpong)
    module = attention_fwd_kernel.specialize(*args, **options).module
    fn = lower(module, target, num_warps).functions[0]
    assert check_waits is None or check_waits(fn)
    if target.startswith("sm_"):            # warp-specialized: a producer warpgroup beside the num_warps
        assert fn.attrs["num_threads"] == num_warps * 32 + (128 if ws else 0)
    if target.startswith("gfx"):        # both products on MFMA; on gfx950 its double-K form (K = D = BN = 32)
        want = (32, 32, 16) if target == "gfx950" else (32, 32, 8)
        assert {(op.attrs["m"], op.attrs["n"], op.attrs["k"]) for op in fn.walk() if op.name == "mfma"} == {want}
        # gfx950's LDS transpose reads: P, stored column-major (a lane's 4 rows one 8-byte write, not 4 2-byte
        # ones: `mfma_operands.plan_lds_transpose_read`), and V, MN-major in its ring slots or stored so
        assert any(op.name == "lds_read_tr" for op in fn.walk()) == (target == "gfx950")
    tma_loads = [op for op in fn.walk() if op.name == "tma_load"]
    # K and V: the prologue's fill and the loop's (warp-specialized: the producer's loop only); Q's one box
    # (32 x 32, straight into wgmma's tile: `passes/schedule/tma_operand.py`), and with `overlap` so are the
    # blocks outside the ring (the first K, the last V)
    assert len(tma_loads) == ((2 if ws else 4) + (3 if overlap else 1) if target == "sm_90a" else 0)
    # AMD's wave-group ping-pong runs two programs a block: the launch halves axis 0 (as `attention._forward`)
    run_threads(fn, args, (tessera.cdiv(tessera.cdiv(Sq, BM), fn.attrs.get("programs_per_block", 1)), B * H))
    return o, lse, *reference(q, k, v, causal, window, softcap)


def key_loop_waits(fn) -> list[int]:
    """The `pending` of each wgmma_wait in the (consumers') key loop of lowered forward kernel `fn`."""
    loops = [op for op in fn.walk() if op.name == "for" and any(inner.name == "wgmma" for inner in op.walk())]
    return [op.attrs["pending"] for op in loops[-1].regions[0].ops if op.name == "wgmma_wait"]


@pytest.mark.parametrize("target, num_warps, BM", [("sm_80", 4, 64), ("sm_90a", 4, 64), ("gfx942", 2, 64),
                                                  ("gfx950", 2, 64)])
def test_forward_on_the_simt_simulator_matches_float64_attention(target, num_warps, BM):
    """Two row blocks (the second partly past the end); causal with Sq > Sk, so the first 20 rows see no key
    (O = 0, LSE = +inf); the diagonal blocks and the keys' tail masked; two query heads per key head."""
    o, lse, expected_o, expected_lse = forward_on_the_simulator(target, num_warps, BM)
    torch.testing.assert_close(o.double(), expected_o, rtol=2e-3, atol=2e-3)
    assert torch.isinf(lse[:, :, :20]).all()
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stages", sorted({plan.stages for plan in GPU_PLANS["gfx950"].values()}))
def test_forward_with_gfx950s_ring_depths_on_the_simt_simulator_matches_float64_attention(stages):
    """gfx950's plans' K and V rings (2 and 3 stages of direct-to-LDS loads) over 150 keys (5 blocks: the ring
    wraps), on the simulator lowered for gfx950 (its double-K MFMA and 16-byte LDS loads)."""
    o, lse, expected_o, expected_lse = forward_on_the_simulator("gfx950", 2, 64, stages=stages, Sk=150)
    torch.testing.assert_close(o.double(), expected_o, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("num_warps, BM", [(4, 64), (8, 128)])
def test_warp_specialized_forward_on_the_simt_simulator_matches_float64_attention(num_warps, BM):
    """The same problem with the key loop warp-specialized (sm_90a): one consumer warpgroup (the budget at
    entry suffices, no setmaxnreg), and two as the shipped plans have (setmaxnreg dec / inc); the simulator
    runs the producer and consumers cooperatively and checks every mbarrier wait and shared-memory race."""
    o, lse, expected_o, expected_lse = forward_on_the_simulator("sm_90a", num_warps, BM, ws=True)
    torch.testing.assert_close(o.double(), expected_o, rtol=2e-3, atol=2e-3)
    assert torch.isinf(lse[:, :, :20]).all()
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-4, atol=1e-4)


def test_warp_specialized_forward_with_a_window_and_softcap_on_the_simt_simulator():
    """Not causal: a (20, 5) window around the bottom-right diagonal (rows before key 0's reach see nothing) and
    logits softcapped at 5, warp-specialized with two consumer warpgroups."""
    o, lse, expected_o, expected_lse = forward_on_the_simulator("sm_90a", 8, 128, causal=False, ws=True,
                                                                window=(20, 5), softcap=5.0)
    torch.testing.assert_close(o.double(), expected_o, rtol=2e-3, atol=2e-3)
    finite = ~torch.isinf(expected_lse)
    assert torch.equal(torch.isinf(lse), ~finite) and (~finite).any()
    torch.testing.assert_close(lse.double()[finite], expected_lse[finite], rtol=1e-4, atol=1e-4)



@pytest.mark.parametrize("causal", [False, True])
def test_the_shipped_hopper_plan_on_the_simt_simulator_at_the_gpu_tests_shape(causal):
    """The sm_90a plan for head dim 64 as a GPU launch compiles it (tile passes, not strict: BM = 128 on two
    warpgroups, BN = 64, K and V by 4-D TMA, P from registers), on the SIMT simulator over
    test_attention_on_gpu.py's lengths: 200 queries (a partial second row block), 333 keys (a last block of 13),
    GQA 2:1, bf16."""
    import ml_dtypes

    from tessera.backends.simt import run_threads
    from tessera.ir.core import Module
    from tessera.passes.manager import PassManager
    from tessera.passes.rewrite import clone_function
    from tessera.passes.thread_passes import lower
    from tessera.passes.tile_passes import default_tile_passes
    plan, (B, Sq, Sk, H, H_kv, D) = GPU_PLANS["nvidia"][64], (1, 200, 333, 4, 2, 64)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(*shape, generator=g).bfloat16() for shape in ((B, Sq, H, D), (B, Sk, H_kv, D),
                                                                        (B, Sk, H_kv, D)))
    o, lse = torch.zeros_like(q), torch.zeros(B, H, Sq)
    bf16 = lambda x: x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)    # noqa: E731
    unused = np.zeros(1, np.int32)
    args = [bf16(q), bf16(k), bf16(v), bf16(o), lse.numpy(), unused, unused, Sq, Sk, H, H_kv, LOG2E / math.sqrt(D),
            0.0, 0, 0, *[s for x in (q, k, v, o) for s in x.stride()], *lse.stride()[:2],
            bf16(o), bf16(o), 0.0, 0.0, bf16(o), 0, 0, 0, 0, 0.0, lse.numpy(), Sk]
    traced = attention_fwd_kernel.specialize(*args, D=D, BM=plan.BM, BN=plan.BN, HAS_LEFT=False, HAS_RIGHT=causal,
                                             SOFTCAP=False, VARLEN=False, STAGES=plan.stages, WS=False).module
    module = PassManager(default_tile_passes()).run(Module([clone_function(f) for f in traced.functions]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PipelineWarning)         # the plan gets all it asks for
        fn = lower(module, "sm_90a", plan.num_warps).functions[0]
    # K and V (prologue and loop) and Q (one 128 x 64 box into wgmma's tile) by TMA; O by one TMA store
    assert fn.attrs["num_threads"] == 256 and len([op for op in fn.walk() if op.name == "tma_load"]) == 5
    assert len([op for op in fn.walk() if op.name == "tma_store"]) == 1
    bits = [a.view(np.uint16) if getattr(a, "dtype", None) == np.dtype(ml_dtypes.bfloat16) else a for a in args]
    run_threads(fn, bits, (tessera.cdiv(Sq, plan.BM), B * H))
    expected_o, expected_lse = reference(q, k, v, causal)
    torch.testing.assert_close(o.double(), expected_o, rtol=5e-3, atol=5e-3)      # P rounded to bf16
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-4, atol=1e-4)


# -- the backward ----------------------------------------------------------------------

# q, k, v, dO, lse, delta, dQ, dK, dV, cu_q, cu_k, Sq, Sk, H, H_KV, qk_scale, softcap, scale, left, right,
# 4 x (b, s, h, d) strides of q, k, v, dO, 3 of dQ, 3 of dK/dV, 2 of the LSE
KV_SIGNATURE = ",".join(["*{t}:16"] * 4 + ["*f32:16"] * 3 + ["*{t}:16"] * 2 + ["*i32:16"] * 2 + ["i32"] * 4
                        + ["f32"] * 3 + ["i32"] * 2 + ["i32:16", "i32:16", "i32:16", "i32:1"] * 4
                        + ["i32:16"] * 6 + ["i32", "i32"])
Q_SIGNATURE = KV_SIGNATURE.replace("*f32:16,*f32:16,*f32:16,*{t}:16,*{t}:16", "*f32:16,*f32:16,*{t}:16", 1) \
    .replace("i32:16,i32:16,i32:16,i32:16,i32:16,i32:16,i32,i32", "i32:16,i32:16,i32:16,i32,i32")
AMD_TARGETS = ("gfx942", "gfx950")
MFMA = {"gfx942": ("32x32x8", "16x16x16"), "gfx950": ("32x32x16", "16x16x32", "32x32x8", "16x16x16")}


def backward_kernels(arch):
    """(name, kernel, signature, plan, extra constexprs) of every backward kernel a plan of `arch` launches."""
    from tessera.kernels_lib.attention import BWD_GPU_PLANS
    from tessera.kernels_lib.attention_bwd import attention_bwd_kv_kernel, attention_bwd_q_kernel
    for D, plan in BWD_GPU_PLANS[arch].items():
        modes = [True, False] if plan.atomic_dq else [False]      # dK/dV adding dQ itself, or the dQ pass
        for atomic in modes:
            yield (f"{arch}-{D}-kv-{'atomic' if atomic else 'plain'}", attention_bwd_kv_kernel, KV_SIGNATURE,
                   D, plan.kv, {"ATOMIC_DQ": atomic, "TRANSPOSED": plan.transposed})
        yield f"{arch}-{D}-q", attention_bwd_q_kernel, Q_SIGNATURE, D, plan.q, {}


BACKWARD_KERNELS = {case[0]: case for arch in ("sm_80", "sm_90a", *AMD_TARGETS) for case in backward_kernels(arch)}
BACKWARD_CASES = [(name, name.split("-")[0]) for name in BACKWARD_KERNELS]     # each plan on its own target


@pytest.mark.parametrize("name, target", BACKWARD_CASES)
def test_every_backward_plan_compiles_without_spills(name, target):
    _, kernel, signature, D, plan, extra = BACKWARD_KERNELS[name]
    if target.startswith("sm") and find_ptxas() is None:
        pytest.skip("ptxas not installed")
    variants = ["window-softcap-varlen"] if target.startswith("gfx") else list(VARIANTS)
    for variant in variants:
        compiled = compile_checked(kernel, target, signature=signature.format(t="bf16"), num_warps=plan.num_warps,
                                     D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages, **extra, **VARIANTS[variant])
        metadata = compiled.metadata
        if target.startswith("gfx"):
            assert_amd_spills_within(metadata, name, target)
            assert set(re.findall(r"\bv_mfma_f32_(\d+x\d+x\d+)", compiled.stages["amdgcn"])) <= set(MFMA[target])
        else:
            assert metadata["spill_stores"] == metadata["spill_loads"] == 0, f"{variant}: {metadata['registers']}"
            assert streams_by_tma(compiled.stages["ptx"]) == (target == "sm_90a" and variant == "plain"), variant
            if target == "sm_90a":
                assert_wgmma_descriptors_built(compiled)


def backward_on_the_simulator(target, num_warps, seed=0, D=32, transposed=False, overlap=False, check_waits=None):
    """The dK/dV kernel (adding dQ by atomics; `transposed`: accumulating dK^T and dV^T, head dim 256's plan) and
    the dQ pass lowered for `target` on the SIMT simulator, 1 x 40 queries x 50 keys, GQA 2:1, causal: their (dQ
    by atomics, dQ by the pass, dK, dV), and the float64 reference's (dQ, dK, dV). `overlap`: both kernels in
    their OVERLAP order; `check_waits(kernel_name, fn)`, when given, must hold of each lowered kernel."""
    from tessera.backends.simt import run_threads
    from tessera.kernels_lib.attention_bwd import attention_bwd_kv_kernel, attention_bwd_q_kernel
    from tessera.passes.thread_passes import lower
    B, Sq, Sk, H, H_kv = 1, 40, 50, 2, 1
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, S, h, D, generator=g).half() for S, h in ((Sq, H), (Sk, H_kv), (Sk, H_kv)))
    grad_out = torch.randn(B, Sq, H, D, generator=g).half()
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    out, lse = reference(*leaves, True)
    (out * grad_out.double()).sum().backward()
    delta = (out.detach() * grad_out.double()).sum(-1).transpose(1, 2).float().contiguous()
    lse = lse.detach().float().contiguous()
    dq_atomic, dq, dk, dv = torch.zeros(q.shape), torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    unused = np.zeros(1, np.int32)
    scale = 1 / math.sqrt(D)
    head = [x.numpy() for x in (q, k, v, grad_out, lse, delta)]
    scalars = [unused, unused, Sq, Sk, H, H_kv, scale * LOG2E, 0.0, scale, 0, 0]
    strides = [s for x in (q, k, v, grad_out) for s in x.stride()]
    masks = dict(D=D, HAS_LEFT=False, HAS_RIGHT=True, SOFTCAP=False, VARLEN=False, STAGES=2)
    kv_args = [*head, dq_atomic.numpy(), dk.numpy(), dv.numpy(), *scalars, *strides, *dq_atomic.stride()[:3],
               *dk.stride()[:3], *lse.stride()[:2]]
    BN = 32 * num_warps if target.startswith("gfx") else 16 * num_warps
    module = attention_bwd_kv_kernel.specialize(*kv_args, BM=16, BN=BN, ATOMIC_DQ=True, TRANSPOSED=transposed,
                                                OVERLAP=overlap, **masks).module
    fn = lower(module, target, num_warps).functions[0]
    assert check_waits is None or check_waits("kv", fn)
    run_threads(fn, kv_args, (tessera.cdiv(Sk, BN), B * H_kv))
    q_args = [*head, dq.numpy(), *scalars, *strides, *dq.stride()[:3], *lse.stride()[:2]]
    module = attention_bwd_q_kernel.specialize(*q_args, BM=BN, BN=32, OVERLAP=overlap, **masks).module
    fn = lower(module, target, num_warps).functions[0]
    assert check_waits is None or check_waits("q", fn)
    run_threads(fn, q_args, (tessera.cdiv(Sq, BN), B * H))
    return (dq_atomic * scale, dq, dk, dv), [x.grad for x in leaves]


@pytest.mark.parametrize("target, num_warps, D, transposed", [
    ("sm_80", 4, 32, False), ("sm_90a", 4, 32, False), ("gfx942", 2, 32, False), ("gfx950", 2, 32, False),
    ("sm_90a", 4, 64, True)])       # dK^T, dV^T: 64 x BN on wgmma (head dim 256's plan, at a simulable size)
def test_backward_on_the_simt_simulator_matches_float64_gradients(target, num_warps, D, transposed):
    (dq_atomic, dq, dk, dv), (expected_dq, expected_dk, expected_dv) = backward_on_the_simulator(
        target, num_warps, D=D, transposed=transposed)
    for got, expected in ((dq_atomic, expected_dq), (dq, expected_dq), (dk, expected_dk), (dv, expected_dv)):
        torch.testing.assert_close(got.double(), expected, rtol=4e-3, atol=4e-3)


# -- decode ----------------------------------------------------------------------------

# q, k_cache, v_cache, block_table, cache_seqlens, o, lse (the partials), out, out_lse (the final ones), the
# merge's counters, Sq, H, H_KV, P, qk_scale, softcap, unified_max, below, above, left, right, splits, 3 x (4)
# strides of q and the caches, the table's, 4 of o (split, b, s, h), 3 of lse (split, b, h: the head's is Sq, 1
# when decoding one token), 3 of out (b, s, h) and 2 of out_lse (b, h)
DECODE_SIGNATURE = ",".join(["*bf16:16"] * 3 + ["*i32:16", "*i32:16", "*f32:16", "*f32:16", "*bf16:16", "*f32:16",
                                                "*i32:16"] + ["i32"] * 4
                            + ["f32"] * 5 + ["i32"] * 3 + ["i32:16", "i32:16", "i32:16", "i32:1"] * 3
                            + ["i32"] + ["i32:16"] * 4 + ["i32"] * 3 + ["i32:16"] * 3 + ["i32"] * 2)
MOST_SPLITS = 64    # attention_decode.MAX_SPLITS: the merge's widest reference-max tile


def decode_tiles(vendor):
    """(softmax, D, rows, keys, stages, num_warps) of each of `vendor`'s plans ("nvidia" or an AMD target) at every
    row count it launches (16 .. its rows: with a warp per 16 rows each is another warp count) and its widest and
    narrowest blocks (16 keys: pages of 16 tokens)."""
    from tessera.kernels_lib.attention_decode import DECODE_PLANS, UNIFIED_DECODE_PLANS, gpu_decode_plan
    for softmax, plans in (("online", DECODE_PLANS), ("unified", UNIFIED_DECODE_PLANS)):
        for D in plans:
            plan = gpu_decode_plan(D, softmax == "unified", vendor)
            rows = [16 << i for i in range(plan.rows.bit_length()) if 16 << i <= plan.rows]
            for r, keys in sorted({(r, k) for r in rows for k in (plan.keys, 16)}):
                yield softmax, D, r, keys, plan.stages, plan.num_warps(r)


def merge_options(D, rows, num_warps, packed=None, splits=MOST_SPLITS, unified=False):
    """The split launch's merge constexprs for a program of `rows` packed rows of which `packed` exist (all of
    them unless told), at `splits` splits: as the op picks them."""
    from tessera.kernels_lib.attention_decode import (DECODE_PLANS, UNIFIED_DECODE_PLANS, DecodeShape,
                                                      merge_chunk, merge_rows)
    from tessera.kernels_lib.attention_decode_model import MERGE_MOST
    plan = (UNIFIED_DECODE_PLANS if unified else DECODE_PLANS)[D]
    shape = DecodeShape(1, 1, packed or rows, 1, D, 64, 64)
    if rows > plan.in_launch_rows:          # the op merges this tile's splits in the combine kernel
        return dict(COMBINE=False)
    return dict(COMBINE=True, MR=merge_rows(shape, rows), SPLITS=splits,
                CHUNK=merge_chunk(shape, rows, num_warps, splits, plan.merge_registers, MERGE_MOST),
                EARLY=plan.merge_early)


def compile_decode(target, softmax, D, rows, keys, stages, num_warps, packed=None):
    """The split kernel with every option compiled in (the most registers), its merge included (the widest
    merge tile unless `packed` says how many of the rows exist)."""
    from tessera.kernels_lib.attention_split_kv import attention_decode_kernel
    return compile_checked(
        attention_decode_kernel, target, signature=DECODE_SIGNATURE, num_warps=num_warps, D=D, BM=rows, BN=keys,
        STAGES=stages, SPLIT=True, HAS_LEFT=True, HAS_RIGHT=True, SOFTCAP=True, UNIFIED=softmax == "unified",
        FALLBACK=True, **merge_options(D, rows, num_warps, packed, unified=softmax == "unified"))


@needs_ptxas
@pytest.mark.parametrize("softmax, D, rows, keys, stages, num_warps", list(decode_tiles("nvidia")))
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_every_decode_plan_compiles_pipelined_without_spills(target, softmax, D, rows, keys, stages, num_warps):
    """The K and V blocks stream through cp.async rings although their pages come from the block table. The
    registers are printed (-s shows them): a one-warp program has the whole tile to itself, so ptxas takes up
    to 255."""
    compiled = compile_decode(target, softmax, D, rows, keys, stages, num_warps)
    metadata = compiled.metadata
    print(f"{target} {softmax} D={D} {rows}x{keys} stages={stages} warps={num_warps}: "
          f"{metadata['registers']} registers")
    assert metadata["spill_stores"] == metadata["spill_loads"] == 0, metadata["registers"]
    assert "cp.async.cg.shared.global" in compiled.stages["ptx"]


def sixteen_row_tiles():
    """(softmax, D, keys, stages, num_warps) of each NVIDIA plan's 16-row tile: the one every group of up to 16
    packed rows launches, whose merge tile is the rows that exist (1 .. 16)."""
    from tessera.kernels_lib.attention_decode import gpu_decode_plan
    for softmax, D, rows, keys, stages, num_warps in decode_tiles("nvidia"):
        if rows == 16 and gpu_decode_plan(D, softmax == "unified", "nvidia").in_launch_rows >= 16:
            yield softmax, D, keys, stages, num_warps


@needs_ptxas
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("packed", [1, 4])
@pytest.mark.parametrize("softmax, D, keys, stages, num_warps", list(sixteen_row_tiles()))
def test_every_sixteen_row_tile_merges_few_rows_without_spills(target, packed, softmax, D, keys, stages, num_warps):
    """A 16-row tile where only 1 or 4 packed rows exist (MQA, or GQA 4:1 at one token: the benchmark's shape):
    its merge takes the most splits a step, the most loads in flight."""
    compiled = compile_decode(target, softmax, D, 16, keys, stages, num_warps, packed)
    assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0, compiled.metadata


@needs_ptxas
@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_the_split_launch_hands_its_partials_over_with_release_and_acquire(target):
    """The merge's hand-off in PTX: every thread's partial stores, a barrier, a GPU-scope acq_rel fence, one
    thread's atomic add on the counter, a fence again, then (through shared memory and a barrier) the merge's
    loads, and the counter's reset after them. (The SIMT simulator runs programs one at a time, so it cannot
    see a missing fence: this is the check.)"""
    import re
    ptx = compile_decode(target, "online", 128, 16, 16, 2, 1, packed=4).stages["ptx"]
    atomics = re.findall(r"atom\.[\w.]+", ptx)
    assert atomics == ["atom.global.add.u32"], atomics
    before, after = ptx.split("atom.global.add.u32")
    assert re.search(r"bar\.sync\s+0;\s+fence\.acq_rel\.gpu;", before[-600:]), before[-600:]
    assert "fence.acq_rel.gpu" in after[:200] and "st.global" not in before[before.rindex("bar.sync"):]
    assert "ld.global" in after and "st.global.b32" in after     # the merge reads, then the reset


# o_part, lse_part, out, out_lse, Sq, H, H_KV, splits, o_part's (split, b, h) strides, lse_part's (split, b, h),
# out's (b, s, h), out_lse's (b, h)
COMBINE_SIGNATURE = ",".join(["*f32:16", "*f32:16", "*bf16:16", "*f32:16"] + ["i32"] * 4 + ["i32:16"] * 5 + ["i32"]
                             + ["i32:16"] * 3 + ["i32"] * 2)


@needs_ptxas
@pytest.mark.parametrize("splits", [2, 64])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_the_combine_compiles_without_spills_up_to_the_most_splits(target, D, splits):
    """The two-launch path's combine kernel at every head dim and up to MAX_SPLITS parts (the model may ask for
    them all), with the op's step of splits."""
    from tessera.kernels_lib.attention_decode import (COMBINE_REGISTERS, COMBINE_WARPS, MAX_SPLITS, DecodeShape,
                                                      merge_chunk)
    from tessera.kernels_lib.attention_split_kv import attention_decode_combine_kernel
    assert splits <= MAX_SPLITS
    chunk = merge_chunk(DecodeShape(1, 1, 4, 1, D, 64, 64), 1, COMBINE_WARPS, splits, COMBINE_REGISTERS)
    compiled = attention_decode_combine_kernel.compile(target=target, strict=True, signature=COMBINE_SIGNATURE,
                                                       num_warps=COMBINE_WARPS, D=D, MR=1, SPLITS=splits,
                                                       CHUNK=chunk)
    assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0


@pytest.mark.parametrize("target, softmax, D, rows, keys, stages, num_warps",
                         [(target, *tile) for target in AMD_TARGETS for tile in decode_tiles(target)])
def test_every_decode_plan_compiles_for_amd_without_spills(target, softmax, D, rows, keys, stages,
                                                                  num_warps):
    """Every tile of each AMD target's own decode plans (`AMD_DECODE_STAGES[target]`), within its LDS."""
    compiled = compile_decode(target, softmax, D, rows, keys, stages, num_warps)
    shapes = set(re.findall(r"\bv_mfma_f32_(\d+x\d+x\d+)_bf16", compiled.stages["amdgcn"]))
    assert shapes and shapes <= set(MFMA[target])
    if target == "gfx950":
        assert shapes & {"32x32x16", "16x16x32"}, "gfx950's double-K forms where K allows"
    assert amd_spills(compiled.metadata) == {}
    assert_lds_ring_without_scratch(compiled, stages)
    assert compiled.metadata["shared_bytes"] <= lds_bytes(target)


def decode_on_the_simulator(target, num_warps, unified_max=None, D=32, page=16, seqlens=(37, 9), keys=None,
                            stages=2, combine_in_launch=True, splits=3, early=True, edit=None):
    """attention_decode lowered for `target` on the SIMT simulator (3 splits, GQA 4:1 packed, 2 new queries,
    pages of 16, sequences of 37 and 9 tokens, unless told): the split kernel merging in its own launch (its
    last program per row group), or the split kernel and then the combine kernel; (O, LSE), the float64
    reference's, and the counters after the launch. Blocks are one page (BN = page) unless `keys` says; `edit`
    changes the split kernel's tile IR before it is lowered."""
    from tessera.backends.simt import run_threads
    from tessera.kernels_lib.attention_decode import COMBINE_WARPS, DecodeShape, merge_chunk
    from tessera.kernels_lib.attention_split_kv import attention_decode_combine_kernel, attention_decode_kernel
    from tessera.passes.thread_passes import lower
    from test_attention_decode import expected, paged_case
    q, k_cache, v_cache, table, seqlens = tensors = paged_case(list(seqlens), Sq=2, H=4, H_kv=1, D=D, page=page)
    (B, Sq, H, D), packed = q.shape, 8
    o_part, lse_part = torch.zeros(splits, B, H, Sq, D), torch.zeros(splits, B, H, Sq)   # packed-row-major
    o, lse, counters = torch.zeros_like(q), torch.zeros(B, H, Sq), torch.zeros(B, dtype=torch.int32)
    o_strides = (o_part.stride(0), o_part.stride(1), o_part.stride(3), o_part.stride(2))
    args = [x.numpy() for x in (q, k_cache, v_cache, table, seqlens, o_part, lse_part, o, lse, counters)]
    args += [Sq, H, 1, page, LOG2E / math.sqrt(D), 0.0, (unified_max or 0.0) * LOG2E, 8.0, 15.0, 0, 0, splits,
             *q.stride(), *k_cache.stride(), *v_cache.stride(), table.stride(0), *o_strides, *lse_part.stride()[:3],
             *o.stride()[:3], *lse.stride()[:2]]
    shape = DecodeShape(B, Sq, H, 1, D, page, table.shape[1])
    options = dict(D=D, BM=16, BN=keys or page, STAGES=stages, SPLIT=True, HAS_LEFT=False, HAS_RIGHT=True,
                   SOFTCAP=False, UNIFIED=unified_max is not None, FALLBACK=True, COMBINE=combine_in_launch, MR=packed,
                   SPLITS=4, CHUNK=2, EARLY=early)    # 2 steps of 2 splits, the last one's second past the splits
    module = attention_decode_kernel.specialize(*args, **options).module
    if edit is not None:
        edit(module.functions[0])
    run_threads(lower(module, target, num_warps).functions[0], args, (splits, B, 1))
    if not combine_in_launch:
        args = [o_part.numpy(), lse_part.numpy(), o.numpy(), lse.numpy(), Sq, H, 1, splits, o_strides[0],
                o_strides[1], o_strides[3], *lse_part.stride()[:3], *o.stride()[:3], *lse.stride()[:2]]
        chunk = merge_chunk(shape, 1, COMBINE_WARPS, splits, 8)          # 8 registers: steps of 4 splits
        module = attention_decode_combine_kernel.specialize(*args, D=D, MR=1, SPLITS=4, CHUNK=chunk).module
        run_threads(lower(module, target, COMBINE_WARPS).functions[0], args, (packed, B))
    return o, lse, *expected(*tensors), counters


@pytest.mark.parametrize("unified_max", [None, 2.0, -30.0], ids=["online", "unified", "unified-falls-back"])
@pytest.mark.parametrize("target, num_warps", [("sm_80", 1), ("sm_90a", 1), ("sm_80", 4), ("sm_90a", 4),
                                               ("gfx942", 2), ("gfx950", 2)])
def test_decode_on_the_simt_simulator_matches_float64_attention(target, num_warps, unified_max):
    """One warp per 16 packed rows (the shipped plans: a program of its own keys) and 4 warps over one 16-row
    tile (the plans that keep them: warps repeating the products)."""
    o, lse, expected_o, expected_lse, counters = decode_on_the_simulator(target, num_warps, unified_max)
    torch.testing.assert_close(o.double(), expected_o, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-4, atol=1e-4)
    assert counters.tolist() == [0, 0]          # the merging programs reset them for the next launch


@pytest.mark.parametrize("target, num_warps, early", [("sm_80", 1, True), ("sm_80", 1, False), ("sm_90a", 1, True),
                                                      ("gfx942", 2, True)])
def test_the_split_launchs_merge_is_the_combine_kernels_bit_for_bit_on_the_simt_simulator(target, num_warps, early):
    """The merge in the split launch (one warp, 8 packed rows, 2 splits a step, the first step's loads with the
    max's or after it) and the combine kernel (4 warps, one row a program, 4 splits a step) lowered for the
    target: the same bits, although their tiles, layouts and steps differ (the splits are added one by one, in
    split order, either way)."""
    fused = decode_on_the_simulator(target, num_warps, combine_in_launch=True, early=early)
    separate = decode_on_the_simulator(target, num_warps, combine_in_launch=False)
    assert torch.equal(fused[0], separate[0]) and torch.equal(fused[1], separate[1])
    assert fused[4].tolist() == [0, 0]



def test_the_merge_counter_at_cta_scope_is_a_scope_race_on_the_simt_simulator():
    """The hand-off works between programs because the counter's atomic is at GPU scope (acquire-release,
    every program of the launch): the same split kernel with that atomic narrowed to scope "cta" (its IR
    edited after tracing) is a race the simulator names, since a CTA-scope release does not reach the
    program that acquires. (A missing fence, a plain access, is not modelled: the PTX test above checks the
    fences.)"""
    from tessera.backends.interp.errors import InterpreterError

    def narrow(fn):
        atomics = [op for op in fn.walk() if op.name == "atomic_rmw"]
        assert len(atomics) == 1
        atomics[0].attrs["scope"] = "cta"
    with pytest.raises(InterpreterError, match=r"scope race: this atomic_rmw \(scope 'cta'\)"):
        decode_on_the_simulator("sm_80", 1, edit=narrow)


@pytest.mark.parametrize("softmax", ["online", "unified"])
def test_decode_at_head_dim_128_on_the_simt_simulator_matches_float64_attention(softmax):
    """The shipped head-dim-128 tile of each softmax (its keys, stages and warps) over pages of 64 tokens: the
    ring's 256-byte K and V rows under the row-keyed swizzle (cp.async writes, ldmatrix reads) on the
    simulator, which also checks shared-memory races; sequences not a multiple of the block."""
    from tessera.kernels_lib.attention_decode import gpu_decode_plan
    plan = gpu_decode_plan(128, softmax == "unified", "nvidia")
    o, lse, expected_o, expected_lse, _ = decode_on_the_simulator(
        "sm_90a", plan.num_warps(16), 2.0 if softmax == "unified" else None, D=128, page=64, seqlens=(150, 70),
        keys=plan.keys, stages=plan.stages)
    torch.testing.assert_close(o.double(), expected_o, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", AMD_TARGETS)
@pytest.mark.parametrize("softmax", ["online", "unified"])
def test_amds_shipped_head_dim_128_decode_tile_on_the_simulator_matches_float64_attention(softmax, target):
    """The same on AMD with the target's tile and K and V rings filled by direct-to-LDS loads (the simulator
    checks each wave's lanes fill consecutive LDS chunks, and the ring's waits and barriers): on gfx950 its own
    ring depth (`AMD_DECODE_STAGES["gfx950"]`); on gfx942 2 stages, which the unified softmax ships, while the
    online one keeps one there (two spill SGPRs), so its deeper ring is checked here for when a GPU run picks it."""
    from tessera.kernels_lib.attention_decode import AMD_DECODE_STAGES, gpu_decode_plan
    plan = gpu_decode_plan(128, softmax == "unified", target)
    assert plan.stages == AMD_DECODE_STAGES[target][softmax == "unified", 128]
    o, lse, expected_o, expected_lse, _ = decode_on_the_simulator(
        target, plan.num_warps(16), 2.0 if softmax == "unified" else None, D=128, page=64, seqlens=(150, 70),
        keys=plan.keys, stages=plan.stages if target == "gfx950" else 2)
    torch.testing.assert_close(o.double(), expected_o, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("softmax", ["online", "unified"])
def test_the_decode_ring_reads_k_and_v_without_bank_conflicts(monkeypatch, softmax):
    """Every ldmatrix buffer of the shipped head-dim-128 tile of each softmax (16 packed rows, its keys, warps
    and stages, pages of 64, sm_90a) is laid out so that its row reads are conflict-free: the 64 x 128 bf16
    K and V blocks (256-byte rows) read 8-way conflicted when they were plain row-major, which made the loop
    shared-memory bound (about 9 us a block on an H100, against 2.6 us of HBM time)."""
    from tessera.kernels_lib.attention_decode import gpu_decode_plan
    from tessera.kernels_lib.attention_split_kv import attention_decode_kernel
    from tessera.passes.lowering import mma_operands
    from tessera.passes.thread_passes import lower
    chosen, choose = [], mma_operands.swizzled_row_major

    def recording(rows, cols, starts, element_bytes=2, row_keyed=False):
        layout = choose(rows, cols, starts, element_bytes, row_keyed)
        chosen.append(((rows, cols), mma_operands.row_conflicts(layout, starts, element_bytes)))
        return layout
    monkeypatch.setattr(mma_operands, "swizzled_row_major", recording)
    D, page, splits = 128, 64, 2
    q, k_cache = np.zeros((1, 1, 4, D), np.float16), np.zeros((4, page, 1, D), np.float16)
    args = [q, k_cache, k_cache, np.zeros((1, 4), np.int32), np.zeros(1, np.int32),
            np.zeros((splits, 1, 4, 1, D), np.float32), np.zeros((splits, 1, 4, 1), np.float32), q.copy(),
            np.zeros((1, 4, 1), np.float32), np.zeros(1, np.int32),
            1, 4, 1, page, 0.1, 0.0, 0.0, 64.0, 64.0, 0, 0, splits, 4 * D, 4 * D, D, 1, page * D, D, D, 1,
            page * D, D, D, 1, 4, 4 * D, 4 * D, D, D, 4, 4, 1, 4 * D, 4 * D, D, 4, 1]
    plan = gpu_decode_plan(D, softmax == "unified", "nvidia")
    module = attention_decode_kernel.specialize(*args, D=D, BM=16, BN=plan.keys, STAGES=plan.stages, SPLIT=True,
                                                HAS_LEFT=False, HAS_RIGHT=True, SOFTCAP=False,
                                                UNIFIED=softmax == "unified", FALLBACK=True).module
    lower(module, "sm_90a", plan.num_warps(16))
    assert ((plan.keys, D), 1) in chosen and all(conflicts == 1 for _, conflicts in chosen), chosen
