"""`tessera.torch.op` turns a function launching Tessera kernels into a PyTorch op: it computes on the CPU
interpreter, passes `torch.library.opcheck`, stays in the graph under `torch.compile(fullgraph=True)` and
differentiates when given a backward; a raw launch inside torch.compile breaks the graph cleanly."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
import tessera.torch  # noqa: E402


@tessera.kernel
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    mask = offs < n
    x = tessera.load(x_ptr + offs, mask=mask)
    tessera.store(out_ptr + offs, alpha * x + tessera.load(y_ptr + offs, mask=mask), mask=mask)


def launch_scaled_add(x, y, out, alpha):
    n = x.numel()
    scaled_add_kernel[(tessera.cdiv(n, 64),)](x, y, out, n, alpha, BLOCK=64)


def _setup(ctx, inputs, output):
    ctx.alpha = inputs[2]


def _backward(ctx, grad):
    return grad * ctx.alpha, grad, None


@tessera.torch.op("tessera_tests::scaled_add", mutates_args=(), backward=_backward, setup_context=_setup)
def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    out = torch.empty_like(x)
    launch_scaled_add(x, y, out, alpha)
    return out


@tessera.torch.op("tessera_tests::scaled_add_", mutates_args=("y",))
def scaled_add_(x: torch.Tensor, y: torch.Tensor, alpha: float) -> None:
    launch_scaled_add(x, y, y, alpha)


def inputs(n=100):
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, generator=generator), torch.randn(n, generator=generator)


def test_the_op_computes_on_the_interpreter():
    x, y = inputs()
    np.testing.assert_allclose(scaled_add(x, y, 2.0).numpy(), 2 * x.numpy() + y.numpy(), rtol=1e-6)
    np.testing.assert_allclose(torch.ops.tessera_tests.scaled_add(x, y, 0.5).numpy(), 0.5 * x.numpy() + y.numpy(),
                               rtol=1e-6)


def test_opcheck_passes_with_and_without_gradients():
    x, y = inputs()
    torch.library.opcheck(scaled_add, (x, y, 2.0))
    torch.library.opcheck(scaled_add, (x.requires_grad_(), y.requires_grad_(), 2.0))
    torch.library.opcheck(scaled_add_, (*inputs(), 3.0))


def test_the_fake_implementation_allocates_without_launching(monkeypatch):
    launched = []
    monkeypatch.setattr(tessera.Kernel, "_launch_slowly", lambda *a: launched.append(a))
    with torch._subclasses.fake_tensor.FakeTensorMode():
        out = scaled_add(torch.empty(7), torch.empty(7), 2.0)
    assert (out.shape, out.dtype, launched) == ((7,), torch.float32, [])


def test_the_op_stays_in_the_graph_under_fullgraph_compile_and_differentiates():
    x, y = inputs()
    compiled = torch.compile(lambda x, y: scaled_add(x, y, 3.0) * 2, fullgraph=True, backend="aot_eager")
    np.testing.assert_allclose(compiled(x, y).numpy(), 2 * (3 * x.numpy() + y.numpy()), rtol=1e-6)
    x.requires_grad_()
    compiled(x, y).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(100, 6.0))


def test_a_raw_launch_inside_torch_compile_breaks_the_graph_cleanly():
    x, y = inputs()

    def raw(x, y):
        out = torch.empty_like(x)
        n = x.numel()
        scaled_add_kernel[((n + 63) // 64,)](x + 1, y, out, n, 2.0, BLOCK=64)
        return out * 2

    torch._dynamo.reset()
    out = torch.compile(raw, backend="eager")(x, y)
    np.testing.assert_allclose(out.numpy(), 2 * (2 * (x.numpy() + 1) + y.numpy()), rtol=1e-6)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"make the function that launches it a PyTorch op "
                                                         r"with @tessera\.torch\.op"):
        torch.compile(raw, backend="eager", fullgraph=True)(x, y)


def test_a_name_without_a_namespace_is_refused():
    with pytest.raises(ValueError, match="mylib::scaled"):
        tessera.torch.op("scaled")


@pytest.mark.gpu
def test_the_op_on_cuda_tensors_under_inductor():
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    x, y = (t.cuda() for t in inputs(10_000))
    compiled = torch.compile(lambda x, y: scaled_add(x, y, 3.0) * 2, fullgraph=True)
    np.testing.assert_allclose(compiled(x, y).cpu().numpy(), 2 * (3 * x.cpu().numpy() + y.cpu().numpy()), rtol=1e-5)


def test_a_dispatch_is_observed_under_any_mode_transform_or_on_cpu_tensors():
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from tessera.torch import _nothing_watches, unobserved

    class Watching(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    assert _nothing_watches()
    with Watching():
        assert not _nothing_watches()
    with TorchFunctionMode():
        assert not _nothing_watches()
    assert torch.vmap(lambda x: x + (0.0 if _nothing_watches() else 1.0))(torch.zeros(2)).tolist() == [1.0, 1.0]
    assert torch.compile(lambda x: x + (0.0 if _nothing_watches() else 1.0), backend="eager")(
        torch.zeros(2)).tolist() == [1.0, 1.0]
    assert not unobserved(torch.zeros(2, 2), None)          # CPU tensors: library ops run the interpreter


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and a CUDA build of torch")
def test_plain_cuda_tensors_and_parameters_without_gradients_are_unobserved():
    from tessera.torch import unobserved

    x = torch.zeros(4, device="cuda")
    weight = torch.nn.Parameter(torch.zeros(4, device="cuda"))
    assert unobserved(x, None)
    assert not unobserved(x, weight)                        # the weight's gradient must be recorded
    with torch.no_grad():
        assert unobserved(x, weight)
    assert not unobserved(x, torch.zeros(4))                # a CPU tensor among them
