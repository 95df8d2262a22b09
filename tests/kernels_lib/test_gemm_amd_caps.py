"""The GEMM family on AMD GPUs, and the per-GPU constants its models read (tessera/kernels_lib/gpus.py).

Every split-K, small-M and stream-K tile an AMD target runs holds its rings in the target's LDS (pure Python),
and the ones the gfx942 split-K compile test (test_gemm_split_k.py) does not build compile for gfx942 / gfx950
into linked code objects with exactly those rings and no spills. The models price plans with the GPU's own
constants: an MI300X splits where an H100 would not, for the reasons its datasheet numbers give, so these
tests fail if a model ignores the `Gpu` it is given or the op plans every GPU as an H100.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import importlib  # noqa: E402

import tessera  # noqa: E402
from tessera.kernels_lib import attention_decode_model as decode_model  # noqa: E402
from tessera.kernels_lib import gemm_configs, gemm_split_k, gemm_stream_k, gpus, targets  # noqa: E402

from amd_spills import amd_spills  # noqa: E402

gemm = importlib.import_module("tessera.kernels_lib.gemm")     # (the package exports the op under its name)

AMD = targets.AMD_PLAN_TARGETS


def _amd_tiles(target: str) -> dict[str, tuple[int, dict, dict]]:
    """name -> (BM, the target's tile, its NVIDIA twin) for every split-K / small-M / stream-K tile of `target`."""
    tiles = {}
    for bm, row in gemm_configs.small_m_tiles(target).items():
        for tile, twin in zip(row, gemm_configs.SMALL_M[bm], strict=True):
            tiles[f"small-m-{bm}x{tile['BN']}"] = (bm, tile, twin)
    for kind, tile, twin in (("few-tiles", gemm_configs.split_k_tile(target), gemm_configs.SPLIT_K),
                             ("stream-k", gemm_configs.stream_k_tile(target), gemm_configs.STREAM_K)):
        assert tile is not None, f"{target} has no {kind} tile"
        tiles[kind] = (tile["BM"], tile, twin)
    return tiles


# --- the tiles (no compiles) ---------------------------------------------------------------------------------

@pytest.mark.parametrize("target", AMD)
def test_every_amd_split_and_stream_k_tile_fits_its_lds_as_deep_as_it_holds(target):
    """Each tile is its NVIDIA twin with STAGES lowered only as far as the LDS needs (one stage more would not
    fit), at least 2 deep; gfx942's 64 KiB lowers the 8-deep decode tile, the 10- and 12-deep strips and the
    128 x 128 few-tiles and stream-K tiles (3 -> 2); gfx950's 160 KiB keeps every one as shipped."""
    lds = targets.lds_bytes(target)
    lowered = []
    for name, (bm, tile, twin) in _amd_tiles(target).items():
        stage = gemm_configs.stage_bytes(bm, tile["BN"], tile["K_BYTES"])
        assert {**tile, "STAGES": twin["STAGES"]} == twin, name
        assert 2 <= tile["STAGES"] <= twin["STAGES"] and tile["STAGES"] * stage <= lds, name
        if tile["STAGES"] < twin["STAGES"]:
            assert (tile["STAGES"] + 1) * stage > lds, f"{name}: lowered further than {target}'s LDS needs"
            lowered.append((name, tile["STAGES"]))
    assert lowered == ([("small-m-16x64", 6), ("small-m-16x32", 10), ("small-m-32x32", 8), ("few-tiles", 2),
                        ("stream-k", 2)] if target == "gfx942" else [])


def test_a_tile_whose_two_stages_do_not_fit_is_left_out():
    """`fitted_tile` drops a tile rather than hand the planner one it would run unpipelined."""
    tile = dict(gemm_configs.SPLIT_K)
    stage = gemm_configs.stage_bytes(tile["BM"], tile["BN"], tile["K_BYTES"])
    assert gemm_configs.fitted_tile(tile, tile["BM"], 2 * stage) == {**tile, "STAGES": 2}
    assert gemm_configs.fitted_tile(tile, tile["BM"], 2 * stage - 1) is None
    with pytest.raises(ValueError, match=r"no split-K / stream-K tiles for plan key 'gfx90a'; the keys are "
                                         r"nvidia, gfx942, gfx950"):
        gemm_configs.small_m_tiles("gfx90a")



def test_a_row_tile_left_out_takes_the_next_larger_ones(monkeypatch):
    """Where a target's LDS left a small-M row tile no tiles, M takes the next larger row tile's; with none left,
    a ValueError says what to ship."""
    table = dict(gemm_configs.small_m_tiles("gfx942"))
    del table[16]
    monkeypatch.setitem(gemm_configs.SMALL_M_BY_TARGET, "gfx942", table)
    assert {p.BM for p in gemm_split_k.small_m_candidates(1, 4096, 4096, 2, 304, plans_of="gfx942")} == {32}
    monkeypatch.setitem(gemm_configs.SMALL_M_BY_TARGET, "gfx942", {})
    with pytest.raises(ValueError, match=r"plan key 'gfx942' has no tile of 16 or more rows"):
        gemm_split_k.small_m_plan(1, 4096, 4096, 2, 304, gpu=gpus.MI300X)


# --- compiled: the kinds test_gemm_split_k.py's gfx942 test leaves out -----------------------------------------

SPLIT_SIGNATURE = ("*bf16:16,*bf16:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,*f32:16,i32:16,i32:16,i32:16,f32,i32:16,"
                   "i32:1,i32:16,i32:1,i32")
STREAM_SIGNATURE = ("*bf16:16,*bf16:16,*f32:16,*f32:16,*f32:16,*bf16:16,*f32:16,*i32:16,i32:16,i32:16,i32:16,f32,"
                    "i32:16,i32:1,i32:16,i32:1,i32:16,i32")
NO_EPILOGUE = dict(HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none")


def _compile(kind: str, target: str):
    """`kind`'s tile on `target` compiled as the op launches it (bf16, B row-major; split K 3 ways), and its
    {"BM", "BN", "BK", "STAGES"}."""
    bm, tile, _ = _amd_tiles(target)[kind]
    shape = dict(BM=bm, BN=tile["BN"], BK=tile["K_BYTES"] // 2, STAGES=tile["STAGES"])
    if kind == "stream-k":
        return gemm_stream_k.gemm_stream_k_kernel.compile(
            signature=STREAM_SIGNATURE, target=target, num_warps=tile["num_warps"], strict=True, **NO_EPILOGUE,
            GROUP_M=tile["GROUP_M"], **shape), shape
    return gemm_split_k.gemm_split_k_kernel.compile(
        signature=SPLIT_SIGNATURE, target=target, num_warps=tile["num_warps"], strict=True, **NO_EPILOGUE,
        SPLIT_K=3, ATOMIC=False, **shape), shape


@pytest.mark.parametrize("kind, target", [("stream-k", "gfx942"), ("stream-k", "gfx950"),
                                          ("few-tiles", "gfx950"), ("small-m-16x64", "gfx950")])
def test_the_amd_tiles_compile_into_code_objects_with_their_rings_and_no_spills(kind, target):
    """Strict mode (no stage dropped), the K loops on MFMA fed by direct-to-LDS rings of exactly STAGES x
    `stage_bytes` (stream K's data-parallel and stream-K loops share one: 64 KiB on gfx942), within the target's
    LDS, nothing spilled, and linked (ld.lld) into a loadable code object with the kernel's descriptor."""
    from tessera.backends.amdgpu.elf import CodeObject
    from tessera.backends.amdgpu.linker import find_linker
    compiled, shape = _compile(kind, target)
    amdgcn, metadata = compiled.stages["amdgcn"], compiled.metadata
    assert "v_mfma_f32_" in amdgcn and "global_load_lds" in amdgcn
    rings = shape["STAGES"] * gemm_configs.stage_bytes(shape["BM"], shape["BN"], shape["BK"] * 2)
    assert metadata["shared_bytes"] == rings <= tessera.get_target(target).shared_memory_bytes
    assert amd_spills(metadata) == {}
    if find_linker() is None:
        pytest.skip("no ld.lld: the object is not linked")
    code = CodeObject(compiled.binary)
    assert code.elf_type == "ET_DYN" and f"{compiled.name}.kd" in code.symbols


# --- the per-GPU constants -----------------------------------------------------------------------------------

def test_each_gpu_takes_its_shared_memory_from_the_target_description_and_its_row_by_target_and_name():
    for gpu in gpus.GPUS:
        assert gpu.shared_per_sm == tessera.get_target(gpu.arch).shared_memory_bytes, gpu
    assert gpus.MI300X.shared_per_sm == 64 * 1024 and gpus.MI355X.shared_per_sm == 160 * 1024
    assert (gpus.MI300X.sms, gpus.MI300X.hbm_peak_gbps, gpus.MI355X.sms, gpus.MI355X.hbm_peak_gbps) == \
        (304, 5300, 256, 8000)
    assert gpus.lookup("sm_90a", "NVIDIA H100 80GB HBM3") is gpus.H100_SXM
    assert gpus.lookup("sm_90a", "NVIDIA H200") is gpus.H200
    assert gpus.lookup("gfx942", "AMD Instinct MI300X") is gpus.MI300X
    assert gpus.lookup("gfx90a") is gpus.MI300X          # an AMD target without a row: its plan target's
    assert gpus.lookup("sm_100") is gpus.H100_SXM        # an NVIDIA one: the reference GPU's
    assert (gpus.MI300X.plan_key, gpus.MI355X.plan_key, gpus.H200.plan_key) == ("gfx942", "gfx950", "nvidia")


def test_the_op_looks_its_gpu_up_once_per_device(monkeypatch):
    """On a ROCm MI355X (faked) the op plans with MI355X's row and gfx950's tiles (`gemm._gpu_of`); the device's
    properties are read once, not per call, while the plan key follows $TESSERA_AMD_PLANS on every call (a GPU
    session runs gfx942's tiles on an MI355X with its own constants)."""
    reads = []

    class Properties:
        name, multi_processor_count = "AMD Instinct MI355X", 256

    def properties(device):
        reads.append(device)
        return Properties()
    monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)
    monkeypatch.delenv(targets.AMD_PLANS_ENV, raising=False)
    monkeypatch.setattr(targets, "device_arch", lambda device=None: "gfx950")
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    gpus.forget_devices()
    try:
        device = torch.device("cuda", 0)
        assert gemm._gpu_of(device) == gemm._gpu_of(device) == (gpus.MI355X, "gfx950")
        assert len(reads) == 1
        monkeypatch.setenv(targets.AMD_PLANS_ENV, "gfx942")
        assert gemm._gpu_of(device) == (gpus.MI355X, "gfx942")
    finally:
        gpus.forget_devices()
    assert gemm._gpu_of(torch.device("cpu")) == (gpus.H100_SXM, "nvidia")     # the interpreter, the stub driver


# --- the models on an MI300X against an H100 -----------------------------------------------------------------

def test_decode_gemm_splits_k_on_an_mi300x_where_an_h100_streams_unsplit():
    """1 x 4096 x 14336 (bf16): 128 strips of 32 columns, each a chain of 224 K steps at one per STEP_US (28 us).
    An H100's HBM needs 39 us for B, so the chain hides and K is not split; an MI300X's 5.3 TB/s reads B in 25 us,
    so the chain would be the bound and the model splits K 3 ways (19 us of chain + the reduce). With an H100's
    constants on the MI300X's 304 CUs and tiles the plan does not split: the difference is the constants'."""
    shape = (1, 4096, 14336, 2)
    mi300x = gemm_split_k.small_m_plan(*shape, 304, gpu=gpus.MI300X)
    assert (mi300x.BN, mi300x.STAGES, mi300x.split_k) == (32, 10, 3)
    assert gemm_split_k.small_m_plan(*shape, 304, gpu=gpus.H100_SXM, plans_of="gfx942").split_k == 1
    h100 = gemm_split_k.small_m_plan(*shape, 132)
    assert (h100.BN, h100.STAGES, h100.split_k) == (32, 12, 1)
    assert gemm._split_k_plan(*shape, 304, False, gpus.MI300X, "gfx942") == mi300x        # what the op runs


def test_stream_k_pays_on_an_mi300x_where_its_partials_cost_an_h100_too_much(monkeypatch):
    """4096 x 4096 x 1024 (1024 tiles on 304 CUs, 112 left for a last wave), once stream K is measured on gfx942:
    a MI300X CU's ~3 TFLOP/s makes a K step long beside its partials' L2 traffic, so stream K models >3% faster;
    at an H100 SM's 5.2 TFLOP/s the same partials eat the gain. The gfx942 tile runs 2 stages. An NVIDIA run's
    measurement alone leaves AMD GPUs on the data-parallel kernel unless forced."""
    monkeypatch.setattr(gemm_configs, "STREAM_K_MEASURED", True)
    assert gemm_stream_k.stream_k_plan(4096, 4096, 1024, 2, 304, gpu=gpus.MI300X) is None
    assert gemm_stream_k.stream_k_plan(4096, 4096, 1024, 2, 304, "1", gpu=gpus.MI300X).STAGES == 2
    monkeypatch.setattr(gemm_configs, "STREAM_K_MEASURED_AMD", ("gfx942",))
    plan = gemm_stream_k.stream_k_plan(4096, 4096, 1024, 2, 304, gpu=gpus.MI300X)
    assert plan is not None and (plan.STAGES, plan.sk_tiles) == (2, 416)
    assert gemm_stream_k.stream_k_plan(4096, 4096, 1024, 2, 304, gpu=gpus.H100_SXM, plans_of="gfx942") is None


def test_decode_attention_splits_further_on_an_mi300x():
    """B = 8, context 4096, 32 query heads on 8 KV heads: an MI300X CU holds fewer rings (64 KiB of LDS) and
    fills slower than an H100 SM, so the model spreads the keys over more splits on the same 304 CUs."""
    from tessera.kernels_lib.attention_decode import gpu_decode_plan
    plan = gpu_decode_plan(128, False, "gfx942")
    tile = decode_model.Tile(16, min(64, plan.keys), plan.stages, plan.num_warps(16))
    d = decode_model.Decode(8, 32, 8, 128, 4096)
    assert decode_model.plan_for(d, tile, 304, None, gpus.MI300X)[0] == 8
    assert decode_model.plan_for(d, tile, 304, None, gpus.H100_SXM)[0] == 5
    cost = decode_model.modelled(d, tile, 8, 304, True, gpus.MI300X)
    assert cost.hbm_share == pytest.approx(cost.moved / (cost.total * 1e3) / 5300)     # "% of HBM": MI300X's peak


@pytest.mark.gpu
def test_this_gpu_plans_with_its_own_row():
    """On a GPU session: the device's row is the one for its target and name (an "NVIDIA H100 80GB HBM3" the
    H100 SXM's, an "NVIDIA H200" the H200's, an MI300X / MI355X its own), and, on a whole chip, its SM count the
    row's; a mismatch names the device, so a new GPU's row can be added to gpus.py."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    device = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(device)
    gpu, plans_of = gemm._gpu_of(device)
    arch = targets.device_arch(device)
    assert gpu.arch == arch or arch not in gpus.BY_ARCH, (props.name, arch, gpu)
    assert plans_of == targets.plan_target(device)
    for marker, row in (("H100 80GB HBM3", gpus.H100_SXM), ("H200", gpus.H200), ("MI300X", gpus.MI300X),
                        ("MI355X", gpus.MI355X)):
        if marker in props.name:
            assert gpu is row and props.multi_processor_count == row.sms, (props.name, props.multi_processor_count)
