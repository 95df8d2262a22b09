"""AMD's 8-wave ping-pong for the attention forward (`passes/wave_pingpong.py`, TESSERA_ATTENTION_AMD_PINGPONG):
the lowered kernel computes on the SIMT simulator what float64 attention computes, with its two wave groups one
s_barrier apart; a group that skips a barrier is caught; the AMDGCN for gfx942 and gfx950 raises the priority
around every MFMA cluster, has the groups' extra barriers, and spills nothing at the shipped plans."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

from tessera.backends.interp.errors import InterpreterError  # noqa: E402
from tessera.kernels_lib.attention import AMD_PINGPONG_PLANS, GPU_PLANS  # noqa: E402
from tessera.kernels_lib.attention_fwd import attention_fwd_kernel  # noqa: E402

from amdgcn_phases import barrier_count, instructions, mfmas_outside_priority, phases  # noqa: E402
from amd_spills import amd_spills  # noqa: E402
from test_attention_compile import FORWARD_SIGNATURE, VARIANTS, forward_on_the_simulator  # noqa: E402

AMD_TARGETS = ("gfx942", "gfx950")


def _branches(fn):
    """(group 0's block, group 1's block) of the `if` the pass put around the key loop."""
    split = next(op for op in fn.body.ops if op.name == "if"
                 and any(inner.name == "for" and inner.attrs.get("pingpong") for inner in op.walk()))
    return split.regions


@pytest.mark.parametrize("target, num_warps, BM, causal", [
    ("gfx942", 4, 64, True),        # two groups of 2 waves; Sq = 70: group 1's program is the second row block
    ("gfx950", 4, 64, False),
    ("gfx942", 2, 32, True),        # one wave a group: 3 row blocks in 2 blocks (one program past the grid), and
])                                  # causal rows 0-31 see 1 key block, 32-63 see 2: the balancing barriers run
def test_pingpong_forward_on_the_simt_simulator_matches_float64_attention(target, num_warps, BM, causal):
    shapes = {}

    def check(fn):
        shapes.update(threads=fn.attrs["num_threads"], programs=fn.attrs["programs_per_block"])
        return True
    o, lse, expected_o, expected_lse = forward_on_the_simulator(target, num_warps, BM, causal=causal,
                                                                pingpong=True, check_waits=check)
    assert shapes == {"threads": num_warps * 64, "programs": 2}
    torch.testing.assert_close(o.double(), expected_o, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-4, atol=1e-4)


def test_the_pass_staggers_the_groups_and_brackets_each_mfma_cluster():
    """The IR the pass leaves (gfx942, two groups of 2 waves): group 1 opens with an unfenced phase barrier,
    group 0 closes with one; each copy's loop barriers are fenced phase barriers between scheduling fences; each
    phase's MFMAs sit between set_priority 1 and 0; the block is twice the program's threads and shared memory."""
    seen = {}

    def check(fn):
        first, second = _branches(fn)
        seen["first"] = [op.name + ("/fenced" if op.attrs.get("fenced") else "") for op in first.ops]
        seen["second"] = [op.name + ("/fenced" if op.attrs.get("fenced") else "") for op in second.ops]
        loop = next(op for op in first.ops if op.name == "for")
        seen["body"] = [op for op in loop.regions[0].ops]
        seen["uniform"] = [op for op in fn.walk() if op.name == "wave_uniform"]
        seen["shared"] = fn.attrs["shared_bytes"]
        return True
    forward_on_the_simulator("gfx942", 4, 64, pingpong=True, check_waits=check)
    assert seen["second"][:4] == ["sched_fence", "phase_barrier", "sched_fence", "for"], "group 1: the stagger"
    assert seen["first"][-4:] == ["sched_fence", "phase_barrier", "sched_fence", "yield"], "group 0: closing"
    assert seen["first"].count("for") == seen["second"].count("for") == 2, "the loop and its balancing loop"
    assert len(seen["uniform"]) == 1
    body = seen["body"]
    names = [op.name for op in body]
    assert "barrier" not in names and names.count("phase_barrier") >= 4
    for i, op in enumerate(body):
        if op.name == "phase_barrier":
            assert op.attrs["fenced"] and names[i - 1] == names[i + 1] == "sched_fence"
    level = 0
    for op in body:
        if op.name == "set_priority":
            level = op.attrs["level"]
        assert not (op.name == "mfma" and level != 1), "an MFMA outside its raised-priority window"
        assert not (op.name == "phase_barrier" and level != 0), "a window spans a barrier"
    assert names.count("set_priority") == 4, "two MFMA clusters (S = Q K^T, O += P V), each raised and lowered"


@pytest.mark.parametrize("drop", ["closing", "balance"])
def test_a_group_that_skips_barriers_is_caught(drop):
    """Drop group 0's closing barrier, or the balancing barriers of the group with fewer key blocks (causal, one
    wave a group: rows 0-31 see one key block, 32-63 two): the other group waits at a barrier round that never
    completes, which the simulator reports (on the GPU the block would hang)."""
    def unbalance(fn):
        first, _ = _branches(fn)
        if drop == "closing":
            first.ops = [op for op in first.ops if op.name != "phase_barrier"]
        else:
            balance = [op for op in first.ops if op.name == "for"][1]
            balance.regions[0].ops = [op for op in balance.regions[0].ops if op.name != "phase_barrier"]
        return True
    with pytest.raises(InterpreterError, match=r"DEADLOCK|never reached|twice in one round"):
        forward_on_the_simulator("gfx942", 2, 32, causal=True, pingpong=True, check_waits=unbalance)


def compile_pingpong(target, D, plan, variant):
    return attention_fwd_kernel.compile(target=target, strict=True, signature=FORWARD_SIGNATURE.format(t="bf16"),
                                        num_warps=plan.num_warps, D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages,
                                        WS=False, PINGPONG=plan.pingpong, **VARIANTS[variant])


@pytest.mark.parametrize("variant", ["plain", "window-softcap-varlen"])
@pytest.mark.parametrize("D", sorted(AMD_PINGPONG_PLANS))
@pytest.mark.parametrize("target", AMD_TARGETS)
def test_every_amd_pingpong_plan_compiles_without_scratch(target, D, variant):
    """512 threads (8 waves, 2 programs), each group's own LDS, no SGPR or VGPR spills and no scratch; in the AMDGCN every
    v_mfma lies inside an `s_setprio 1` .. `s_setprio 0` window with no s_barrier in it (LLVM kept the clusters
    between the sched_barriers), and the s_barriers are the plain kernel's plus the second loop copy's and the
    ones the stagger adds: group 1's opening barrier, group 0's closing one and, where the groups' trip counts
    may differ (a window), each group's balancing loop."""
    plan = AMD_PINGPONG_PLANS[D]
    compiled = compile_pingpong(target, D, plan, variant)
    metadata, assembly = compiled.metadata, compiled.stages["amdgcn"]
    assert metadata["num_threads"] == 512 and metadata["max_flat_workgroup_size"] == 512
    assert amd_spills(metadata) == {}, metadata
    assert metadata["vgpr_count"] + metadata.get("agpr_count", 0) <= 256, "8 waves: 2 a SIMD, 256 registers each"
    assert re.findall(r"\bv_mfma_f32_\w+", assembly) and mfmas_outside_priority(assembly) == []
    assert "v_readfirstlane_b32" in assembly, "the group id is a scalar: the branches around the barriers are too"
    lines = instructions(assembly)
    assert any(re.match(r"s_cbranch_scc[01] ", a) and b == "s_barrier" for a, b in zip(lines, lines[1:])), \
        "the stagger: a scalar branch on the group, one side opening with an s_barrier"
    thread_ir = compiled.stages["thread_ir"]
    loop_barriers = _loop_barriers(thread_ir)
    plain = attention_fwd_kernel.compile(target=target, strict=True, signature=FORWARD_SIGNATURE.format(t="bf16"),
                                         num_warps=plan.num_warps // 2, D=D, BM=plan.BM, BN=plan.BN, STAGES=1,
                                         WS=False, **VARIANTS[variant])
    # without a window the groups' key loops have equal trip counts: LLVM folds the balancing loops away
    windowed = VARIANTS[variant]["HAS_LEFT"] or VARIANTS[variant]["HAS_RIGHT"]
    assert barrier_count(assembly) == barrier_count(plain.stages["amdgcn"]) + loop_barriers + (4 if windowed else 2)
    raised = [p for p in phases(assembly) if p.mfma]
    assert raised and all(p.priority[:1] == [1] and p.priority[-1:] == [0] for p in raised)


def _loop_barriers(thread_ir) -> int:
    """Fenced phase barriers in one copy of the key loop (thread IR text)."""
    text = str(thread_ir)
    return text.count("phase_barrier {fenced = true}") // 2


def test_the_plans_are_the_4_wave_tiles_doubled_where_they_fit():
    """Each ping-pong plan runs 8 waves (two groups of 4), one stage (no ring), and its tiles differ from the
    4-wave plan's only where 256 registers a wave demand it (see AMD_PINGPONG_PLANS)."""
    for D, plan in AMD_PINGPONG_PLANS.items():
        assert plan.num_warps == 8 and plan.stages == 1 and plan.pingpong and not plan.ws
        assert not any(GPU_PLANS[target][D].pingpong for target in ("gfx942", "gfx950"))


@pytest.mark.gpu
@pytest.mark.amdgpu
@pytest.mark.parametrize("D", sorted(AMD_PINGPONG_PLANS))
@pytest.mark.parametrize("causal", [False, True])
def test_pingpong_forward_matches_the_reference_on_an_amd_gpu(D, causal, monkeypatch):
    """On an MI300/MI355 (never run yet: this project has no AMD GPU): TESSERA_ATTENTION_AMD_PINGPONG=1 launches
    the 8-wave plan (the launcher halves grid axis 0: two programs a block), which must match float64 attention on the problem the Hopper GPU tests
    use (odd lengths, Sq != Sk, GQA 2:1). What a timing run should show next: bench/attention.py --part forward
    with the variable set and unset, in one session."""
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None) is None:
        pytest.skip("needs a ROCm build of torch with an AMD GPU")
    from tessera.kernels_lib import attention
    from tessera.kernels_lib.attention import AMD_PINGPONG_ENV
    from attention_reference import attention as reference
    monkeypatch.setenv(AMD_PINGPONG_ENV, "1")
    monkeypatch.delenv("TESSERA_STRICT", raising=False)
    q, k, v = (torch.randn(2, n, h, D, device="cuda", dtype=torch.bfloat16) for n, h in ((200, 4), (333, 2), (333, 2)))
    out, lse = attention(q, k, v, causal=causal)
    expected, expected_lse = reference(q.cpu(), k.cpu(), v.cpu(), causal)
    torch.testing.assert_close(out.cpu().double(), expected, rtol=2e-2, atol=2e-2)
    finite = ~torch.isinf(expected_lse)
    torch.testing.assert_close(lse.cpu().double()[finite], expected_lse[finite], rtol=1e-3, atol=1e-3)


def test_the_amd_pingpong_variable_takes_the_plan(monkeypatch):
    """On a ROCm build (faked here), TESSERA_ATTENTION_AMD_PINGPONG=1 gives the ping-pong plan for head dims 64
    and 128 and the 4-wave plan otherwise; unset, always the 4-wave plan; anything but 0/1 is an error."""
    import importlib
    attention_module = importlib.import_module("tessera.kernels_lib.attention")    # (the package exports the op)
    from tessera.kernels_lib import targets
    monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)
    monkeypatch.setattr(targets, "device_arch", lambda device=None: "gfx942")
    monkeypatch.setenv(attention_module.AMD_PINGPONG_ENV, "1")
    assert attention_module.wants_amd_pingpong()
    for D in (64, 128, 256):
        want = AMD_PINGPONG_PLANS.get(D, GPU_PLANS["gfx942"][D])
        assert attention_module.gpu_plan(D, amd_pingpong=attention_module.wants_amd_pingpong()) == want
    monkeypatch.delenv(attention_module.AMD_PINGPONG_ENV)
    assert not attention_module.wants_amd_pingpong()
    assert attention_module.gpu_plan(64, amd_pingpong=False) == GPU_PLANS["gfx942"][64]
    monkeypatch.setenv(attention_module.AMD_PINGPONG_ENV, "yes")
    with pytest.raises(ValueError, match="TESSERA_ATTENTION_AMD_PINGPONG='yes' is not understood"):
        attention_module.wants_amd_pingpong()
