"""Small kernels the fusion tests chain: elementwise ones over blocks of a flat buffer, and row kernels over
BM-row blocks of an M x N matrix (N <= BN) that together make a softmax and a layer norm."""

import tessera


@tessera.kernel
def scale(x_ptr, y_ptr, n, s, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    tessera.store(y_ptr + offs, tessera.load(x_ptr + offs, mask=offs < n) * s, mask=offs < n)


@tessera.kernel
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs, mask=offs < n)
    tessera.store(out_ptr + offs, x + tessera.load(y_ptr + offs, mask=offs < n), mask=offs < n)


@tessera.kernel
def unary(x_ptr, y_ptr, n, OP: tessera.constexpr, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs, mask=offs < n)
    if OP == "relu":
        y = tessera.maximum(x, 0.0)
    elif OP == "tanh":
        y = tessera.tanh(x)
    elif OP == "square":
        y = x * x
    else:
        y = tessera.sigmoid(x)
    tessera.store(y_ptr + offs, y, mask=offs < n)


@tessera.kernel
def bias_gelu(x_ptr, bias_ptr, out_ptr, n, N, BLOCK: tessera.constexpr):
    """out = gelu(x + bias[column]) over a row-major M x N matrix seen as n = M * N elements."""
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    y = tessera.load(x_ptr + offs, mask=offs < n) + tessera.load(bias_ptr + offs % N, mask=offs < n)
    gelu = 0.5 * y * (1.0 + tessera.tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)))
    tessera.store(out_ptr + offs, gelu, mask=offs < n)


@tessera.func
def rows(ptr, M, N, BM, BN):
    """This program's BM x BN block of rows of an M x N matrix."""
    return tessera.view(ptr, (M, N)).block((BM, BN), (tessera.program_id(0), 0))


@tessera.func
def row_values(ptr, M, BM):
    return tessera.view(ptr, (M,)).block((BM,), (tessera.program_id(0),))


@tessera.kernel
def row_max(x_ptr, m_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    x = rows(x_ptr, M, N, BM, BN).load()
    cols = tessera.arange(0, BN)[None, :]
    row_values(m_ptr, M, BM).store(tessera.max(tessera.where(cols < N, x, -float("inf")), axis=1))


@tessera.kernel
def exp_minus(x_ptr, m_ptr, e_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    x = rows(x_ptr, M, N, BM, BN).load()
    rows(e_ptr, M, N, BM, BN).store(tessera.exp(x - row_values(m_ptr, M, BM).load()[:, None]))


@tessera.kernel
def row_sum(x_ptr, s_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    row_values(s_ptr, M, BM).store(tessera.sum(rows(x_ptr, M, N, BM, BN).load(), axis=1))


@tessera.kernel
def divide_rows(x_ptr, s_ptr, y_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    x = rows(x_ptr, M, N, BM, BN).load()
    rows(y_ptr, M, N, BM, BN).store(x / row_values(s_ptr, M, BM).load()[:, None])


@tessera.kernel
def row_mean(x_ptr, mu_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    row_values(mu_ptr, M, BM).store(tessera.sum(rows(x_ptr, M, N, BM, BN).load(), axis=1) / N)


@tessera.kernel
def row_variance(x_ptr, mu_ptr, var_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    x = rows(x_ptr, M, N, BM, BN).load()
    d = tessera.where(tessera.arange(0, BN)[None, :] < N, x - row_values(mu_ptr, M, BM).load()[:, None], 0.0)
    row_values(var_ptr, M, BM).store(tessera.sum(d * d, axis=1) / N)


@tessera.kernel
def normalize(x_ptr, mu_ptr, var_ptr, w_ptr, y_ptr, M, N, eps, BM: tessera.constexpr, BN: tessera.constexpr):
    x = rows(x_ptr, M, N, BM, BN).load()
    inv = tessera.rsqrt(row_values(var_ptr, M, BM).load() + eps)
    w = tessera.view(w_ptr, (1, N)).block((1, BN), (0, 0)).load()
    rows(y_ptr, M, N, BM, BN).store((x - row_values(mu_ptr, M, BM).load()[:, None]) * inv[:, None] * w)


@tessera.kernel
def shifted_copy(x_ptr, y_ptr, n, BLOCK: tessera.constexpr):
    """y[i] = x[i + 1]: reads a neighbour program's elements, so it cannot take x from a producer's registers."""
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    tessera.store(y_ptr + offs, tessera.load(x_ptr + offs + 1, mask=offs + 1 < n), mask=offs < n)


@tessera.func
def bias_gelu_residual(acc, bias, residual):
    """A GEMM epilogue: gelu(acc + bias) + residual (erf form)."""
    x = acc + bias
    return 0.5 * x * (1.0 + tessera.erf(x * 0.7071067811865476)) + residual


@tessera.func
def dequantize_int8(codes, scale):
    """A GEMM prologue on op(b): int8 codes times a per-column scale, in float16."""
    return (codes.to(tessera.f32) * scale).to(tessera.f16)


@tessera.func
def softcap(score, cap):
    """An attention score_mod: cap * tanh(score / cap)."""
    return cap * tessera.tanh(score / cap)
