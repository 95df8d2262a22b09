"""score_mod and output epilogues fused into tessera::attention (kernels_lib/attention_fusion.py): on the CPU
interpreter against float64 torch, their mistakes as CompileErrors at the user's lines, and the fused forward
as GPU code without spills."""

import inspect
import math

import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera.kernels_lib import attention, attention_varlen  # noqa: E402

import fusion_hooks as hooks  # noqa: E402
from attention_reference import visible  # noqa: E402


def reference(q, k, v, mod=None, causal=False):
    """(O, LSE) in float64 with `mod(s, b, h, i, j)` applied to the scaled scores before the mask."""
    B, Sq, H, D = q.shape
    Sk = k.shape[1]
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double().repeat_interleave(H // k.shape[2], dim=2))
    s = s / math.sqrt(D)
    if mod is not None:
        b, h, i, j = torch.meshgrid(torch.arange(B), torch.arange(H), torch.arange(Sq), torch.arange(Sk),
                                    indexing="ij")
        s = mod(s, b, h, i, j)
    s = s.masked_fill(~visible(Sq, Sk, causal), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None].masked_fill(torch.isinf(lse[..., None]), 0.0))
    o = torch.einsum("bhqk,bkhd->bqhd", p, v.double().repeat_interleave(H // k.shape[2], dim=2))
    return o, lse.masked_fill(torch.isinf(lse), math.inf)     # rows that see no key: +inf (the kernel's)


def qkv(B=2, Sq=37, Sk=29, H=2, H_kv=1, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, S, h, D, generator=g).half() for S, h in ((Sq, H), (Sk, H_kv), (Sk, H_kv))]


def close(got, expected, tol=2e-3):
    torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol)


def test_alibi_score_mod_reads_a_per_head_tensor_and_the_positions():
    q, k, v = qkv()
    slopes = torch.tensor([0.5, 0.125])
    o, lse = attention(q, k, v, causal=True, score_mod=hooks.score_alibi, score_mod_args=(slopes,))
    expected_o, expected_lse = reference(q, k, v, lambda s, b, h, i, j: s + slopes.double()[h] * (j - i), True)
    close(o, expected_o)
    close(lse, expected_lse, tol=1e-4)


def test_softcap_as_a_score_mod_with_a_scalar_operand():
    q, k, v = qkv(seed=1)
    o, _ = attention(q, k, v, score_mod=hooks.score_softcap, score_mod_args=(0.3,))
    close(o, reference(q, k, v, lambda s, *idx: 0.3 * torch.tanh(s / 0.3))[0])


def test_document_mask_on_packed_sequences_and_an_output_gate():
    q, k, v = qkv(B=1, Sq=40, Sk=40, seed=2)
    docs = torch.tensor([0] * 13 + [1] * 20 + [2] * 7, dtype=torch.int32)
    gate = torch.rand(q.shape).half()
    o, _ = attention(q, k, v, causal=True, score_mod=hooks.document_mask, score_mod_args=(docs,),
                     epilogue=hooks.output_times_gate, epilogue_args=(gate,))
    same = lambda s, b, h, i, j: s.masked_fill(docs[i] != docs[j], -math.inf)    # noqa: E731
    close(o, reference(q, k, v, same, causal=True)[0] * gate.double(), tol=3e-3)


def test_varlen_score_mod_sees_positions_within_each_sequence():
    q, k, v = (x[0] for x in qkv(B=1, Sq=30, Sk=30, seed=3))
    cu = torch.tensor([0, 12, 30], dtype=torch.int32)
    slopes = torch.tensor([0.25, 1.0])
    o, _ = attention_varlen(q, k, v, cu, cu, 18, 18, causal=True, score_mod=hooks.score_alibi,
                            score_mod_args=(slopes,))
    for start, end in ((0, 12), (12, 30)):
        part = [x[None, start:end] for x in (q, k, v)]
        expected = reference(*part, lambda s, b, h, i, j: s + slopes.double()[h] * (j - i), True)[0]
        close(o[None, start:end], expected)


def test_mistakes_are_compile_errors_at_the_users_lines():
    q, k, v = qkv(B=1, Sq=16, Sk=16)
    with pytest.raises(tessera.CompileError) as info:
        attention(q, k, v, score_mod=hooks.score_alibi)            # slopes missing
    assert info.value.line == inspect.getsourcelines(hooks.score_alibi.fn)[1] + 1
    with pytest.raises(tessera.CompileError) as info:
        attention(q, k, v, epilogue=hooks.output_times_gate, epilogue_args=(torch.rand(16),))
    assert info.value.file == __file__ and "shaped like the output" in info.value.message
    with pytest.raises(tessera.CompileError, match="no backward"):
        attention(q.requires_grad_(), k, v, score_mod=hooks.score_softcap, score_mod_args=(1.0,))


FUSED_SIGNATURE = ",".join(["*{t}:16"] * 4 + ["*f32:16", "*i32:16", "*i32:16"] + ["i32"] * 4 + ["f32", "f32"]
                           + ["i32", "i32"] + ["i32:16", "i32:16", "i32:16", "i32:1"] * 4 + ["i32", "i32"]
                           + ["*f32:16", "*{t}:16", "f32", "f32", "*{t}:16"] + ["i32:16"] * 3 + ["i32:1", "f32"]
                           + ["*f32:16", "i32"])


def test_torch_compile_breaks_the_graph_cleanly_at_a_hooked_attention():
    q, k, v = qkv(B=1, Sq=16, Sk=16, H=2, H_kv=2)
    slopes = torch.tensor([0.5, 0.25])

    def model(q, k, v):
        o, _ = attention(q, k, v, score_mod=hooks.score_alibi, score_mod_args=(slopes,))
        return o * 2

    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(model, backend="eager")(q, k, v), model(q, k, v))
    with pytest.raises(torch._dynamo.exc.Unsupported, match="runs outside torch.compile's graph"):
        torch.compile(lambda q, k, v: attention(q, k, v, score_mod=hooks.score_alibi, score_mod_args=(slopes,))[0],
                      backend="eager", fullgraph=True)(q, k, v)


@pytest.mark.filterwarnings("ignore::tessera.PipelineWarning")
@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "gfx942", "gfx950"])
def test_fused_forward_compiles_without_spills(target):
    from tessera.backends.nvptx import find_ptxas
    from tessera.kernels_lib.attention import GPU_PLANS
    from tessera.kernels_lib.attention_fwd import attention_fwd_kernel
    if not target.startswith("gfx") and find_ptxas() is None:
        pytest.skip("ptxas not installed")
    plan = GPU_PLANS[target if target.startswith("gfx") else "nvidia"][128]      # AMD: the target's own
    compiled = attention_fwd_kernel.compile(
        signature=FUSED_SIGNATURE.format(t="bf16"), target=target, num_warps=plan.num_warps, D=128, BM=plan.BM,
        BN=plan.BN, STAGES=plan.stages, HAS_LEFT=False, HAS_RIGHT=True, SOFTCAP=False, VARLEN=False,
        SCORE_MOD=hooks.score_alibi, SM_ORDER=(0, 5, 6, 7), EPILOGUE=hooks.output_times_gate, EP_ORDER=(0,),
        EP_TILE=True, strict=target == "sm_80")      # sm_90a: cp.async, not TMA, for views at an offset base,
    #                                               as the unfused kernel (its strict compile fails alike)
    if target.startswith("gfx"):
        assert compiled.metadata["vgpr_spill_count"] == 0
    else:
        assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0


def test_importing_the_library_leaves_dynamo_unloaded():
    """`import tessera.kernels_lib` must not import Dynamo (about 1.5 s of CPU a process): the ops that keep fused
    functions out of torch.compile's graphs disable Dynamo for them lazily (`hooks.outside_graphs`)."""
    import subprocess
    import sys
    code = "import sys, tessera.kernels_lib, tessera.kernels_lib.moe; print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "False", done.stdout + done.stderr
