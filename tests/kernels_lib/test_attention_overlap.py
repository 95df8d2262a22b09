"""The forward in FlashAttention-3's loop order (the kernel's OVERLAP, `TESSERA_ATTENTION_OVERLAP=1`): S = Q K_n^T
and O * alpha + P V_{n-1} issued back to back, block n's softmax while P V runs (`passes/defer_wgmma_wait.py`
leaves one wgmma group in flight there), on every shipped sm_90a plan it applies to: the waits in the thread IR
and the SASS, no spills, the SIMT simulator and the interpreter against float64 attention; and its warpgroup
ping-pong (PINGPONG, with WS: each consumer warpgroup's copy of the loop takes turns at named barriers 3 and 4).
Which launches take them: test_attention_plan_choice.py.

Registers (ptxas 13.0, bf16, plain / window-softcap-varlen): head dim 128 205 -> 189 / 240 (FA2 order ->
overlapped; 256 threads, one CTA an SM either way), head dim 64 119 -> 148 / 189; the warp-specialized plans
report the 168 of their 384-thread entry, the consumers running under `setmaxnreg.inc 232`. (Head dim 256 stays
in FlashAttention-2's order: `OVERLAP_HEAD_DIMS`.)
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera.backends.nvptx import find_ptxas  # noqa: E402
from tessera.backends.nvptx.sass import disassemble, find_cuobjdump, loop_containing  # noqa: E402
from tessera.kernels_lib import attention  # noqa: E402
from tessera.kernels_lib.attention import GPU_PLANS, OVERLAP_ENV, OVERLAP_HEAD_DIMS, WS_GPU_PLANS  # noqa: E402
from tessera.kernels_lib.attention_fwd import attention_fwd_kernel  # noqa: E402

from attention_reference import attention as reference  # noqa: E402
from sass_checks import assert_wgmma_descriptors_built  # noqa: E402
from test_attention import CASES, check, qkv  # noqa: E402
from test_attention_compile import FORWARD_SIGNATURE, VARIANTS, WS_VARIANTS, compile_checked  # noqa: E402
from test_attention_compile import forward_on_the_simulator  # noqa: E402

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")


def key_loop_waits(fn) -> list[int]:
    """The `pending` of each wgmma_wait in the (consumers') key loop of the lowered forward kernel `fn`."""
    loops = [op for op in fn.walk() if op.name == "for" and any(inner.name == "wgmma" for inner in op.walk())]
    return [op.attrs["pending"] for op in loops[-1].regions[0].ops if op.name == "wgmma_wait"]


HOPPER_PLANS = [(D, ws, variant) for D in OVERLAP_HEAD_DIMS for ws in (False, True) if D in WS_GPU_PLANS or not ws
                for variant in (WS_VARIANTS if ws else VARIANTS)]


@needs_ptxas
@pytest.mark.parametrize("D, ws, variant", HOPPER_PLANS)
def test_every_overlapped_hopper_plan_waits_for_s_with_p_v_in_flight_without_spills(D, ws, variant):
    """In the key loop, the wait before the softmax leaves one group (P V) in flight and the one before the
    rescale none; ptxas keeps them (the SASS loop's waits are `WARPGROUP.DEPBAR.LE gsb0, 0x1` then `0x0`, where
    FlashAttention-2's order has two of depth 0; no serialization of the wgmmas) and spills nothing."""
    plan = (WS_GPU_PLANS if ws else GPU_PLANS["nvidia"])[D]
    options = (WS_VARIANTS if ws else VARIANTS)[variant]
    compiled = compile_checked(attention_fwd_kernel, "sm_90a", signature=FORWARD_SIGNATURE.format(t="bf16"),
                               num_warps=plan.num_warps, D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages, WS=ws,
                               OVERLAP=True, **options)
    metadata = compiled.metadata
    assert metadata["spill_stores"] == metadata["spill_loads"] == 0, f"{metadata['registers']} registers"
    assert "serialized" not in metadata["log"], metadata["log"]
    thread_ir = compiled.stages["thread_ir"]
    assert thread_ir.count("wgmma_wait {pending = 1}") == 1
    ptx = compiled.stages["ptx"]
    assert len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx)) == 1, "the depth-1 wait survives LLVM"
    if find_cuobjdump() is None or compiled.binary is None:
        return
    loop = loop_containing(disassemble(compiled.binary), "HGMMA")
    depbars = [i.text.strip() for i in loop if "WARPGROUP.DEPBAR" in i.text]
    assert depbars == ["WARPGROUP.DEPBAR.LE gsb0, 0x1", "WARPGROUP.DEPBAR.LE gsb0, 0x0"], depbars
    assert_wgmma_descriptors_built(compiled)


@pytest.mark.parametrize("ws, num_warps, BM", [(False, 4, 64), (False, 8, 128), (True, 8, 128)])
def test_overlapped_forward_on_the_simt_simulator_matches_float64_attention(ws, num_warps, BM):
    """sm_90a, 2 x 70 queries x 50 keys, causal with Sq > Sk (the first 20 rows see no key), GQA 2:1: one and two
    consumer warpgroups, and warp-specialized. The first block's softmax comes before the loop and the last
    P V after it; the simulator reports any read of a wgmma result in flight and any ring slot refilled while
    a wgmma reads it."""
    o, lse, expected_o, expected_lse = forward_on_the_simulator("sm_90a", num_warps, BM, ws=ws, overlap=True,
                                                                check_waits=lambda fn: key_loop_waits(fn) == [1, 0])
    torch.testing.assert_close(o.double(), expected_o, rtol=2e-3, atol=2e-3)
    assert torch.isinf(lse[:, :, :20]).all()
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(CASES))
def test_the_overlapped_order_matches_float64_attention_on_the_interpreter(name, monkeypatch):
    """Every masking corner case of test_attention.py (causal with Sq != Sk, windows, softcap, GQA/MQA, odd
    lengths, one key) in the overlapped order: a row block that sees no key still runs its peeled first block,
    fully masked, and comes out O = 0, LSE = +inf."""
    monkeypatch.setenv(OVERLAP_ENV, "1")
    B, Sq, Sk, H, H_kv, D, options = CASES[name]
    q, k, v = qkv(B, Sq, Sk, H, H_kv, D, seed=len(name))
    out, lse = attention(q, k, v, **options)
    window = options.get("window", (-1, -1))
    window = (window, window) if isinstance(window, int) else window
    check(out, lse, *reference(q, k, v, options.get("causal", False), window, options.get("softcap", 0.0),
                               options.get("scale")))


@pytest.mark.parametrize("D", [64, 128, 256])
def test_the_overlapped_order_at_the_gpu_head_dims_on_the_interpreter(D, monkeypatch):
    monkeypatch.setenv(OVERLAP_ENV, "1")
    q, k, v = qkv(1, 40, 70, 2, 1, D, dtype=torch.bfloat16, seed=D)
    out, lse = attention(q, k, v, causal=True)
    check(out, lse, *reference(q, k, v, True))



# -- FlashAttention-3's warpgroup ping-pong (PINGPONG, with WS and OVERLAP) -----------------------------------

def turn_loop(code, barrier: int) -> list:
    """The innermost loop of the SASS that waits at named barrier `barrier`."""
    return loop_containing(code, lambda inst: inst.text.startswith(f"BAR.SYNC.DEFER_BLOCKING {barrier:#x},"))


@needs_ptxas
@pytest.mark.parametrize("variant", list(WS_VARIANTS))
@pytest.mark.parametrize("D", sorted(WS_GPU_PLANS))
def test_ping_pong_plans_take_turns_around_their_products_without_spills(D, variant):
    """Each consumer warpgroup runs a copy of the key loop: warpgroup 0 waits at barrier 3 before issuing S and
    P V and hands the turn on at barrier 4 right after (`bar.arrive`), warpgroup 1 the other way round; both
    copies keep the depth-1 wait; no spills, no serialized wgmmas."""
    plan = WS_GPU_PLANS[D]
    compiled = compile_checked(attention_fwd_kernel, "sm_90a", signature=FORWARD_SIGNATURE.format(t="bf16"),
                               num_warps=plan.num_warps, D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages, WS=True,
                               OVERLAP=True, PINGPONG=True, **WS_VARIANTS[variant])
    metadata = compiled.metadata
    assert metadata["spill_stores"] == metadata["spill_loads"] == 0 and "serialized" not in metadata["log"]
    thread_ir = compiled.stages["thread_ir"]
    assert thread_ir.count("pingpong_turn = [3, 4]") == thread_ir.count("pingpong_turn = [4, 3]") == 1
    assert thread_ir.count("wgmma_wait {pending = 1}") == 2
    if find_cuobjdump() is None or compiled.binary is None:
        return
    code = disassemble(compiled.binary)
    for mine, other in ((3, 4), (4, 3)):
        ops = [i.text if "DEPBAR" in i.text else i.text.split(",")[0] for i in turn_loop(code, mine)
               if i.opcode.startswith(("BAR", "HGMMA", "WARPGROUP.DEPBAR"))]
        hgmmas = [k for k, o in enumerate(ops) if o.startswith("HGMMA")]
        assert len(hgmmas) == D // 16 + plan.BN // 16, ops          # S's K slices, then P V's
        assert ops.index(f"BAR.SYNC.DEFER_BLOCKING {mine:#x}") < hgmmas[0] and hgmmas[-1] < \
            ops.index(f"BAR.ARV {other:#x}") < ops.index("WARPGROUP.DEPBAR.LE gsb0, 0x1"), ops
        assert [o for o in ops if o.startswith("WARPGROUP")] == ["WARPGROUP.DEPBAR.LE gsb0, 0x1",
                                                                 "WARPGROUP.DEPBAR.LE gsb0, 0x0"], ops


@needs_ptxas
@pytest.mark.parametrize("pingpong", [False, True])
@pytest.mark.parametrize("D", sorted(set(WS_GPU_PLANS) & set(OVERLAP_HEAD_DIMS)))
def test_warp_specialized_overlapped_plans_load_the_last_v_block_from_the_producer(D, pingpong):
    """FlashAttention-3's producer loads the last V block (read by the P V after the key loop) after its loop's
    fills, so it lands while the consumers run their last iterations (`schedule/tail_operands.py`); the
    consumers issue no TMA load (Q and K_lo come from thread 0 before the split) and wait for V at the P V."""
    plan = WS_GPU_PLANS[D]
    compiled = compile_checked(attention_fwd_kernel, "sm_90a", signature=FORWARD_SIGNATURE.format(t="bf16"),
                               num_warps=plan.num_warps, D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages, WS=True,
                               OVERLAP=True, PINGPONG=pingpong, **WS_VARIANTS["plain"])
    thread_ir = compiled.stages["thread_ir"].splitlines()        # (structured: PTX may place blocks anywhere)
    start = next(k for k, line in enumerate(thread_ir) if '"dec"' in line)
    split = next(k for k, line in enumerate(thread_ir) if '"inc"' in line)
    assert not [line for line in thread_ir[split:] if "tma_load" in line], "no TMA load in the consumers' branch"
    ptx = compiled.stages["ptx"]
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.\w+\.shared", ptx)) == (D // 64) * 5    # Q, K_lo, K, V, V_hi-1
    fills = next(k for k in range(start, split) if re.search(r"= for ", thread_ir[k]))
    after = [re.search(r"%(\w+)_ptr_tma", line).group(1) for line in thread_ir[fills:split] if "tma_load" in line
             and len(line) - len(line.lstrip()) <= len(thread_ir[fills]) - len(thread_ir[fills].lstrip())]
    assert after == ["v"] * (D // 64), f"the producer's loads after its fill loop: {after}"


def test_the_producers_last_v_block_read_without_its_wait_is_reported(monkeypatch):
    """The consumers' wait for the producer's last V block is what orders their P V after its landing: bound
    without it (`tail_operands.bind` leaving out the owed wait), the SIMT simulator reports the read."""
    from tessera.passes.schedule import tail_operands
    bind = tail_operands.bind

    def without_wait(ctx, operands):
        bind(ctx, operands)
        for tail in operands:
            del ctx.landing[tail.load.result]
    monkeypatch.setattr(tail_operands, "bind", without_wait)
    with pytest.raises(Exception, match="before the mbarrier_wait that completes its tma_load"):
        forward_on_the_simulator("sm_90a", 8, 128, ws=True, overlap=True)


def test_ping_pong_forward_on_the_simt_simulator_matches_float64_attention():
    """The two consumer warpgroups run their copies as cooperating paths: a turn that never comes is a DEADLOCK,
    an arrival never matched an error at the block's end; O and LSE as before."""
    o, lse, expected_o, expected_lse = forward_on_the_simulator("sm_90a", 8, 128, ws=True, overlap=True,
                                                                pingpong=True)
    torch.testing.assert_close(o.double(), expected_o, rtol=2e-3, atol=2e-3)
    assert torch.isinf(lse[:, :, :20]).all()
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-4, atol=1e-4)


def test_ping_pong_with_one_consumer_warpgroup_says_what_it_needs():
    with pytest.raises(tessera.CompileError, match=r"pingpong=True takes turns between two consumer warpgroups "
                                                   r"issuing wgmmas; this loop has 1 warpgroup\(s\): launch "
                                                   r"num_warps=8 on sm_90a, or drop pingpong=True"):
        attention_fwd_kernel.compile(target="sm_90a", strict=True, signature=FORWARD_SIGNATURE.format(t="bf16"),
                                     num_warps=4, D=64, BM=64, BN=64, STAGES=2, WS=True, OVERLAP=True,
                                     PINGPONG=True, **VARIANTS["plain"])
