"""Tutorial 08: fusion -- your function inside the library GEMM, and a chain of kernels as one.

Every kernel launch reads its inputs from memory and writes its result back.
A GEMM followed by a bias, an activation and a residual add pays that round
trip four times for work the GEMM could do on the tile it already holds in
registers. Tessera fuses at two levels:

1. **Into a library kernel.** `gemm(a, b, epilogue=fn, epilogue_args=(...))`
   compiles `fn`, a `@tessera.func`, into the GEMM: it receives the float32
   accumulator tile and the operands (a bias row, a residual matrix, a scalar,
   and by name the tile's `rows` / `cols` indices) already loaded as the
   matching tiles, and returns what to store. A wrong signature or operand
   shape is a `tessera.CompileError` pointing at your code. The fused kernel
   has no derivative of its own: to train through it, pass
   `epilogue_reference=`, the same function in torch, and the backward
   differentiates that (without one, a gradient is an error naming this fix;
   `tessera.kernels_lib.epilogues` has common epilogues that carry theirs).
   Under `torch.compile` the hooked GEMM is a clean graph break.
2. **Across your kernels.** Inside `with tessera.fusion() as f:` launches are
   recorded, not run. When the block ends, the fusion pass proves from the
   tile IR where a kernel reads exactly the tiles the kernel before it wrote
   (same program ids, same blocks), forwards them in registers and drops the
   store of an intermediate nobody holds any more; independent launches
   become one launch. `f.report()` says what was fused and why the rest was
   not. A library GEMM followed by an elementwise kernel becomes one GEMM
   with that kernel as its epilogue; on CUDA tensors the GEMM, which would
   time its configs, is recorded with the config tuned for its shape before,
   else the one the library's model predicts (the report says which), and
   the fused binary is cached on disk under its IR.

Runs on the CPU (the tile interpreter); CUDA tensors take the same code to the GPU.

    python tutorials/08-fusion.py
"""

import math

import numpy as np
import torch

import tessera
from tessera.kernels_lib import gemm

# -- 1. An epilogue: GEMM + bias + GELU + residual in one kernel -------------------------


@tessera.func
def bias_gelu_residual(acc, bias, residual):
    """acc is the float32 (BM, BN) tile of a @ b; bias arrives as its (1, BN) slice, residual as (BM, BN)."""
    x = acc + bias
    return 0.5 * x * (1.0 + tessera.erf(x * (1.0 / math.sqrt(2.0)))) + residual


a, b = torch.randn(48, 64), torch.randn(64, 40)
bias, residual = torch.randn(40), torch.randn(48, 40)
y = gemm(a, b, epilogue=bias_gelu_residual, epilogue_args=(bias, residual))
expected = torch.nn.functional.gelu(a @ b + bias) + residual
np.testing.assert_allclose(y.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)
print("epilogue: gemm + bias + gelu + residual in one kernel matches numpy")

# Training through it: the backward differentiates a torch reference of the epilogue.
w = b.clone().requires_grad_()
loss = gemm(a, w, epilogue=bias_gelu_residual, epilogue_args=(bias, residual),
            epilogue_reference=lambda acc, bias, residual: torch.nn.functional.gelu(acc + bias) + residual).sum()
loss.backward()
w_ref = b.clone().requires_grad_()
(torch.nn.functional.gelu(a @ w_ref + bias) + residual).sum().backward()
np.testing.assert_allclose(w.grad.numpy(), w_ref.grad.numpy(), rtol=1e-4, atol=1e-4)
print("epilogue gradient through epilogue_reference matches torch's")

# -- 2. A captured chain: softmax written as four kernels runs as one ---------------------

M, N, BM, BN = 50, 24, 16, 32


@tessera.func
def rows(ptr, M, N, BM, BN):
    """This program's block of BM rows of an M x N matrix."""
    return tessera.view(ptr, (M, N)).block((BM, BN), (tessera.program_id(0), 0))


@tessera.func
def per_row(ptr, M, BM):
    """This program's BM entries of a length-M vector (one per row)."""
    return tessera.view(ptr, (M,)).block((BM,), (tessera.program_id(0),))


@tessera.kernel
def row_max(x_ptr, m_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    x = tessera.where(tessera.arange(0, BN)[None, :] < N, rows(x_ptr, M, N, BM, BN).load(), -float("inf"))
    per_row(m_ptr, M, BM).store(tessera.max(x, axis=1))


@tessera.kernel
def exp_minus(x_ptr, m_ptr, e_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    x = rows(x_ptr, M, N, BM, BN).load()
    rows(e_ptr, M, N, BM, BN).store(tessera.exp(x - per_row(m_ptr, M, BM).load()[:, None]))


@tessera.kernel
def row_sum(e_ptr, s_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    per_row(s_ptr, M, BM).store(tessera.sum(rows(e_ptr, M, N, BM, BN).load(), axis=1))


@tessera.kernel
def divide(e_ptr, s_ptr, y_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    e = rows(e_ptr, M, N, BM, BN).load()
    rows(y_ptr, M, N, BM, BN).store(e / per_row(s_ptr, M, BM).load()[:, None])


def softmax(x: torch.Tensor, out: torch.Tensor) -> None:
    """Four launches; m, e and s are intermediates that die when this returns."""
    m, e, s = torch.empty(M), torch.empty(M, N), torch.empty(M)
    grid = (tessera.cdiv(M, BM),)
    row_max[grid](x, m, M, N, BM=BM, BN=BN)
    exp_minus[grid](x, m, e, M, N, BM=BM, BN=BN)
    row_sum[grid](e, s, M, N, BM=BM, BN=BN)
    divide[grid](e, s, out, M, N, BM=BM, BN=BN)


x, out = torch.randn(M, N), torch.empty(M, N)
with tessera.fusion() as f:
    softmax(x, out)
print(f.report())
assert f.ran == ["row_max+exp_minus+row_sum+divide"]            # four launches -> one
assert f.traffic["ran"] < f.traffic["recorded"] / 2              # e, m and s never reach memory
np.testing.assert_allclose(out.numpy(), torch.softmax(x, dim=1).numpy(), rtol=1e-5, atol=1e-6)
print("captured chain: softmax from four kernels in one launch matches numpy")

# -- 3. A captured GEMM and an elementwise kernel: the kernel becomes the GEMM's epilogue ---


@tessera.kernel
def add_gelu(x_ptr, bias_ptr, y_ptr, n, N, BLOCK: tessera.constexpr):
    """y = gelu(x + bias[column]) over a row-major matrix seen as n = M * N elements."""
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs, mask=offs < n) + tessera.load(bias_ptr + offs % N, mask=offs < n)
    tessera.store(y_ptr + offs, 0.5 * x * (1.0 + tessera.erf(x * (1.0 / math.sqrt(2.0)))), mask=offs < n)


y = torch.empty(48, 40)
with tessera.fusion() as f:
    c = gemm(a, b)
    add_gelu[(tessera.cdiv(c.numel(), 256),)](c, bias, y, c.numel(), 40, BLOCK=256)
    del c                                       # an intermediate: the GEMM never stores it
print(f.report())
assert f.ran == ["gemm_split_k_kernel+add_gelu"]    # 48 rows: the op runs its small-M (decode) kernel
np.testing.assert_allclose(y.numpy(), torch.nn.functional.gelu(a @ b + bias).numpy(), rtol=1e-4, atol=1e-4)
print("captured gemm -> elementwise: one launch, matches numpy")
