"""Tutorial 05: your kernel as a PyTorch op.

A Tessera kernel launched on torch tensors is an ordinary Python call, but
torch.compile does not trace Python it cannot see into: a raw
`kernel[grid](...)` inside a compiled function runs outside the graph (a graph
break; under `fullgraph=True`, an error that says what to do). To keep it in
the graph, wrap the Python function that launches the kernel with
`tessera.torch.op`: it becomes a `torch.library.custom_op`, whose fake
implementation is the same function with the launch skipped (it allocates the
output, which is all the compiler needs to know), and, given a backward, it
differentiates.

This script runs on the CPU: CPU tensors launch on Tessera's tile
interpreter. On a GPU, the same code launches on CUDA tensors. It compiles
with `backend="aot_eager"` to stay quick; Inductor, the default backend,
compiles the same graph (the op is an extern call in its code).

    python tutorials/05-pytorch-ops.py
"""

import numpy as np
import torch

import tessera
import tessera.torch


@tessera.kernel
def bias_gelu_kernel(x_ptr, bias_ptr, out_ptr, rows, cols, BLOCK: tessera.constexpr):
    """out[r, c] = gelu(x[r, c] + bias[c]) (tanh approximation); one program per row."""
    row = tessera.program_id(0)
    offsets = tessera.arange(0, BLOCK)
    mask = offsets < cols
    x = tessera.load(x_ptr + row * cols + offsets, mask=mask) + tessera.load(bias_ptr + offsets, mask=mask)
    inner = 0.7978845608 * (x + 0.044715 * x * x * x)
    tessera.store(out_ptr + row * cols + offsets, 0.5 * x * (1.0 + tessera.tanh(inner)), mask=mask)


def gelu_grad(pre: torch.Tensor) -> torch.Tensor:
    """d gelu / d pre, tanh approximation (in torch: the backward needs no kernel of its own here)."""
    t = torch.tanh(0.7978845608 * (pre + 0.044715 * pre ** 3))
    return 0.5 * (1 + t) + 0.5 * pre * (1 - t * t) * 0.7978845608 * (1 + 3 * 0.044715 * pre * pre)


def setup_context(ctx, inputs, output):
    x, bias = inputs
    ctx.save_for_backward(x + bias)


def backward(ctx, grad):
    (pre,) = ctx.saved_tensors
    grad_pre = grad * gelu_grad(pre)
    return grad_pre, grad_pre.sum(0)


# Step 1: the launching function becomes the op `tutorial::bias_gelu`. Its type annotations are its schema.
@tessera.torch.op("tutorial::bias_gelu", mutates_args=(), backward=backward, setup_context=setup_context)
def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    rows, cols = x.shape
    out = torch.empty_like(x)
    bias_gelu_kernel[(rows,)](x.contiguous(), bias.contiguous(), out, rows, cols,
                              BLOCK=tessera.next_power_of_2(cols))
    return out


def reference(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    pre = x + bias
    return 0.5 * pre * (1 + np.tanh(0.7978845608 * (pre + 0.044715 * pre ** 3)))


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 48, generator=generator)
    bias = torch.randn(48, generator=generator)

    # Step 2: torch.library.opcheck tests the schema, the fake implementation and autograd's registration.
    torch.library.opcheck(bias_gelu, (x, bias))
    torch.library.opcheck(bias_gelu, (x.clone().requires_grad_(), bias.clone().requires_grad_()))

    # Step 3: the op stays inside a fully compiled graph, backward included.
    @torch.compile(fullgraph=True, backend="aot_eager")
    def layer(x, weight, bias):
        return bias_gelu(x @ weight, bias).sum(dim=1)

    weight = torch.eye(48).requires_grad_()
    loss = layer(x, weight, bias).sum()
    loss.backward()
    expected = reference(x.numpy(), bias.numpy())
    np.testing.assert_allclose(loss.item(), expected.sum(), rtol=1e-4)
    expected_grad = x.numpy().T @ (gelu_grad(x + bias).numpy())     # d loss / d weight
    np.testing.assert_allclose(weight.grad.numpy(), expected_grad, rtol=1e-4, atol=1e-4)

    # Step 4: a raw launch inside torch.compile is called outside the graph (a graph break), still right.
    @torch.compile(backend="aot_eager")
    def raw(x, bias):
        out = torch.empty_like(x)
        bias_gelu_kernel[(x.shape[0],)](x, bias, out, x.shape[0], x.shape[1], BLOCK=64)
        return out * 2

    np.testing.assert_allclose(raw(x, bias).numpy(), 2 * expected, rtol=1e-5, atol=1e-6)
    print(f"bias + gelu as the op torch.ops.tutorial.bias_gelu: opcheck passes, compiled with fullgraph=True "
          f"and differentiated -- matches numpy")


if __name__ == "__main__":
    main()
