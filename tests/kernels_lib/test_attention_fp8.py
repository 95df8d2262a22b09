"""tessera::attention_fp8 (tessera/kernels_lib/attention_fp8.py) on the CPU interpreter, against float64 attention
of the dequantized inputs; its argument checks and its refusal of targets without fp8 tensor cores.

Tolerance. S = Q K^T multiplies e4m3 codes exactly, but Hopper's fp8 MMA accumulates with about 14 bits
(`tessera.testing.FP8_MMA_RELATIVE_ERROR`, measured on an H100), so each S_ij may be off by
dS_ij = FP8_MMA_RELATIVE_ERROR * scale * sum_d |q_id k_jd|, and a row's LSE by at most its largest dS_ij
(plus float32's 1e-4); the interpreter sums in float32 and is far inside. O = sum_j p_j v_j / l with each p_j
rounded to e4m3 for P V (the kernel scales P by 2^8 first, which
is exact): a normal e4m3 rounds to within 2^-4 relative (3 mantissa bits, round to nearest), a subnormal to
within 2^-10 absolute, 2^-18 of p after the scale. Since l sums the unrounded p, the worst case is

    |O - O_ref| <= 2^-4 * sum_j p_j |v_j| / l + Sk * 2^-18 * max|v| / l  <=  (2^-4 + Sk * 2^-18) * max|v|

(l >= 1: the row's largest p is exp2(0) = 1), plus O's rounding to its dtype (2^-8 relative for bfloat16), plus
the S errors' effect on the weights p_j / l (relative 2 max_j dS_ij at most, so 2 max_j dS_ij * max|v|).
Rounding errors of independent p_j mostly cancel, so the mean error is far below the bound: the test checks
that too (2^-7 * max|v|), which an unquantized or mis-scaled P V would not pass by accident, and a wrong
descale would miss by orders of magnitude.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tessera.kernels_lib import attention, attention_varlen  # noqa: E402
from tessera.kernels_lib.attention_fp8 import require_fp8_tensor_cores  # noqa: E402

from attention_reference import attention as reference  # noqa: E402
from tessera.testing import FP8_MMA_RELATIVE_ERROR  # noqa: E402

E4M3 = torch.float8_e4m3fn


def quantized(B, S, H, D, amax, seed):
    """(codes, descale): a random tensor quantized per tensor as FA3's users do, descale = amax / 448."""
    x = torch.randn(B, S, H, D, generator=torch.Generator().manual_seed(seed)) * amax / 3
    descale = x.abs().max() / 448
    return (x / descale).to(E4M3), descale


def s_error(q, k, scale=None):
    """(B, H, Sq): each query row's largest possible S error from the fp8 MMA's accumulation, max_j dS_ij."""
    B, Sq, H, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    k = k.abs().repeat_interleave(H // k.shape[2], dim=2)                 # GQA: each query head's KV head
    sums = torch.einsum("bqhd,bkhd->bhqk", q.abs(), k)
    return FP8_MMA_RELATIVE_ERROR * scale * sums.amax(dim=-1)


def check_fp8(o, lse, q, k, v, dq, dk, dv, **options):
    q64, k64, v64 = q.double() * dq, k.double() * dk, v.double() * dv
    expected_o, expected_lse = reference(q64, k64, v64, **options)
    assert lse.dtype == torch.float32
    assert torch.equal(torch.isinf(lse), torch.isinf(expected_lse))
    finite = ~torch.isinf(expected_lse)
    ds = s_error(q64, k64, options.get("scale"))
    lse_error = (lse.double() - expected_lse).abs()[finite]
    lse_bound = (ds + 1e-4 * (1 + expected_lse.abs()))[finite]
    assert (lse_error <= lse_bound).all(), f"LSE error {(lse_error / lse_bound).max():.3f}x its bound"
    vmax = v64.abs().max()
    bound = ((2 ** -4 + k.shape[1] * 2 ** -18) * vmax + 2 ** -8 * expected_o.abs()
             + 2 * ds.transpose(1, 2)[..., None] * vmax)
    error = (o.double() - expected_o).abs()
    assert (error <= bound).all(), f"worst {(error - bound).max()} over the bound"
    assert error.mean() <= 2 ** -7 * vmax, f"mean error {error.mean()}"


CASES = {   # B, Sq, Sk, H, H_kv, D, options
    "odd-lengths": (2, 19, 37, 2, 2, 32, {}),
    "causal-Sq>Sk-gqa": (1, 40, 17, 4, 2, 32, {"causal": True}),
    "window-softcap": (1, 33, 33, 2, 1, 16, {"window": (5, 3), "softcap": 20.0}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fp8_forward_matches_float64_attention_of_the_dequantized_inputs(name):
    B, Sq, Sk, H, H_kv, D, options = CASES[name]
    (q, dq), (k, dk), (v, dv) = (quantized(B, S, h, D, amax, seed) for S, h, amax, seed in
                                 ((Sq, H, 4.0, 1), (Sk, H_kv, 6.0, 2), (Sk, H_kv, 2.0, 3)))
    o, lse = attention(q, k, v, q_descale=dq, k_descale=dk, v_descale=float(dv), **options)
    assert o.dtype == torch.bfloat16 and o.shape == q.shape and lse.shape == (B, H, Sq)
    ref_options = {key: val for key, val in options.items() if key != "window"}
    if "window" in options:
        ref_options["window"] = options["window"]
    check_fp8(o, lse, q, k, v, dq, dk, dv, **ref_options)


def test_fp8_forward_gives_the_asked_out_dtype_and_descales_of_one_by_default():
    (q, _), (k, _), (v, _) = (quantized(1, 24, 2, 32, 1.0, seed) for seed in (4, 5, 6))
    o, lse = attention(q, k, v, causal=True, out_dtype=torch.float16)
    assert o.dtype == torch.float16
    check_fp8(o, lse, q, k, v, 1.0, 1.0, 1.0, causal=True)


def test_fp8_op_passes_opcheck():
    """Fake tensors and AOT dispatch; not "test_schema": torch's SchemaCheckMode compares every aten op's inputs
    before and after to find mutations, which torch cannot do for float8 CPU tensors ("mul_cpu_reduced_float"
    not implemented for 'Float8_e4m3fn')."""
    from torch.library import opcheck
    (q, dq), (k, dk), (v, dv) = (quantized(1, 20, 2, 16, 2.0, seed) for seed in (7, 8, 9))
    descale = torch.stack([dq, dk, dv]).float()
    opcheck(torch.ops.tessera.attention_fp8.default, (q, k, v, descale, True, -1, 0, 0.0, None, torch.bfloat16),
            test_utils=("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("arch, says", [("sm_80", "sm_80 has no fp8 tensor cores (they begin with sm_89"),
                                        ("sm_86", "sm_86 has no fp8 tensor cores"),
                                        ("gfx942", "gfx942: Tessera's dot has no MFMA for float8_e4m3fn there "
                                                   "(gfx942's fp8 MFMA reads the fnuz formats; gfx950 is the AMD GPU")])
def test_targets_without_fp8_tensor_cores_are_refused_with_the_fix(arch, says):
    with pytest.raises(ValueError, match="tessera::attention_fp8") as refused:
        require_fp8_tensor_cores(arch)
    assert says in str(refused.value) and "dequantize to bfloat16" in str(refused.value)


@pytest.mark.parametrize("arch", ["sm_89", "sm_90a", "sm_100a", "sm_120", "gfx950"])
def test_targets_with_fp8_tensor_cores_are_accepted(arch):
    require_fp8_tensor_cores(arch)


def test_bad_fp8_arguments_name_the_fix():
    (q, _), (k, _), (v, _) = (quantized(1, 8, 1, 16, 1.0, seed) for seed in (1, 2, 3))
    with pytest.raises(ValueError, match="are for float8 q, k, v; got torch.bfloat16"):
        attention(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), q_descale=1.0)
    with pytest.raises(ValueError, match="v has dtype torch.bfloat16; supported are float8_e4m3fn"):
        attention(q, k, v.to(torch.bfloat16))
    with pytest.raises(ValueError, match="k_descale must be a float or a 1-element floating tensor"):
        attention(q, k, v, k_descale=torch.ones(2))
    with pytest.raises(ValueError, match="out_dtype torch.float32 is not supported"):
        attention(q, k, v, out_dtype=torch.float32)
    with pytest.raises(ValueError, match="float8 q, k, v run on the batched op only"):
        cu = torch.tensor([0, 8], dtype=torch.int32)
        attention_varlen(q[0], k[0], v[0], cu, cu, 8, 8)


def test_a_v_already_contiguous_along_the_keys_is_read_in_place():
    """keys_contiguous copies V (zero-padded) unless its keys are contiguous and 16-aligned already."""
    from tessera.kernels_lib.attention_fp8 import keys_contiguous
    (q, dq), (k, dk), (v, dv) = (quantized(1, S, h, 16, 2.0, seed) for S, h, seed in ((20, 2, 1), (32, 1, 2),
                                                                                        (32, 1, 3)))
    v_keys_inner = v.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)      # (B, S, H, D), stride 1 along S
    assert keys_contiguous(v_keys_inner) is v_keys_inner
    padded = keys_contiguous(v[:, :30])
    assert padded.shape == (1, 32, 1, 16) and padded.stride(1) == 1 and not padded[:, 30:].float().any()
    o, lse = attention(q, k, v_keys_inner, q_descale=dq, k_descale=dk, v_descale=dv)
    check_fp8(o, lse, q, k, v, dq, dk, dv)
