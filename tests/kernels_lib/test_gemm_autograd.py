"""Gradients of tessera::gemm (float inputs) on the CPU interpreter, against torch autograd in float32."""

import itertools

import pytest

torch = pytest.importorskip("torch")

from tessera.kernels_lib import gemm  # noqa: E402

ACTIVATIONS = {
    None: lambda x: x,
    "relu": torch.relu,
    "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu,
}
M, N, K = 5, 7, 3


def reference(a, b, bias=None, activation=None, trans_a=False, trans_b=False, alpha=1.0):
    x = alpha * ((a.t() if trans_a else a).float() @ (b.t() if trans_b else b).float())
    if bias is not None:
        x = x + bias.float()
    return ACTIVATIONS[activation](x)


def leaves(dtype, trans_a, trans_b, with_bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn((K, M) if trans_a else (M, K), generator=g).to(dtype).requires_grad_()
    b = torch.randn((N, K) if trans_b else (K, N), generator=g).to(dtype).requires_grad_()
    bias = torch.randn(N, generator=g).requires_grad_() if with_bias else None
    return a, b, bias


def grads(out, inputs, seed=1):
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    inputs = [x for x in inputs if x is not None]
    return torch.autograd.grad(out.float(), inputs, upstream.to(out.dtype).float())


def compare(dtype, activation, trans_a, trans_b, with_bias, alpha, tol):
    a, b, bias = leaves(dtype, trans_a, trans_b, with_bias)
    out = gemm(a, b, bias, activation=activation, out_dtype=torch.float32, trans_a=trans_a, trans_b=trans_b,
               alpha=alpha)
    got = grads(out, (a, b, bias))
    ref_inputs = [x.detach().float().requires_grad_() if x is not None else None for x in (a, b, bias)]
    expected = grads(reference(*ref_inputs, activation, trans_a, trans_b, alpha), ref_inputs)
    for x, g, e in zip([x for x in (a, b, bias) if x is not None], got, expected):
        assert g.dtype == x.dtype and g.shape == x.shape
        torch.testing.assert_close(g.float(), e, rtol=tol, atol=tol)


@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_grads_transposes(trans_a, trans_b, with_bias):
    compare(torch.float32, None, trans_a, trans_b, with_bias, alpha=-1.5, tol=1e-4)


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_grads_activations(activation):
    compare(torch.float32, activation, True, False, True, alpha=0.75, tol=1e-4)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-2), (torch.bfloat16, 6e-2)], ids=str)
def test_grads_half_precision(dtype, tol):
    compare(dtype, "silu", False, True, True, alpha=1.25, tol=tol)


def test_grads_default_out_dtype_and_partial_requires_grad():
    a = torch.randn(M, K, requires_grad=True)
    b = torch.randn(K, N)            # no grad wanted for b
    bias = torch.randn(N, dtype=torch.float32)
    (ga,) = torch.autograd.grad(gemm(a, b, bias, activation="relu").sum(), [a])
    a_ref = a.detach().requires_grad_()
    (ea,) = torch.autograd.grad(reference(a_ref, b, bias, "relu").sum(), [a_ref])
    torch.testing.assert_close(ga, ea, rtol=1e-4, atol=1e-4)


def test_opcheck_with_grad():
    a, b, bias = leaves(torch.float32, False, True, True, seed=3)
    tests = ("test_schema", "test_autograd_registration", "test_faketensor")
    op = torch.ops.tessera.gemm.default
    torch.library.opcheck(op, (a, b, bias), {"activation": "gelu", "trans_b": True, "alpha": 0.5}, test_utils=tests)
    torch.library.opcheck(op, (a, b.detach()), {"trans_b": True}, test_utils=tests)
