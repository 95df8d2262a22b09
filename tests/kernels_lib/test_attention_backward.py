"""Gradients of tessera::attention and tessera::attention_varlen (the FlashAttention-2 backward,
tessera/kernels_lib/attention_bwd.py) on the CPU interpreter, against autograd through attention in float64."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tessera.kernels_lib import attention, attention_varlen  # noqa: E402

from attention_reference import attention as reference  # noqa: E402
from test_attention import varlen_case  # noqa: E402

TOLERANCE = {torch.float16: 3e-3, torch.bfloat16: 2.5e-2}


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def gradients(loss_of, q, k, v):
    q, k, v = leaves(q, k, v)
    loss_of(q, k, v).backward()
    return q.grad, k.grad, v.grad


def check_gradients(q, k, v, options, deterministic=False, use_lse=False, seed=0):
    """dQ, dK, dV of sum(O * dO) (+ sum(LSE * dLSE)) against the float64 reference's."""
    g = torch.Generator().manual_seed(seed)
    grad_out = torch.randn(q.shape, generator=g)
    grad_lse = torch.randn(q.shape[0], q.shape[2], q.shape[1], generator=g) if use_lse else None
    window = options.get("window", (-1, -1))
    window = (window, window) if isinstance(window, int) else window

    def ours(q, k, v):
        out, lse = attention(q, k, v, deterministic=deterministic, **options)
        loss = (out.float() * grad_out).sum()
        return loss + (lse * grad_lse).sum() if use_lse else loss

    def theirs(q, k, v):
        out, lse = reference(q, k, v, options.get("causal", False), window, options.get("softcap", 0.0),
                             options.get("scale"))
        loss = (out * grad_out.double()).sum()
        return loss + (lse.masked_fill(torch.isinf(lse), 0) * grad_lse.double()).sum() if use_lse else loss

    got = gradients(ours, q, k, v)
    expected = gradients(theirs, *(x.double() for x in (q, k, v)))
    tol = TOLERANCE[q.dtype]
    for name, a, b in zip("qkv", got, expected):
        assert a.dtype == q.dtype and a.shape == b.shape, name
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol * max(1.0, b.abs().max().item()),
                                   msg=lambda m: f"d{name}: {m}")


def qkv(B, Sq, Sk, H, H_kv, D, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Sq, H, D, generator=g).to(dtype), torch.randn(B, Sk, H_kv, D, generator=g).to(dtype),
            torch.randn(B, Sk, H_kv, D, generator=g).to(dtype))


CASES = {   # B, Sq, Sk, H, H_kv, D, options
    "odd-lengths": (1, 19, 37, 2, 2, 16, {}),
    "causal-Sq<Sk": (1, 21, 40, 1, 1, 32, {"causal": True}),
    "causal-Sq>Sk-rows-without-keys": (1, 37, 18, 1, 1, 16, {"causal": True}),
    "gqa-causal-summed-per-group": (2, 20, 20, 4, 2, 16, {"causal": True}),
    "mqa": (1, 17, 23, 3, 1, 16, {}),
    "sliding-window": (1, 40, 40, 1, 1, 16, {"window": (6, 2)}),
    "causal-left-window": (1, 33, 33, 2, 1, 16, {"causal": True, "window": 5}),
    "softcap": (1, 24, 29, 1, 1, 32, {"softcap": 2.5, "causal": True}),
}


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic-dq", "deterministic"])
@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_float64(name, deterministic):
    B, Sq, Sk, H, H_kv, D, options = CASES[name]
    check_gradients(*qkv(B, Sq, Sk, H, H_kv, D, seed=len(name)), options, deterministic)


def test_bfloat16_gradients():
    check_gradients(*qkv(1, 20, 30, 2, 1, 32, torch.bfloat16), {"causal": True})


def test_the_lse_is_differentiable_too():
    check_gradients(*qkv(1, 18, 25, 2, 1, 16), {"causal": True}, use_lse=True)


def test_the_deterministic_mode_gives_the_same_gradients_every_run():
    q, k, v = qkv(1, 30, 30, 2, 1, 16, seed=3)
    loss = lambda q, k, v: attention(q, k, v, causal=True, deterministic=True)[0].float().sum()  # noqa: E731
    first, second = gradients(loss, q, k, v), gradients(loss, q, k, v)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic-dq", "deterministic"])
def test_varlen_gradients_match_each_sequence_on_its_own(deterministic):
    lengths_q, lengths_k = [5, 0, 17, 1], [7, 3, 19, 1]
    q, k, v, cu_q, cu_k = varlen_case(lengths_q, lengths_k, D=16)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))

    def ours(q, k, v):
        out, _ = attention_varlen(q, k, v, cu_q, cu_k, 17, 19, causal=True, deterministic=deterministic)
        return (out.float() * grad_out).sum()

    got = gradients(ours, q, k, v)
    expected = [torch.zeros(x.shape, dtype=torch.float64) for x in (q, k, v)]
    for b in range(len(lengths_q)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])

        def theirs(q_b, k_b, v_b):
            return (reference(q_b[None], k_b[None], v_b[None], True)[0][0] * grad_out[rows].double()).sum()

        for full, part, where in zip(expected, gradients(theirs, q[rows].double(), k[keys].double(),
                                                         v[keys].double()), (rows, keys, keys)):
            full[where] = part
    for a, b in zip(got, expected):
        torch.testing.assert_close(a.double(), b, rtol=3e-3, atol=3e-3)


def test_opcheck_with_gradients():
    q, k, v = leaves(*qkv(1, 9, 11, 2, 1, 16))
    torch.library.opcheck(torch.ops.tessera.attention.default, (q, k, v), {"causal": True})
    q, k, v, cu_q, cu_k = varlen_case([4, 0, 6], [5, 2, 6], D=16)
    q, k, v = leaves(q, k, v)
    torch.library.opcheck(torch.ops.tessera.attention_varlen.default, (q, k, v, cu_q, cu_k, 6, 6),
                          {"deterministic": True})
