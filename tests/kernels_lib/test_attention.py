"""tessera::attention and tessera::attention_varlen (tessera/kernels_lib/attention.py) on the CPU interpreter,
against attention in float64 (tests/kernels_lib/attention_reference.py)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from tessera.kernels_lib import attention, attention_varlen  # noqa: E402

from attention_reference import attention as reference  # noqa: E402

TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def qkv(B, Sq, Sk, H, H_kv, D, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, H, D, generator=g).to(dtype)
    k = torch.randn(B, Sk, H_kv, D, generator=g).to(dtype)
    v = torch.randn(B, Sk, H_kv, D, generator=g).to(dtype)
    return q, k, v


def check(out, lse, expected_out, expected_lse):
    """O to the dtype's rounding; LSE to float32's, with +inf exactly where a row sees no key."""
    tol = TOLERANCE[out.dtype]
    torch.testing.assert_close(out.double(), expected_out, rtol=tol, atol=tol)
    assert lse.dtype == torch.float32
    assert torch.equal(torch.isinf(lse), torch.isinf(expected_lse))
    finite = ~torch.isinf(expected_lse)
    torch.testing.assert_close(lse.double()[finite], expected_lse[finite], rtol=1e-4, atol=1e-4)


CASES = {   # B, Sq, Sk, H, H_kv, D, options
    "odd-lengths": (2, 19, 37, 2, 2, 32, {}),
    "causal-Sq<Sk-bottom-right": (1, 21, 45, 2, 2, 32, {"causal": True}),
    "causal-Sq>Sk-first-rows-see-nothing": (1, 40, 17, 2, 1, 32, {"causal": True}),
    "causal-square": (1, 33, 33, 1, 1, 64, {"causal": True}),
    "window-left-and-right": (1, 37, 41, 2, 2, 16, {"window": (5, 3)}),
    "causal-sliding-window": (1, 50, 50, 1, 1, 32, {"causal": True, "window": 7}),
    "window-right-only": (1, 24, 24, 1, 1, 16, {"window": (-1, 2)}),
    "softcap": (1, 29, 31, 2, 2, 32, {"softcap": 2.0}),
    "softcap-causal": (1, 29, 31, 2, 2, 32, {"softcap": 5.0, "causal": True}),
    "gqa": (1, 18, 20, 4, 2, 32, {}),
    "mqa-causal": (2, 17, 17, 3, 1, 16, {"causal": True}),
    "scale": (1, 16, 24, 1, 1, 32, {"scale": 0.5}),
    "one-query-one-key": (1, 1, 1, 1, 1, 16, {}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_float64_attention(name):
    B, Sq, Sk, H, H_kv, D, options = CASES[name]
    q, k, v = qkv(B, Sq, Sk, H, H_kv, D, seed=len(name))
    out, lse = attention(q, k, v, **options)
    assert out.shape == q.shape and lse.shape == (B, H, Sq)
    window = options.get("window", (-1, -1))
    window = (window, window) if isinstance(window, int) else window
    check(out, lse, *reference(q, k, v, options.get("causal", False), window, options.get("softcap", 0.0),
                               options.get("scale")))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_dtypes(dtype):
    q, k, v = qkv(1, 20, 30, 2, 1, 32, dtype)
    check(*attention(q, k, v, causal=True), *reference(q, k, v, causal=True))


def test_strided_inputs_are_read_in_place():
    """q, k, v sliced out of one packed (B, S, 3, H, D) tensor, and k stored head-major (B, H, S, D)."""
    g = torch.Generator().manual_seed(1)
    packed = torch.randn(2, 23, 3, 2, 32, generator=g).half()
    q, k, v = packed.unbind(2)
    k = k.transpose(1, 2).contiguous().transpose(1, 2)
    assert not q.is_contiguous() and not k.is_contiguous()
    check(*attention(q, k, v, causal=True), *reference(q, k, v, causal=True))


def test_broadcast_keys_are_materialized_and_other_strides_kept():
    """k and v expanded over the batch (stride 0) are copied once (a TMA map cannot step by 0 on sm_90a); the
    strided views of the test above are passed as they are; a size-1 dim's stride 0 is passed as 16."""
    from tessera.kernels_lib.attention import Problem, _unbroadcast
    q, k, v = qkv(3, 20, 30, 2, 1, 32, seed=2)
    k, v = k[:1].expand(3, -1, -1, -1), v[:1].expand(3, -1, -1, -1)
    dense_k, = _unbroadcast(k)
    assert dense_k.is_contiguous() and torch.equal(dense_k, k)
    packed = torch.zeros(2, 23, 3, 2, 32)
    view = packed.unbind(2)[1]
    assert _unbroadcast(view)[0] is view
    problem = Problem.of(q, k, None, None, 20, 30, False, -1, -1, 0.0, None)
    assert problem.strides(torch.zeros(1, 4, 2, 8).expand(1, 4, 2, 8).as_strided((1, 4, 2, 8), (0, 16, 8, 1))) \
        == (16, 16, 8, 1)
    check(*attention(q, k, v, causal=True), *reference(q, k, v, causal=True))


def test_no_keys_gives_zeros_and_infinite_lse():
    q, k, v = qkv(1, 5, 0, 1, 1, 16)
    out, lse = attention(q, k, v)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isinf(lse).all() and (lse > 0).all()


def varlen_case(lengths_q, lengths_k, H=2, H_kv=1, D=32, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    cu = lambda lengths: torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)  # noqa
    q = torch.randn(sum(lengths_q), H, D, generator=g).to(dtype)
    k = torch.randn(sum(lengths_k), H_kv, D, generator=g).to(dtype)
    v = torch.randn(sum(lengths_k), H_kv, D, generator=g).to(dtype)
    return q, k, v, cu(lengths_q), cu(lengths_k)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_matches_each_sequence_on_its_own(causal):
    """Rows of length 0 and 1, and a sequence longer than a block; LSE is (H, total_q)."""
    lengths_q, lengths_k = [0, 1, 19, 4, 3], [3, 1, 21, 0, 5]
    q, k, v, cu_q, cu_k = varlen_case(lengths_q, lengths_k)
    out, lse = attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                window=(6, -1))
    assert out.shape == q.shape and lse.shape == (q.shape[1], q.shape[0])
    for b in range(len(lengths_q)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        expected_out, expected_lse = reference(q[None, rows], k[None, keys], v[None, keys], causal, (6, -1))
        check(out[rows][None], lse[:, rows][None], expected_out, expected_lse)


def test_opcheck():
    q, k, v = qkv(1, 9, 13, 2, 1, 16)
    torch.library.opcheck(torch.ops.tessera.attention.default, (q, k, v), {"causal": True, "softcap": 3.0})
    q, k, v, cu_q, cu_k = varlen_case([3, 0, 6], [4, 2, 5], D=16)
    torch.library.opcheck(torch.ops.tessera.attention_varlen.default, (q, k, v, cu_q, cu_k, 6, 5),
                          {"window_left": 2})


def test_fake_tensor_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k = torch.empty(2, 4096, 32, 128, dtype=torch.bfloat16), torch.empty(2, 8192, 8, 128, dtype=torch.bfloat16)
        out, lse = attention(q, k, k, causal=True)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert lse.shape == (2, 32, 4096) and lse.dtype == torch.float32


def test_torch_compile_traces_the_op():
    q, k, v = qkv(1, 8, 8, 1, 1, 16)
    f = torch.compile(lambda q, k, v: attention(q, k, v, causal=True)[0].float() * 2, fullgraph=True,
                      backend="eager")
    torch.testing.assert_close(f(q, k, v).double(), reference(q, k, v, causal=True)[0] * 2, rtol=4e-3, atol=4e-3)


@pytest.mark.parametrize("call,message", [
    (lambda: attention(torch.randn(1, 4, 2, 16).half(), torch.randn(1, 4, 2, 16).bfloat16(),
                       torch.randn(1, 4, 2, 16).bfloat16()), "share dtype"),
    (lambda: attention(torch.randn(1, 4, 2, 16), torch.randn(1, 4, 2, 16), torch.randn(1, 4, 2, 16)), "float32"),
    (lambda: attention(torch.randn(4, 2, 16).half(), torch.randn(4, 2, 16).half(), torch.randn(4, 2, 16).half()),
     r"\(B, S, H, D\)"),
    (lambda: attention(*qkv(1, 4, 4, 3, 2, 16)), "multiple"),
    (lambda: attention(*qkv(1, 4, 4, 1, 1, 24)), "power of two"),
    (lambda: attention(*qkv(1, 4, 4, 1, 1, 16), window=(-3, 2)), "window"),
])
def test_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_lse_is_the_natural_log_of_the_softmax_denominator():
    q, k, v = qkv(1, 3, 5, 1, 1, 16)
    _, lse = attention(q, k, v, scale=0.25)
    s = 0.25 * torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double())
    torch.testing.assert_close(lse.double(), torch.log(torch.exp(s).sum(-1)), rtol=1e-5, atol=1e-5)
    assert math.isfinite(lse.sum().item())


@pytest.mark.parametrize("scale", [-0.3, 0.0, 0.3])
def test_any_scale_sign_with_a_causal_mask(scale):
    """A positive scale folds into exp2's argument after the row max of the raw q.k (`attention_fwd.py`); a
    negative or zero one, where the max would not commute with it, scales the scores first: both match."""
    q, k, v = qkv(2, 9, 13, 2, 1, 16)
    out, lse = attention(q, k, v, causal=True, scale=scale)
    check(out, lse, *reference(q, k, v, causal=True, scale=scale))
