"""Which plan each library op takes on an AMD GPU, by its target (`kernels_lib/targets.py`), with a ROCm build of
torch and the device's architecture faked: gfx942 (and any AMD target without plans of its own) keeps exactly the
plans it had; gfx950 takes its deeper rings. These fail if a gfx950 device falls back to gfx942's plans.
Whether each plan compiles without spills within the target's LDS: test_attention_compile.py,
test_quant_gemm.py, test_moe_experts.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import importlib  # noqa: E402

import tessera  # noqa: E402
from tessera.kernels_lib import gemm_configs, targets  # noqa: E402
from tessera.kernels_lib.moe import mlp, persistent, plan as moe_plans  # noqa: E402

# the modules (the package exports the ops under their names)
attention, attention_decode, quant_gemm = (importlib.import_module(f"tessera.kernels_lib.{name}")
                                           for name in ("attention", "attention_decode", "quant_gemm"))

Plan = attention.Plan
# gfx942's plans as they were before plans were keyed by target (the vendor-wide "amd" ones): unchanged
GFX942_FORWARD = {64: Plan(128, 64, 4, stages=2), 128: Plan(128, 64, 4, stages=1), 256: Plan(64, 32, 4, stages=1)}
GFX942_DECODE_STAGES = {(False, 64): 1, (False, 128): 1, (False, 256): 1, (True, 64): 1, (True, 128): 2}


@pytest.fixture
def amd_device(monkeypatch):
    """Set the faked AMD device's architecture: `amd_device("gfx950")`."""
    monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)
    monkeypatch.delenv("TESSERA_INTERPRET", raising=False)
    monkeypatch.delenv(targets.AMD_PLANS_ENV, raising=False)

    def on(arch: str) -> torch.device:
        monkeypatch.setattr(targets, "device_arch", lambda device=None: arch)
        return torch.device("meta")     # a tensor there is not a CPU tensor: the ops take their GPU plan
    return on


def test_the_plan_key_is_the_amd_target_or_gfx942s_and_the_lds_comes_from_the_target_description(amd_device):
    for arch, key in (("gfx942", "gfx942"), ("gfx950", "gfx950"), ("gfx90a", "gfx942")):
        amd_device(arch)
        assert targets.plan_target() == key
    assert targets.lds_bytes("gfx942") == tessera.get_target("gfx942").shared_memory_bytes == 64 * 1024
    assert targets.lds_bytes("gfx950") == tessera.get_target("gfx950").shared_memory_bytes == 160 * 1024


def test_a_gpu_session_can_run_gfx942s_plans_on_a_gfx950_but_not_the_reverse(amd_device, monkeypatch):
    monkeypatch.setenv(targets.AMD_PLANS_ENV, "gfx942")
    amd_device("gfx950")
    assert targets.plan_target() == "gfx942" and attention.gpu_plan(128) == GFX942_FORWARD[128]
    monkeypatch.setenv(targets.AMD_PLANS_ENV, "gfx950")
    amd_device("gfx942")
    with pytest.raises(ValueError, match=r"TESSERA_AMD_PLANS='gfx950': this gfx942 GPU runs the plans of gfx942 "
                                         r"\(their rings fit its 65536 bytes of LDS\)"):
        targets.plan_target()


@pytest.mark.parametrize("D", [64, 128, 256])
def test_the_attention_forward_takes_its_targets_plan(amd_device, D):
    amd_device("gfx942")
    assert attention.gpu_plan(D) == GFX942_FORWARD[D]
    amd_device("gfx950")
    assert attention.gpu_plan(D) == attention.GPU_PLANS["gfx950"][D]
    assert attention.gpu_plan(D).stages == GFX942_FORWARD[D].stages + 1


@pytest.mark.parametrize("unified, D", sorted(GFX942_DECODE_STAGES))
def test_decode_takes_its_targets_ring_depth(amd_device, unified, D):
    shape = attention_decode.DecodeShape(1, 1, 8, 1, D, 64, 4)
    for arch, stages in (("gfx942", GFX942_DECODE_STAGES[unified, D]), ("gfx950", 3)):
        q = torch.empty(1, 1, 8, D, device=amd_device(arch))
        plan = attention_decode.decode_plan(shape, q, unified)
        base = (attention_decode.UNIFIED_DECODE_PLANS if unified else attention_decode.DECODE_PLANS)[D]
        assert plan.stages == stages and (plan.rows, plan.keys) == (base.rows, base.keys), arch


def test_the_quantized_gemm_rings_are_as_deep_as_the_targets_lds_holds(amd_device):
    for arch, stages in (("gfx942", 2), ("gfx950", 3)):
        amd_device(arch)
        p = quant_gemm.plan(4096, 4096, 4096, 128, 304, target=targets.plan_target())
        assert (p.BM, p.BN, p.BK, p.stages) == (128, 128, 64, stages), arch
        assert quant_gemm.plan(1, 4096, 4096, 128, 304, target=targets.plan_target()).stages == 1     # decode
    assert quant_gemm.plan(4096, 4096, 4096, 128, 132).stages == 3         # NVIDIA


@pytest.mark.parametrize("block_m", [16, 64, 128])
def test_the_moe_expert_gemms_take_their_targets_rings(amd_device, block_m):
    """The multi-kernel expert GEMMs' plan at BM = block_m (`plan.gpu_plans`): gfx950 runs the shipped rings,
    gfx942 (and gfx90a) shallower ones that its 64 KiB holds, pipelined, for bf16 and int4 / fp8 weights; fp8
    activations have no gfx942 plan (its fp8 MFMA reads fnuz fp8), and the error says what to use."""
    def at(plans: dict) -> moe_plans.Plan:
        return next(p for p in plans.values() if p.BM == block_m)
    for arch, key in (("gfx942", "gfx942"), ("gfx950", "gfx950"), ("gfx90a", "gfx942")):
        t = torch.empty(1, dtype=torch.bfloat16, device=amd_device(arch))
        bf16, quantized = mlp.tiles(block_m, t), mlp.tiles(block_m, t, quantized=True)
        assert (bf16, quantized) == (at(moe_plans.gpu_plans(key)), at(moe_plans.gpu_plans(key, "quantized"))), arch
        assert min(bf16.gate_up.stages, bf16.down.stages, quantized.gate_up.stages, quantized.down.stages) >= 2
        assert (bf16 == at(moe_plans.SHIPPED)) == (key == "gfx950"), arch
        if key == "gfx950":
            assert mlp.tiles(block_m, t, fp8=True) == at(moe_plans.FP8)
        else:
            with pytest.raises(ValueError, match="gfx942 runs no fp8-activation expert GEMMs.*fp8_activations=False"):
                mlp.tiles(block_m, t, fp8=True)


@pytest.mark.parametrize("tokens, regime", [(1, "decode"), (512, "middle"), (4096, "prefill")])
def test_the_one_launch_moe_layer_takes_its_targets_plan(amd_device, tokens, regime):
    """Qwen3-30B-A3B's routing (128 experts, top-8): the regime `plan.plan` picks, at its AMD target's rings
    (`plan.AMD_ONE_LAUNCH`): gfx950's as deep as the multi-kernel plans', gfx942's shallower; gfx90a runs gfx942's."""
    for arch, key in (("gfx942", "gfx942"), ("gfx950", "gfx950"), ("gfx90a", "gfx942")):
        x = torch.empty(tokens, 1, dtype=torch.bfloat16, device=amd_device(arch))
        assert persistent._tiles(x, tokens, 8, 128, None) == moe_plans.AMD_ONE_LAUNCH[key][regime], arch
    assert moe_plans.AMD_ONE_LAUNCH["gfx950"][regime].gate_up.stages == moe_plans.SHIPPED[regime].gate_up.stages
    gfx942 = moe_plans.AMD_ONE_LAUNCH["gfx942"][regime]     # the shipped plan's rings outgrow its LDS
    assert gfx942.gate_up.stages >= 2 and moe_plans.ring_bytes(gfx942) <= targets.lds_bytes("gfx942") < \
        moe_plans.ring_bytes(moe_plans.SHIPPED[regime])


def test_the_attention_backward_takes_its_targets_plan(amd_device):
    """gfx942's one-stage backward kernels, unchanged; gfx950's two-stage rings, the same tiles."""
    one = Plan(32, 64, 4, stages=1), Plan(64, 64, 4, stages=1)
    plan = attention.bwd_gpu_plan(64, amd_device("gfx942"))
    assert (plan.kv, plan.q, plan.atomic_dq) == (*one, True)
    plan = attention.bwd_gpu_plan(64, amd_device("gfx950"))
    assert (plan.kv, plan.q) == tuple(attention.dataclasses.replace(p, stages=2) for p in one) and plan.atomic_dq


class _GpuTensor:
    """An argument on a GPU as the GEMM's prune hook sees it (a ROCm torch names its devices "cuda" too)."""
    device = torch.device("cuda", 0)


@pytest.mark.parametrize("arch, key", [("gfx942", "gfx942"), ("gfx950", "gfx950"), ("gfx90a", "gfx942")])
def test_the_gemm_tunes_over_its_targets_configs(amd_device, monkeypatch, arch, key):
    """On a ROCm device the GEMM's autotuner keeps the common configs at its plan target's depth
    (`gemm_configs.BY_AMD_TARGET`): gfx942's 128 x 128 x 64 tile 2 deep, not the 3 that NVIDIA GPUs take."""
    amd_device(arch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: pytest.fail("not an NVIDIA GPU"))
    kept = gemm_configs.prune_for_device(list(gemm_configs.ALL), {"a_ptr": _GpuTensor(), "M": 64})
    assert kept == gemm_configs.BY_AMD_TARGET[key]
    assert kept[0].kwargs["STAGES"] == (2 if key == "gfx942" else gemm_configs.COMMON[0].kwargs["STAGES"])


@pytest.mark.gpu
@pytest.mark.amdgpu
def test_an_amd_gpu_takes_the_plans_of_its_own_target():
    """On an MI300 / MI355 (never run yet: this project has no AMD GPU): torch's gcnArchName ("gfx950:sramecc+:
    xnack-") gives the plan key, so an MI355 takes GPU_PLANS["gfx950"], not gfx942's."""
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None) is None:
        pytest.skip("needs a ROCm build of torch with an AMD GPU")
    arch = targets.device_arch()
    assert arch.startswith("gfx") and ":" not in arch
    assert targets.plan_target() == targets.amd_plan_target(arch)
    if arch == "gfx950":
        assert attention.gpu_plan(128) == attention.GPU_PLANS["gfx950"][128]
