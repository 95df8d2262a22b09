"""Which forward plan `tessera::attention` launches on a GPU: on Hopper the warp-specialized one at head dim 128
from 1024 keys (where H100 run 9 timed it faster), TESSERA_ATTENTION_WS=0/1 overriding; never for varlen, fp8
or fused hooks, and never off Hopper. No GPU needed: the launch is caught before it reaches the kernel."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import importlib  # noqa: E402

attention_module = importlib.import_module("tessera.kernels_lib.attention")
from tessera.kernels_lib.attention import (GPU_PLANS, OVERLAP_ENV, PINGPONG_ENV, WS_ENV, WS_GPU_PLANS,  # noqa: E402
                                           Problem, wants_warp_specialization)


class CaughtLaunch(Exception):
    """Raised by the stand-in kernel: the launch's options, instead of running it."""


class Recorder:
    """Stands in for attention_fwd_kernel: `kernel[grid](*args, **options)` raises CaughtLaunch(options)."""

    def __getitem__(self, grid):
        def launch(*args, **options):
            raise CaughtLaunch(options)
        return launch


@pytest.fixture
def hopper(monkeypatch):
    """A CUDA build of torch on compute capability 9.0, with the interpreter off and the kernel caught."""
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(attention_module, "_on_interpreter", lambda q: False)
    monkeypatch.setattr(attention_module, "attention_fwd_kernel", Recorder())
    monkeypatch.delenv(WS_ENV, raising=False)
    monkeypatch.delenv(OVERLAP_ENV, raising=False)
    monkeypatch.delenv(PINGPONG_ENV, raising=False)
    return monkeypatch


def launched(S: int, D: int = 128, causal: bool = False, **forward_options) -> dict:
    """The options the forward launches its kernel with, for q, k, v of (1, S, 2, D) (on the CPU: never run)."""
    q = k = v = torch.zeros(1, S, 2, D, dtype=torch.bfloat16)
    problem = Problem.of(q, k, None, None, S, S, causal, -1, -1, 0.0, None)
    with pytest.raises(CaughtLaunch) as caught:
        attention_module._forward(q, k, v, problem, **forward_options)
    return caught.value.args[0]


@pytest.mark.parametrize("S, ws", [(512, False), (1023, False), (1024, True), (16384, True)])
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_head_dim_128_takes_the_warp_specialized_plan_from_1024_keys(hopper, S, ws, causal):
    options = launched(S, causal=causal)
    plan = WS_GPU_PLANS[128] if ws else GPU_PLANS["nvidia"][128]
    assert (options["WS"], options["BM"], options["BN"], options["num_warps"]) == \
        (ws, plan.BM, plan.BN, plan.num_warps)


@pytest.mark.parametrize("setting, S, ws", [("1", 512, True), ("0", 4096, False), ("auto", 4096, True),
                                            (" AUTO ", 512, False), ("", 2048, True)])
def test_the_environment_overrides_the_choice(hopper, setting, S, ws):
    hopper.setenv(WS_ENV, setting)
    assert launched(S)["WS"] is ws


def test_head_dim_64_warp_specializes_only_when_asked(hopper):
    """Untimed on a GPU: the default plan unless TESSERA_ATTENTION_WS=1."""
    assert launched(4096, D=64)["WS"] is False
    hopper.setenv(WS_ENV, "1")
    assert launched(4096, D=64)["WS"] is True


def test_no_warp_specialization_off_hopper_or_for_fp8_or_a_given_plan(hopper):
    """(4096 keys: where head dim 128 on Hopper would take it.)"""
    hopper.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert launched(4096)["WS"] is False
    hopper.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert launched(4096, descales=torch.ones(3), out_dtype=torch.bfloat16)["WS"] is False
    assert launched(4096, plan=GPU_PLANS["nvidia"][128])["WS"] is False


def test_a_bad_setting_names_the_variable_and_the_values(monkeypatch):
    monkeypatch.setenv(WS_ENV, "yes")
    with pytest.raises(ValueError, match=r"TESSERA_ATTENTION_WS='yes' is not understood; set it to 1 .* 0 .* auto"):
        wants_warp_specialization(128, 4096)


@pytest.mark.parametrize("ws_setting", ["0", "1"])
@pytest.mark.parametrize("D, overlap", [(64, True), (128, True), (256, False)])
def test_the_overlapped_order_is_taken_on_hopper_when_asked(hopper, ws_setting, D, overlap):
    """TESSERA_ATTENTION_OVERLAP=1: FlashAttention-3's loop order on both Hopper plans of head dims 64 and 128
    (head dim 256's would leave no register headroom); unset: FlashAttention-2's, until a GPU run times it."""
    hopper.setenv(WS_ENV, ws_setting)
    assert launched(4096, D=D)["OVERLAP"] is False
    hopper.setenv(OVERLAP_ENV, "1")
    options = launched(4096, D=D)
    assert options["OVERLAP"] is overlap and options["WS"] is (ws_setting == "1" and D != 256)


def test_the_overlapped_order_is_not_taken_off_hopper_or_for_fp8(hopper):
    hopper.setenv(OVERLAP_ENV, "1")
    assert launched(4096, descales=torch.ones(3), out_dtype=torch.bfloat16)["OVERLAP"] is False
    hopper.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert launched(4096)["OVERLAP"] is False
    hopper.setenv(OVERLAP_ENV, "yes")
    with pytest.raises(ValueError, match="TESSERA_ATTENTION_OVERLAP='yes' is not understood"):
        launched(4096)


@pytest.mark.parametrize("ws_setting, pingpong", [("1", True), ("0", False)])
def test_the_ping_pong_is_taken_with_the_warp_specialized_overlapped_plan(hopper, ws_setting, pingpong):
    """TESSERA_ATTENTION_PINGPONG=1 (with ..._OVERLAP=1): the warp-specialized plan's two consumer warpgroups
    take turns; the plan without a producer has no turns to take (its warpgroups meet at a CTA barrier each
    iteration), and without OVERLAP=1 nothing changes."""
    hopper.setenv(WS_ENV, ws_setting)
    hopper.setenv(PINGPONG_ENV, "1")
    assert launched(4096)["PINGPONG"] is False
    hopper.setenv(OVERLAP_ENV, "1")
    options = launched(4096)
    assert (options["PINGPONG"], options["OVERLAP"], options["WS"]) == (pingpong, True, ws_setting == "1")
