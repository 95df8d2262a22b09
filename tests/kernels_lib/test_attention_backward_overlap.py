"""The backward kernels in their OVERLAP order (`attention_bwd.py`, `TESSERA_ATTENTION_BWD_OVERLAP=1`): S and dP
issued back to back, dP in flight under P's exp2 and (dK/dV kernel) dV under dS, each behind a depth-1
`wgmma_wait` (`passes/defer_wgmma_wait.py`): the waits in the thread IR and the SASS of every shipped sm_90a
backward plan, no spills, the SIMT simulator against float64 gradients, the interpreter's gradients on every
masking case, and the deterministic mode still deterministic. SASS counts before and after:
docs/perf/attention-backward-h100.md.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tessera.backends.nvptx import find_ptxas  # noqa: E402
from tessera.backends.nvptx.sass import disassemble, find_cuobjdump, loop_containing  # noqa: E402
from tessera.kernels_lib.attention import BWD_OVERLAP_ENV  # noqa: E402

from sass_checks import assert_wgmma_descriptors_built  # noqa: E402
from test_attention_backward import CASES, check_gradients, gradients, qkv  # noqa: E402
from test_attention_compile import VARIANTS, backward_kernels, backward_on_the_simulator  # noqa: E402
from test_attention_compile import compile_checked  # noqa: E402

SM90A_BACKWARD = {case[0]: case for case in backward_kernels("sm_90a")}


def loop_waits(fn) -> list[int]:
    """The `pending` of each wgmma_wait in the innermost loop with wgmmas of lowered kernel `fn` (the query loop
    of the dK/dV kernel, the key loop of the dQ pass)."""
    loops = [op for op in fn.walk() if op.name == "for" and any(inner.name == "wgmma" for inner in op.walk())]
    return [op.attrs["pending"] for op in loops[-1].regions[0].ops if op.name == "wgmma_wait"]


def sass_loop_waits(compiled) -> tuple[list[str], list[str]]:
    """(the loop's HGMMA / wait sequence as 'H' and '0x..' items, every wait's depth) in the SASS of the loop
    holding the HGMMAs."""
    loop = loop_containing(disassemble(compiled.binary), "HGMMA")
    marks = ["H" if i.opcode.startswith("HGMMA") else i.text.split(",")[-1].strip() for i in loop
             if i.opcode.startswith("HGMMA") or i.opcode.startswith("WARPGROUP.DEPBAR")]
    return marks, [m for m in marks if m != "H"]


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name", list(SM90A_BACKWARD))
def test_every_sm90a_backward_plan_in_the_overlap_order_has_depth_1_waits_without_spills(name, variant):
    """Where S and dP are on wgmma (all but head dim 256's dK/dV kernel, whose 32-key blocks put them on
    mma.sync), the thread IR keeps one group in flight at the wait before P (and, in the dK/dV kernel, at the one
    before dS), ptxas issues S's and dP's HGMMAs with no wait between them (a zero accumulator is scale-d 0,
    not zero registers ptxas would tie to S's) and keeps a `WARPGROUP.DEPBAR.LE gsb0, 0x1` in the loop; no
    spills, no serialized wgmmas."""
    _, kernel, signature, D, plan, extra = SM90A_BACKWARD[name]
    compiled = compile_checked(kernel, "sm_90a", signature=signature.format(t="bf16"), num_warps=plan.num_warps,
                               D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages, OVERLAP=True, **extra,
                               **VARIANTS[variant])
    metadata = compiled.metadata
    assert metadata["spill_stores"] == metadata["spill_loads"] == 0, f"{metadata['registers']} registers"
    assert "serialized" not in metadata["log"], metadata["log"]
    if extra.get("TRANSPOSED"):
        return      # S^T and dP^T are 32 x 32: mma.sync, synchronous; only dV^T and dK^T are on wgmma
    depth_1 = 1 if name.endswith("-q") else 2
    assert compiled.stages["thread_ir"].count("wgmma_wait {pending = 1}") == depth_1
    if find_cuobjdump() is None or compiled.binary is None:
        return
    marks, waits = sass_loop_waits(compiled)
    first_wait = marks.index(waits[0])
    assert marks[:first_wait] == ["H"] * (D // 8) and waits[0] == "0x1", marks    # S's D / 16 k-steps, dP's
    assert waits.count("0x1") == depth_1, waits
    assert_wgmma_descriptors_built(compiled)


def test_the_overlap_order_on_the_simt_simulator_matches_float64_gradients():
    """sm_90a, one warpgroup, 40 queries x 50 keys, causal, GQA 2:1: the dK/dV kernel (dQ by atomics) keeps S's
    and dP's groups in flight at depth 1 ([1, 1, 0] in its query loop), the dQ pass S's ([1, 0, 0]); the
    simulator reports any read of a wgmma result before its wait, and the gradients match float64's."""
    expected_waits = {"kv": [1, 1, 0], "q": [1, 0, 0]}
    (dq_atomic, dq, dk, dv), (expected_dq, expected_dk, expected_dv) = backward_on_the_simulator(
        "sm_90a", 4, overlap=True, check_waits=lambda kernel, fn: loop_waits(fn) == expected_waits[kernel])
    for got, expected in ((dq_atomic, expected_dq), (dq, expected_dq), (dk, expected_dk), (dv, expected_dv)):
        torch.testing.assert_close(got.double(), expected, rtol=4e-3, atol=4e-3)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic-dq", "deterministic"])
@pytest.mark.parametrize("name", list(CASES))
def test_overlap_gradients_match_float64_on_the_interpreter(name, deterministic, monkeypatch):
    """Every masking case of test_attention_backward.py (odd lengths, causal with Sq != Sk, rows without keys,
    GQA/MQA, windows, softcap) with the backward in its OVERLAP order."""
    monkeypatch.setenv(BWD_OVERLAP_ENV, "1")
    B, Sq, Sk, H, H_kv, D, options = CASES[name]
    check_gradients(*qkv(B, Sq, Sk, H, H_kv, D, seed=len(name)), options, deterministic)


def test_the_overlap_order_keeps_the_deterministic_mode_deterministic(monkeypatch):
    from tessera.kernels_lib import attention
    monkeypatch.setenv(BWD_OVERLAP_ENV, "1")
    q, k, v = qkv(1, 30, 30, 2, 1, 16, seed=3)
    loss = lambda q, k, v: attention(q, k, v, causal=True, deterministic=True)[0].float().sum()  # noqa: E731
    first, second = gradients(loss, q, k, v), gradients(loss, q, k, v)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_a_bad_setting_names_the_variable_and_the_fix(monkeypatch):
    from tessera.kernels_lib import attention
    monkeypatch.setenv(BWD_OVERLAP_ENV, "yes")
    q, k, v = (x.requires_grad_() for x in qkv(1, 8, 8, 1, 1, 16))
    out, _ = attention(q, k, v)
    with pytest.raises(ValueError, match=f"{BWD_OVERLAP_ENV}='yes' is not understood; set it to 1"):
        out.float().sum().backward()
