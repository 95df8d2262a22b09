"""`gemm(..., epilogue=fn)` under autograd and torch.compile (kernels_lib/gemm_fusion_grad.py): gradients through
`epilogue_reference=` against torch's own, an error naming the fix wherever a gradient has no backward, and a
clean graph break (never an internal Dynamo error) under torch.compile."""

import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera.kernels_lib import epilogues, gemm  # noqa: E402

import fusion_hooks as hooks  # noqa: E402


def torch_bias_gelu_residual(acc, bias, residual):
    """What hooks.bias_gelu_residual computes, in torch."""
    return torch.nn.functional.gelu(acc + bias) + residual


def torch_dropout(acc, seed, p, n_cols, rows, cols):
    """hooks.dropout's mask cannot be drawn in torch, but its gradient needs only which elements survived:
    recomputing the forward's output (the same seed keeps the same elements) gives them."""
    return acc * (torch_dropout.kept / (1.0 - p))


def inputs(M, N, K, trans_a=False, trans_b=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(K, M, generator=g) if trans_a else torch.randn(M, K, generator=g)
    b = torch.randn(N, K, generator=g) if trans_b else torch.randn(K, N, generator=g)
    bias, residual = torch.randn(N, generator=g), torch.randn(M, N, generator=g)
    return [x.requires_grad_() for x in (a, b, bias, residual)]


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True)])
def test_gradients_through_the_epilogue_reference_equal_torchs(trans_a, trans_b):
    a, b, bias, residual = inputs(21, 18, 16, trans_a, trans_b)
    out = gemm(a, b, trans_a=trans_a, trans_b=trans_b, epilogue=hooks.bias_gelu_residual,
               epilogue_args=(bias, residual), epilogue_reference=torch_bias_gelu_residual)
    op_a, op_b = (a.t() if trans_a else a), (b.t() if trans_b else b)
    expected = torch_bias_gelu_residual(op_a @ op_b, bias, residual)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), (a, b, bias, residual))
    wanted = torch.autograd.grad((expected * weights).sum(), (a, b, bias, residual))
    for got, want in zip(grads, wanted):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_half_precision_gradients_come_back_in_each_inputs_dtype_and_only_where_asked():
    a, b, bias, residual = (x.detach() for x in inputs(17, 16, 32, seed=1))
    a, b = a.half().requires_grad_(), b.half()
    out = gemm(a, b, epilogue=hooks.bias_gelu_residual, epilogue_args=(bias, residual),
               epilogue_reference=torch_bias_gelu_residual)
    out.float().sum().backward()
    expected = torch.func.grad(lambda x: torch_bias_gelu_residual(x @ b.float(), bias, residual).sum())(a.float())
    assert a.grad.dtype == torch.float16 and bias.grad is None
    torch.testing.assert_close(a.grad.float(), expected, rtol=1e-2, atol=1e-2)


def test_index_operands_reach_the_reference_and_the_dropout_gradient_follows_the_kept_elements():
    a, b = (x.detach().requires_grad_() for x in inputs(24, 20, 16, seed=2)[:2])
    out = gemm(a, b, epilogue=hooks.dropout, epilogue_args=(99, 0.5, 20), out_dtype=torch.float32,
               epilogue_reference=torch_dropout)
    torch_dropout.kept = (out != 0).float()
    out.sum().backward()
    torch.testing.assert_close(a.grad, (torch_dropout.kept / 0.5) @ b.detach().t(), rtol=1e-5, atol=1e-5)


def test_a_gradient_without_a_reference_or_through_a_prologue_is_an_error_naming_the_fix():
    a, b, bias, residual = inputs(8, 8, 16)
    with pytest.raises(tessera.CompileError, match="pass epilogue_reference=fn") as info:
        gemm(a, b, epilogue=hooks.bias_gelu_residual, epilogue_args=(bias, residual))
    assert info.value.file == __file__
    with pytest.raises(tessera.CompileError, match="prologue_a / prologue_b has no backward"):
        gemm(a, b, prologue_a=hooks.scale_a_rows, prologue_a_args=(bias[:8, None],))
    with pytest.raises(tessera.CompileError, match="epilogue_outputs have no backward"):
        gemm(a, b, epilogue=hooks.relu_and_pre, epilogue_args=(bias,), epilogue_outputs=(torch.empty(8, 8),),
             epilogue_reference=lambda acc, bias: acc + bias)
    with pytest.raises(tessera.CompileError, match="without the epilogue it stands for"):
        gemm(a.detach(), b.detach(), prologue_a=hooks.scale_a_rows, prologue_a_args=(bias.detach()[:8, None],),
             epilogue_reference=torch_bias_gelu_residual)
    with torch.no_grad():       # the fix: nothing to record, so the fused kernel runs as it is
        out = gemm(a, b, epilogue=hooks.bias_gelu_residual, epilogue_args=(bias, residual))
    assert not out.requires_grad


def test_torch_compile_breaks_the_graph_cleanly_at_a_hooked_gemm():
    a, b, bias, residual = (x.detach() for x in inputs(19, 12, 16, seed=3))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def model(a, b, bias, residual):
        y = gemm(torch.relu(a), b, epilogue=hooks.bias_gelu_residual, epilogue_args=(bias, residual))
        return y * 2.0

    torch._dynamo.reset()
    out = torch.compile(model, backend=backend)(a, b, bias, residual)
    torch.testing.assert_close(out, model(a, b, bias, residual))
    assert len(graphs) == 2         # relu before the break, the product after it; the GEMM runs between them

    def whole(a, b, bias, residual):
        return gemm(a, b, epilogue=hooks.bias_gelu_residual, epilogue_args=(bias, residual)) + 1.0

    with pytest.raises(torch._dynamo.exc.Unsupported, match="runs outside torch.compile's graph"):
        torch.compile(whole, backend=backend, fullgraph=True)(a, b, bias, residual)


def test_torch_compile_trains_through_the_reference():
    a, b, bias, residual = inputs(16, 12, 16, seed=4)

    def model(a, b, bias, residual):
        return gemm(a, b, epilogue=hooks.bias_gelu_residual, epilogue_args=(bias, residual),
                    epilogue_reference=torch_bias_gelu_residual).square().sum()

    torch._dynamo.reset()
    compiled = torch.autograd.grad(torch.compile(model, backend="eager")(a, b, bias, residual), (a, bias))
    eager = torch.autograd.grad(torch_bias_gelu_residual(a @ b, bias, residual).square().sum(), (a, bias))
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(e.__name__ for e in epilogues.REFERENCES))
def test_the_library_epilogues_match_their_references_and_train_without_one_given(name):
    epilogue = getattr(epilogues, name)
    reference = epilogues.REFERENCES[epilogue]
    a, b, bias, residual = inputs(19, 24, 16, seed=5)
    args = {"bias": (bias,), "bias_gelu_residual": (bias, residual), "scale_bias_residual": (0.5, bias, residual)}
    args = args.get(name, (bias,))
    out = gemm(a, b, epilogue=epilogue, epilogue_args=args)     # no epilogue_reference: the library knows it
    expected = reference(a @ b, *args)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    tensors = [a, b, *(x for x in args if isinstance(x, torch.Tensor))]
    got = torch.autograd.grad(out.square().sum(), tensors)
    want = torch.autograd.grad(expected.square().sum(), tensors)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
