"""The pipelined matmul the software-pipelining tests share (IR, SIMT simulator and PTX).

`matmul_case(...)` traces it for one problem and returns its tile-IR module
with fresh arguments (`fixed_k`: K is a constexpr, so the alignment analysis
knows exactly how aligned A's rows are); B is read through strides, so `trans_b` stores it as
B^T (N x K, row-major), whose view has unit stride along K (dim 0). C is
float16 (the accumulator is cast on the way out, as in tutorial 03).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import tessera
from tessera.ir.core import Module


@tessera.func
def matmul_block(a_ptr, b_ptr, c_ptr, M, N, K, stride_bk, stride_bn, BM, BN, BK, STAGES):
    pid_m = tessera.program_id(0)
    pid_n = tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N), (stride_bk, stride_bn))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


@tessera.kernel
def pipelined_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_bk, stride_bn,
                     BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr,
                     STAGES: tessera.constexpr):
    matmul_block(a_ptr, b_ptr, c_ptr, M, N, K, stride_bk, stride_bn, BM, BN, BK, STAGES)


@tessera.kernel
def pipelined_matmul_fixed_k(a_ptr, b_ptr, c_ptr, M, N, stride_bk, stride_bn, K: tessera.constexpr,
                             BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr,
                             STAGES: tessera.constexpr):
    """K known at compile time: its exact alignment (K = 100: 4 elements) decides A's copy width."""
    matmul_block(a_ptr, b_ptr, c_ptr, M, N, K, stride_bk, stride_bn, BM, BN, BK, STAGES)


NUMPY_DTYPES = {tessera.f16: np.float16}
# float16 results of float32 sums taken in different orders: one float16 rounding step apart at most.
F16_RESULT = dict(rtol=2e-3, atol=2e-3)


@dataclass
class MatmulCase:
    module: Module
    grid: tuple[int, int]
    a: np.ndarray               # as float32 (the values the kernel sees)
    b: np.ndarray               # logical K x N, float32
    make_args: object           # () -> fresh arguments for run_function / run_threads

    def expected(self) -> np.ndarray:
        """numpy's float32 product, rounded to the kernel's float16 output."""
        return (self.a @ self.b).astype(np.float16)


def _host(x: np.ndarray, dtype) -> np.ndarray:
    """float32 values as the storage of a `dtype` array (bf16: its bits, as uint16; fp8: its bytes)."""
    if dtype == tessera.bf16:
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if dtype in (tessera.f8e4m3, tessera.f8e5m2):
        return dtype.encode(x)
    return x.astype(NUMPY_DTYPES[dtype])


def _exact(x: np.ndarray, dtype) -> np.ndarray:
    """float32 values representable in `dtype` (bf16: truncated to its 8 mantissa bits; fp8: rounded)."""
    if dtype == tessera.bf16:
        return ((x.astype(np.float32).view(np.uint32) >> 16) << 16).astype(np.uint32).view(np.float32)
    if dtype in (tessera.f8e4m3, tessera.f8e5m2):
        return dtype.decode(dtype.encode(x)).astype(np.float32)
    return x.astype(NUMPY_DTYPES[dtype]).astype(np.float32)


def matmul_case(M, N, K, BM, BN, BK, stages, dtype=tessera.f16, trans_b=False, seed=0,
                fixed_k=False) -> MatmulCase:
    rng = np.random.default_rng(seed)
    a = _exact(rng.standard_normal((M, K)), dtype)
    b = _exact(rng.standard_normal((K, N)), dtype)
    b_stored, strides = (np.ascontiguousarray(b.T), (1, K)) if trans_b else (b, (N, 1))

    sizes = [M, N] if fixed_k else [M, N, K]

    def make_args():
        return [_host(a, dtype), _host(b_stored, dtype), np.zeros((M, N), np.float16), *sizes, *strides]

    typed = [tessera.reinterpret(x, dtype) if i < 2 else x for i, x in enumerate(make_args())]
    constexprs = dict(BM=BM, BN=BN, BK=BK, STAGES=stages, **({"K": K} if fixed_k else {}))
    kernel = pipelined_matmul_fixed_k if fixed_k else pipelined_matmul
    module = kernel.specialize(*typed, **constexprs).module
    grid = (tessera.cdiv(M, BM), tessera.cdiv(N, BN))
    return MatmulCase(module, grid, a, b, make_args)
