"""The split-K paths of tessera::gemm (tessera/kernels_lib/gemm_split_k.py), small M (decode) and few tiles:
results on the interpreter and the SIMT simulator against numpy, the op choosing them (M <= 64; larger M with
fewer tiles than SMs), the models' split counts, and every shipped tile compiling on every target without
spills."""

import re
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera.kernels_lib import gemm_configs, gemm_split_k  # noqa: E402
from tessera.kernels_lib.gemm import ATOMIC_SPLIT_K_ENV, _split_k_plan, gemm  # noqa: E402
from tessera.kernels_lib.gemm_split_k import (SMALL_M, few_tiles_plan, few_tiles_split_count,  # noqa: E402
                                             gemm_split_k_kernel, gemm_split_k_reduce_kernel, small_m_plan,
                                             split_count)

from amd_spills import amd_spills  # noqa: E402
from test_gemm import check, operands, reference  # noqa: E402


@pytest.fixture
def launches(monkeypatch):
    """The split-K plans the op ran, in order (the paths' `launch`, recorded)."""
    plans = []
    real = gemm_split_k.launch

    def recording(*args, **kwargs):
        plans.append(real(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(gemm_split_k, "launch", recording)
    return plans


@pytest.fixture(autouse=True)
def fresh_plans():
    """The op keeps its split-K plan per shape; each test plans afresh, under its own patches."""
    _split_k_plan.cache_clear()
    yield
    _split_k_plan.cache_clear()


def force_splits(monkeypatch, splits):
    """Make the op split K `splits` ways (the model would not split the interpreter's tiny K)."""
    monkeypatch.setattr(gemm_split_k, "split_count", lambda *args: splits)


# --- results on the interpreter ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("M,N,K", [(1, 33, 75), (16, 47, 130), (64, 21, 97), (7, 16, 48), (33, 50, 33)])
@pytest.mark.parametrize("splits", [1, 3])
def test_matches_numpy_for_odd_shapes(M, N, K, splits, dtype, monkeypatch, launches):
    force_splits(monkeypatch, splits)
    a, b = operands(M, N, K, dtype, seed=M)
    out = gemm(a, b)
    check(out, reference(a, b, out_dtype=dtype))
    (ran,) = launches
    k_steps = tessera.cdiv(K, ran.BK)
    assert ran.split_k == splits        # (each of these K has a whole step for each of 3 splits)
    assert (ran.split_k - 1) * ran.steps < k_steps <= ran.split_k * ran.steps     # every split has K to do


@pytest.mark.parametrize("atomic", [False, True], ids=["deterministic", "atomic"])
@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (True, False)])
def test_split_partials_meet_the_epilogue_once(atomic, trans_a, trans_b, monkeypatch, launches):
    """Bias, activation, alpha and the output cast apply once, to the summed splits (deterministic workspace
    or atomics), with either operand transposed."""
    force_splits(monkeypatch, 4)
    if atomic:
        monkeypatch.setenv(ATOMIC_SPLIT_K_ENV, "1")
    a, b = operands(5, 37, 111, torch.float16, trans_a, trans_b, seed=7)
    bias = torch.randn(37)
    out = gemm(a, b, bias=bias, activation="gelu", alpha=-0.5, trans_a=trans_a, trans_b=trans_b,
               out_dtype=torch.float32)
    check(out, reference(a, b, bias, "gelu", torch.float32, trans_a, trans_b, alpha=-0.5))
    assert launches[0].split_k == 4


def test_fp8_scales_on_the_split_path(monkeypatch, launches):
    force_splits(monkeypatch, 2)
    a = (torch.randn(3, 64) / 4).to(torch.float8_e4m3fn)
    b = (torch.randn(64, 24) / 4).to(torch.float8_e4m3fn)
    scale_a, scale_b = torch.rand(3) + 0.5, torch.tensor(2.0)
    out = gemm(a, b, None, scale_a, scale_b, out_dtype=torch.float32)
    expected = (a.float() @ b.float()) * scale_a[:, None] * scale_b
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert launches[0].split_k == 2


# --- the op picks the path -----------------------------------------------------------------------------------

@pytest.mark.parametrize("M", [1, 16, 64])
def test_the_op_takes_the_small_m_path_for_m_up_to_64(M, launches):
    a, b = operands(M, 20, 512, torch.float32, seed=M)
    check(gemm(a, b), reference(a, b))
    (ran,) = launches
    assert ran.BM == gemm_split_k.row_tile(M) >= M
    # the model on the interpreter's "4 SMs": 2 strips of 16 columns want 2 splits, and B's 512 x 4 bytes per
    # column leave room for the partials' traffic of a 16-row tile (not of a 64-row one)
    assert ran.split_k == (2 if ran.BM == 16 else 1)


def test_the_op_takes_the_tiled_kernel_above_64_where_splitting_k_does_not_pay(launches):
    """65 rows: two row tiles of the interpreter's 64 x 32 split tile on its 4 "SMs" would allow two splits,
    but K = 40 is 3 steps, less than two rings of 2: the tiled kernel runs."""
    a, b = operands(SMALL_M + 1, 20, 40, torch.float32)
    check(gemm(a, b), reference(a, b))
    assert launches == []


@pytest.mark.parametrize("atomic", [False, True], ids=["deterministic", "atomic"])
def test_the_op_splits_k_when_the_tiles_are_fewer_than_the_sms(atomic, monkeypatch, launches):
    """70 x 20 is two 64 x 32 tiles on the interpreter's 4 "SMs": two splits of K = 320 (20 steps; the
    partials' 2 x 2 x 70 x 20 x 4 bytes within half the operands' 90 x 320 x 2), the second row tile partial,
    the epilogue applied once to the sum."""
    if atomic:
        monkeypatch.setenv(ATOMIC_SPLIT_K_ENV, "1")
    a, b = operands(70, 20, 320, torch.bfloat16, trans_b=True, seed=11)
    bias = torch.randn(20)
    out = gemm(a, b, bias=bias, activation="relu", trans_b=True)
    check(out, reference(a, b, bias, "relu", trans_b=True))
    (ran,) = launches
    assert (ran.BM, ran.BN, ran.split_k, ran.steps) == (64, 32, 2, 10)


# --- the bandwidth model ---------------------------------------------------------------------------------------

H100_SMS = 132
LLM_SHAPES = [(m, n, k) for m in (1, 16, 32, 64) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336),
                                                                (1024, 8192))]


@pytest.mark.parametrize("M,N,K", LLM_SHAPES)
def test_the_split_count_covers_the_sms_within_its_traffic_budget(M, N, K):
    """The modelled count: the programs cover all SMs unless the partials' traffic (<= 1/8 of B's bytes) or a
    full ring of K steps per split forbids more splits; strips that already cover the SMs are not split (no
    second launch). The plan then slices K evenly: no more splits than modelled, each a non-empty
    contiguous slice."""
    p = small_m_plan(M, N, K, 2, H100_SMS)
    strips, k_steps = tessera.cdiv(N, p.BN), tessera.cdiv(K, p.BK)
    modelled = split_count(M, N, K, 2, H100_SMS, p.BM, p.BN, p.BK, p.STAGES)

    def within_budget(splits):
        return (2 * splits * p.BM * N * 4 <= K * N * 2 / gemm_split_k.PARTIAL_TRAFFIC
                and k_steps // p.STAGES >= splits)

    assert modelled == 1 or within_budget(modelled)
    if strips >= H100_SMS:
        assert modelled == 1
    elif strips * modelled < H100_SMS:          # fewer programs than SMs: only where more would break the budget
        assert not within_budget(modelled + 1)
    else:                                       # and no more splits than cover the SMs
        assert strips * (modelled - 1) < H100_SMS
    assert 1 <= p.split_k <= modelled
    assert (p.split_k - 1) * p.steps < k_steps <= p.split_k * p.steps


@pytest.mark.parametrize("M,N,K,BN,splits", [
    (1, 4096, 4096, 32, 1),         # 128 strips of 32 columns cover the SMs: no split, no reduce launch
    (16, 4096, 4096, 32, 1),        # (64 strips of 64 would need 3 splits and the reduce: run 7's 49% / 32%)
    (1, 4096, 14336, 32, 1),
    (16, 4096, 14336, 32, 1),
    (32, 4096, 4096, 32, 1),        # 32 x 4096 of A re-read by 128 strips (67 MB through L2) beats the reduce
    (1, 14336, 4096, 64, 1),        # 224 strips of 64 cover the SMs (run 7: 94% of cuBLAS row-major)
    (16, 14336, 4096, 64, 1),
    (32, 14336, 4096, 64, 1),       # the plans run 7 measured at 91-101% of cuBLAS are kept:
    (64, 14336, 4096, 64, 1),
    (32, 4096, 14336, 64, 3),       # 32-column strips would re-read A 128 times (117 MB through L2)
    (64, 4096, 14336, 64, 3),
    (64, 4096, 4096, 64, 2),        # 64-row partials: 2 x 64 x 4 B/column
])
def test_decode_shapes_on_an_h100(M, N, K, BN, splits):
    """The plans the bandwidth model gives for the benchmark's decode shapes (132 SMs, bf16)."""
    p = small_m_plan(M, N, K, 2, H100_SMS)
    assert (p.BN, p.split_k) == (BN, splits)
    assert p.BK * 2 == 128          # every shipped small-M slot row is 128 bytes: the 128B swizzle's span


def test_the_model_charges_the_reduce_and_the_strips_a_rereads():
    """The model's terms: an unsplit 32-column plan of 1 x 4096 x 4096 is HBM-bound (33.5 MB at 3 TB/s) with
    the SM and L2 streams below it; splitting K adds the reduce launch; at M = 64 the strips' re-reads of A
    make the L2 stream the bound."""
    one = small_m_plan(1, 4096, 4096, 2, H100_SMS)
    streams = gemm_split_k.modelled(1, 4096, 4096, 2, H100_SMS, one)
    hbm_us = (4096 * 4096 + 4096) * 2 / 3e6           # B and A's one row, at 3e6 bytes per microsecond
    assert streams.reduce == 0 and max(streams.l2, streams.sm) < streams.hbm == pytest.approx(hbm_us)
    split = gemm_split_k._even(one.BM, one.BN, one.BK, one.STAGES, one.num_warps, 4096, 3)
    assert gemm_split_k.modelled(1, 4096, 4096, 2, H100_SMS, split).total > streams.total + gemm_split_k.REDUCE_US
    wide = small_m_plan(64, 14336, 4096, 2, H100_SMS)
    streams = gemm_split_k.modelled(64, 14336, 4096, 2, H100_SMS, wide)
    assert streams.l2 == max(streams) == pytest.approx((4096 * 14336 + 224 * 64 * 4096) * 2 / 5.5e6)


def test_m_outside_the_path_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"M = 65 is not in 1\.\.64; larger M uses the tiled kernel"):
        small_m_plan(65, 64, 64, 2, H100_SMS)


@pytest.mark.parametrize("M,N,K,splits", [
    (128, 4096, 4096, 4),       # 32 tiles of 128 x 128: four splits make 128 programs, one wave of 132
    (256, 4096, 4096, 2),       # 64 tiles
    (256, 4096, 14336, 2),
    (128, 14336, 4096, 1),      # 112 tiles: two splits would be a second wave
    (1024, 1024, 4096, 1),      # 64 tiles, but the partials (2 x 2 x 4 MB) would outweigh the operands' 16 MB / 2
    (512, 1024, 512, 1),        # 32 tiles, but K = 8 steps is less than two rings of 3 per split
    (4096, 4096, 4096, 1),      # 1024 tiles
])
def test_few_tiles_split_only_within_one_wave_and_where_k_and_the_traffic_allow(M, N, K, splits):
    p = few_tiles_plan(M, N, K, 2, H100_SMS)
    assert (p.split_k if p else 1) == splits
    if p is not None:
        tiles, k_steps = tessera.cdiv(M, p.BM) * tessera.cdiv(N, p.BN), tessera.cdiv(K, p.BK)
        assert tiles * p.split_k <= H100_SMS and p.steps >= 2 * p.STAGES
        assert (p.split_k - 1) * p.steps < k_steps <= p.split_k * p.steps
        assert 2 * p.split_k * M * N * 4 <= (M + N) * K * 2 / gemm_split_k.PARTIAL_SHARE_TILED
        assert few_tiles_split_count(M, N, K, 2, H100_SMS, p.BM, p.BN, p.BK, p.STAGES) >= p.split_k


# --- compiled for every target -------------------------------------------------------------------------------

SIGNATURE = "*bf16:16,*bf16:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,*f32:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,{b},i32"
B_STRIDES = {"b-row-major": "i32:16,i32:1", "b-transposed": "i32:1,i32:16"}
NO_EPILOGUE = dict(HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none")
SPLITS = {"one-split": (1, False), "workspace": (3, False), "atomic": (3, True)}


SHIPPED_TILES = {**{f"small-m-{bm}x{tile['BN']}": dict(tile, BM=bm) for bm, tiles in gemm_configs.SMALL_M.items()
                    for tile in tiles},
                 "few-tiles": gemm_configs.SPLIT_K}


def compile_split_k(target, tile, b_layout, split, atomic, **options):
    BM = tile["BM"]
    return gemm_split_k_kernel.compile(
        signature=SIGNATURE.format(b=B_STRIDES[b_layout]), target=target, num_warps=tile["num_warps"], **options,
        **NO_EPILOGUE, BM=BM, BN=tile["BN"], BK=tile["K_BYTES"] // 2, STAGES=tile["STAGES"], SPLIT_K=split,
        ATOMIC=atomic)


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("b_layout", list(B_STRIDES))
@pytest.mark.parametrize("target", ["sm_80", "sm_89", "sm_90a"])
def test_every_shipped_tile_compiles_pipelined_without_spills(target, b_layout, split):
    """Each shipped tile's K slice is a STAGES-deep pipeline (cp.async on sm_80/sm_89, TMA into swizzled slots
    on sm_90a) that fits the target's shared memory and assembles without spills; the 64-row tile runs on
    wgmma on sm_90a, the others on mma.sync; the split kinds store C, the workspace, or add with atomics."""
    from tessera.backends.nvptx import find_ptxas
    from tessera.ir.target import get_target
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    for name, tile in SHIPPED_TILES.items():
        BM = tile["BM"]
        compiled = compile_split_k(target, tile, b_layout, *SPLITS[split])
        metadata, ptx = compiled.metadata, compiled.stages["ptx"]
        assert metadata["spill_stores"] == metadata["spill_loads"] == 0, f"BM = {BM} spills"
        assert metadata["shared_bytes"] <= get_target(target).shared_memory_bytes
        if target == "sm_90a":
            assert "cp.async.bulk.tensor.2d" in ptx and "cp.async.cg" not in ptx
            # every slot swizzled, so no ldmatrix / wgmma read of it has bank conflicts (unswizzled 256-byte
            # rows of A and of an [N, K] weight cost 8-way conflicts: run 7's b-weight at half of row-major)
            swizzles = [m["swizzle"] for m in metadata["tensor_maps"] if m["pointer"] in ("a_ptr", "b_ptr")]
            assert len(swizzles) == 2 and "none" not in swizzles, f"{name}: {swizzles}"
            if BM >= 64:
                n = tile["BN"]
                assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{n}k16", ptx) and "mma.sync" not in ptx
            else:
                assert "mma.sync.aligned.m16n8k16" in ptx and "wgmma" not in ptx
        else:
            assert re.search(rf"cp\.async\.wait_group\s+{tile['STAGES'] - 2};", ptx), f"BM = {BM}: not pipelined"
            copies = re.findall(r"cp\.async\.c[ag]\.shared\.global\S*\s+\[[^\]]*\],\s*\[[^\]]*\],\s*(\d+)", ptx)
            assert copies and set(copies) == {"16"}, f"{name}: copies of {set(copies)} bytes (16 along K or N)"
            assert "mma.sync.aligned.m16n8k16" in ptx
        assert ("red.global.add.f32" in ptx or "atom.global.add.f32" in ptx) == (split == "atomic")


def test_every_small_m_tile_keeps_a_programs_share_of_hbm_in_flight():
    """Little's law: an H100 streams 3.35 TB/s over 132 SMs with ~0.8 us of DRAM latency under load, so one
    program alone on its SM must keep ~20 KB of B in flight (STAGES - 1 slots of BN x K_BYTES) to take its
    share; the slot rows are 128 bytes (the 128B swizzle's span: conflict-free reads)."""
    share = 3.35e12 / 132 * 0.8e-6
    for bm, tiles in gemm_configs.SMALL_M.items():
        for tile in tiles:
            assert tile["K_BYTES"] == 128, f"BM = {bm}, BN = {tile['BN']}"
            assert (tile["STAGES"] - 1) * tile["BN"] * tile["K_BYTES"] >= share, f"BM = {bm}, BN = {tile['BN']}"


@pytest.mark.parametrize("b_layout", list(B_STRIDES))
def test_the_decode_k_step_in_sass_is_what_the_model_charges(b_layout):
    """`gemm_split_k.STEP_US` prices a 64-deep K step of the 16 x 32 decode tile on sm_90a as one ring wait, one
    barrier, two TMA issues, six ldmatrix and four HMMA.16816 in a ~90-instruction loop, whose dependent HMMA
    chain (~130 clk) dominates; a longer loop or a longer chain would make the model optimistic."""
    from collections import Counter

    from tessera.backends.nvptx import find_ptxas
    from tessera.backends.nvptx.sass import disassemble, find_cuobjdump, loop_containing
    if find_ptxas() is None or find_cuobjdump() is None:
        pytest.skip("ptxas / cuobjdump not installed")
    compiled = compile_split_k("sm_90a", SHIPPED_TILES["small-m-16x32"], b_layout, 1, False)
    loop = loop_containing(disassemble(compiled.cubin), "HMMA")
    ops = Counter(inst.opcode.split(".")[0] for inst in loop)
    assert (ops["HMMA"], ops["LDSM"], ops["UTMALDG"], ops["BAR"]) == (4, 6, 2, 1), dict(ops)
    assert len(loop) <= 96, f"{len(loop)} instructions per K step"


GFX942_TILES = {**{f"small-m-{bm}x{tile['BN']}": dict(tile, BM=bm)
                   for bm, tiles in gemm_configs.small_m_tiles("gfx942").items() for tile in tiles},
                "few-tiles": gemm_configs.split_k_tile("gfx942")}


@pytest.mark.parametrize("split", list(SPLITS))
def test_every_gfx942_tile_compiles_on_mfma_with_the_stages_it_asks_for(split):
    """On gfx942 the tiles an MI300 runs (`gemm_configs.small_m_tiles` / `split_k_tile`: the shipped ones with no
    more stages than its 64 KiB of LDS holds) compile in strict mode, so every stage asked for is a ring slot (a
    PipelineWarning would fail: the unfitted 16 x 64 decode tile asks for 8 where 6 fit): the K slice pipelined
    through direct-to-LDS rings (`global_load_lds_dword`) of exactly STAGES x `gemm_configs.stage_bytes`, the dot
    on MFMA, no register spilled."""
    for name, tile in GFX942_TILES.items():
        compiled = compile_split_k("gfx942", tile, "b-row-major", *SPLITS[split], strict=True)
        assert re.search(r"\bv_mfma_f32_\w+bf16", compiled.stages["amdgcn"]), f"{name}: not on MFMA"
        assert "global_load_lds_dword" in compiled.stages["amdgcn"], f"{name}: not pipelined"
        rings = tile["STAGES"] * gemm_configs.stage_bytes(tile["BM"], tile["BN"], tile["K_BYTES"])
        assert compiled.metadata["shared_bytes"] == rings <= 64 * 1024, name
        assert amd_spills(compiled.metadata) == {}, name


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "gfx942"])
def test_the_reduce_kernel_compiles(target):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = gemm_split_k_reduce_kernel.compile(
            signature="*f32:16,*f32:16,*f32:16,*f32:16,*bf16:16,i32:16,i32:16,f32", target=target, num_warps=4,
            HAS_BIAS=True, SCALE_A="none", SCALE_B="none", ACTIVATION="silu", BM=16, BN=64, SPLITS=3)
    assert compiled.metadata.get("spill_stores", 0) == 0 and compiled.metadata.get("vgpr_spill_count", 0) == 0


# --- the SIMT simulator ----------------------------------------------------------------------------------------

def split_k_on_the_simulator(target, M, N, K, BM, num_warps, splits, seed=0, BN=32, BK=32, trans_b=False):
    """Both kernels lowered for `target` and run on the SIMT simulator (the main one over its (strips, splits,
    row tiles) grid into the deterministic workspace, then the reduce; one split stores C itself), B stored
    [K, N], or [N, K] with `trans_b` (an nn.Linear weight): (C, numpy's) in float32, and the swizzles of the
    main kernel's tensor maps (sm_90a)."""
    from tessera.backends.simt import run_threads
    from tessera.passes.thread_passes import lower
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float16)
    STAGES = 2
    steps = tessera.cdiv(tessera.cdiv(K, BK), splits)
    strips, row_tiles = tessera.cdiv(N, BN), tessera.cdiv(M, BM)
    c = np.zeros((M, N), np.float32)
    partials = np.full((splits * row_tiles * BM, N), np.nan, np.float32)     # the reduce reads only what is written
    unused = np.zeros(1, np.float32)
    b_strides = (1, K) if trans_b else (N, 1)
    args = [a, b, unused, unused, unused, c, partials, M, N, K, 1.0, K, 1, *b_strides, steps]
    module = gemm_split_k_kernel.specialize(*args, **NO_EPILOGUE, BK=BK, STAGES=STAGES, SPLIT_K=splits,
                                            ATOMIC=False, BM=BM, BN=BN).module
    main = lower(module, target, num_warps).functions[0]
    run_threads(main, args, (strips, splits, row_tiles))
    swizzles = [recipe[-1] for recipe in main.attrs.get("tensor_maps", ())]
    if splits > 1:
        reduce_args = [partials, unused, unused, unused, c, M, N, 1.0]
        module = gemm_split_k_reduce_kernel.specialize(*reduce_args, **NO_EPILOGUE, SPLITS=splits, BM=BM,
                                                       BN=BN).module
        run_threads(lower(module, target, num_warps).functions[0], reduce_args, (strips, row_tiles))
    b_kn = b.T if trans_b else b
    return c, a.astype(np.float32) @ b_kn.astype(np.float32), swizzles


@pytest.mark.parametrize("target,M,BM,num_warps", [("sm_80", 5, 16, 4), ("sm_90a", 33, 64, 4),
                                                   ("sm_90a", 70, 64, 4), ("gfx942", 5, 16, 4)])
def test_split_k_on_the_simt_simulator_matches_numpy(target, M, BM, num_warps):
    """mma.sync fed by cp.async (sm_80, a 16-row tile), wgmma fed by TMA (sm_90a, 64-row tiles; 70 rows are
    two row tiles, as on the few-tiles path), and MFMA fed by direct-to-LDS loads (gfx942, the decode tile's 16
    rows): three K splits (the last one short) over two column strips (the second one partial), summed by the
    reduce."""
    out, expected, _ = split_k_on_the_simulator(target, M, 48, 224, BM, num_warps, splits=3)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("trans_b", [False, True], ids=["b-row-major", "b-weight"])
def test_the_decode_tile_on_the_simt_simulator_matches_numpy(trans_b):
    """The shipped decode tile's shape on sm_90a: 16 rows, 32-column strips, 128-byte slot rows of A and of an
    [N, K] B (BK = 64 of float16) that TMA fills 128B-swizzled (a row-major B's 64-byte rows: 64B) and
    mma.sync reads with ldmatrix (.trans for a row-major B), K not split: three rows of C over two strips (the second partial) and K = 224 (the last step half full)."""
    out, expected, swizzles = split_k_on_the_simulator("sm_90a", 3, 48, 224, 16, 4, splits=1, BN=32, BK=64,
                                                       trans_b=trans_b)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)
    assert swizzles == ["128B", "64B" if not trans_b else "128B"]   # (a row-major B's rows are 32 x 2 bytes)


FP8_SIGNATURE = ("*f8e4m3:16,*f8e4m3:16,*f32:16,*f32:16,*f32:16,*bf16:16,*f32:16,i32:16,i32:16,i32:16,f32,i32:16,"
                 "i32:1,i32:1,i32:16,i32")


@pytest.mark.parametrize("target", ["sm_89", "sm_90a"])
def test_fp8_with_k_major_b_compiles_pipelined_without_spills(target):
    """fp8 operands with B as an nn.Linear weight (N x K, K-major: what 8-bit tensor-core reads need), scales,
    bias and silu: each shipped tile takes K_BYTES / 1 = twice the 16-bit K depth, runs pipelined (strict
    mode) without spills, on wgmma where it has 64-row slabs on sm_90a, else mma.sync. The tiles take the
    scales per tensor (one scalar load) and per row / column in turn."""
    from tessera.backends.nvptx import find_ptxas
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    for i, (name, tile) in enumerate(SHIPPED_TILES.items()):
        scale_a, scale_b = ("tensor", "vector") if i % 2 else ("vector", "tensor")
        compiled = gemm_split_k_kernel.compile(
            signature=FP8_SIGNATURE, target=target, num_warps=tile["num_warps"], HAS_BIAS=True, SCALE_A=scale_a,
            SCALE_B=scale_b, ACTIVATION="silu", BM=tile["BM"], BN=tile["BN"], BK=tile["K_BYTES"],
            STAGES=tile["STAGES"], SPLIT_K=2, ATOMIC=False)
        metadata, ptx = compiled.metadata, compiled.stages["ptx"]
        assert metadata["spill_stores"] == metadata["spill_loads"] == 0, f"{name} spills"
        on_wgmma = target == "sm_90a" and tile["BM"] >= 64
        assert ("wgmma.mma_async" in ptx) == on_wgmma and ("mma.sync" in ptx) != on_wgmma, name


# --- the kernels the op launches for the GPU test's shapes, compiled in strict mode ----------------------------

def int_hint(value: int) -> str:
    """An i32 argument's signature entry as the specialization makes it (`:16` multiples of 16, `:1` for 1)."""
    return "i32:1" if value == 1 else "i32:16" if value % 16 == 0 else "i32"


def op_launches(M, N, K, weight, atomic):
    """What `tessera::gemm(a, b, bias, activation="gelu", trans_b=weight)` launches for bf16 A [M, K] and B
    ([N, K] as a weight, else [K, N]) on an H100 (`gemm._gemm` and `gemm_split_k.launch`): (kernel, signature,
    num_warps, constexprs) for the main kernel and, with splits, the reduce kernel."""
    from tessera.kernels_lib.gemm_split_k import gemm_split_k_kernel_fast, gemm_split_k_reduce_kernel_fast, \
        main_constexprs
    plan = _split_k_plan(M, N, K, 2, H100_SMS, cpu=False)
    assert plan is not None, "the GPU test's shapes take a split-K plan"
    strides = (K, 1, 1, K) if weight else (K, 1, N, 1)      # stride_am, stride_ak, stride_bk, stride_bn
    flags = dict(HAS_BIAS=True, SCALE_A="none", SCALE_B="none", ACTIVATION="gelu")
    atomic = atomic and plan.split_k > 1
    chosen = main_constexprs(plan, M, N, K, strides, 2, pointers_aligned=True)
    signature = ",".join(["*bf16:16", "*bf16:16", "*f32:16", "*bf16:16", "*bf16:16", "*bf16:16", "*f32:16",
                          int_hint(M), int_hint(N), int_hint(K), "f32", *map(int_hint, strides), int_hint(plan.steps)])
    tile = dict(BM=plan.BM, BN=plan.BN)
    launches = [(gemm_split_k_kernel_fast, signature, plan.num_warps,
                 dict(**flags, **tile, **chosen, BK=plan.BK, SPLIT_K=plan.split_k, ATOMIC=atomic))]
    if plan.split_k > 1:
        reduce = ",".join(["*f32:16", "*f32:16", "*bf16:16", "*bf16:16", "*bf16:16", int_hint(M), int_hint(N), "f32"])
        launches.append((gemm_split_k_reduce_kernel_fast, reduce, plan.num_warps,
                         dict(**flags, **tile, SPLITS=1 if atomic else plan.split_k)))
    return plan, chosen, launches


def gpu_test_cases():
    from test_gemm_split_k_on_gpu import SHAPES
    # the GPU test's shapes, and one whose K rows (4101 bf16) no asynchronous copy can fill
    return [(*shape, weight, atomic) for shape in [*SHAPES, (16, 1000, 4101)]
            for weight in (False, True) for atomic in (False, True)]


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_every_split_k_launch_of_the_gpu_test_compiles_in_strict_mode(target):
    """Each kernel the op launches for `test_gemm_split_k_on_gpu.py`'s shapes compiles for `target` in strict
    mode: no pipeline asks for copies its arguments cannot have. Rows that start 16-byte aligned (K = 4104 and
    N = 1000: multiples of 8 bf16, which the specialization does not see, so the op states it with ALIGN) keep
    the plan's pipeline, by cp.async on sm_80 and TMA on sm_90a; K = 4101 runs as a plain loop. (On the H100,
    K = 4104 raised a CompileError: the loads proved only 1-element runs.)"""
    from tessera.backends.nvptx import find_ptxas
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    compiled = {}
    for M, N, K, weight, atomic in gpu_test_cases():
        plan, chosen, launches = op_launches(M, N, K, weight, atomic)
        assert chosen["STAGES"] == (1 if K % 8 else plan.STAGES), (M, N, K)
        for kernel, signature, num_warps, constexprs in launches:
            key = (kernel.name, signature, num_warps, tuple(sorted(constexprs.items())))
            if key not in compiled:
                compiled[key] = kernel.compile(signature=signature, target=target, num_warps=num_warps, strict=True,
                                               **constexprs)
            ptx = compiled[key].stages["ptx"]
            if kernel.name == "gemm_split_k_kernel" and chosen["STAGES"] > 1:
                copies = "cp.async.bulk.tensor.2d.shared::cluster" if target == "sm_90a" else "cp.async.cg"
                assert copies in ptx, f"{(M, N, K, weight)}: not pipelined on {target}"
            elif kernel.name == "gemm_split_k_kernel":
                assert "cp.async" not in ptx
