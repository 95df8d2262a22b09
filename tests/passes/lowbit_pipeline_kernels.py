"""The pipelined matmul of 8-bit and tf32 operands the low-bit pipelining tests share (IR, SIMT simulator, PTX).

`lowbit_case(name, ...)` traces it for one problem: A (M x K) row-major and
B given as B^T (N x K, row-major: the K-contiguous "column-major B" of
torch._scaled_mm), or row-major K x N with `b_k_major=False`. C is the
accumulator's dtype (i32 for i8/u8, f32 otherwise), stored as is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import tessera
from tessera.ir import dtypes as dt
from tessera.ir.core import Module


@tessera.kernel
def lowbit_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_bk, stride_bn,
                  BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr, STAGES: tessera.constexpr,
                  ACC: tessera.constexpr, PRECISION: tessera.constexpr):
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N), (stride_bk, stride_bn))
    acc = tessera.zeros((BM, BN), dtype=ACC)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc,
                          input_precision=PRECISION)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc)


# name: (A dtype, B dtype, accumulator, input_precision)
DTYPES = {
    "i8": (tessera.i8, tessera.i8, tessera.i32, None),
    "u8": (tessera.u8, tessera.u8, tessera.i32, None),
    "e4m3": (tessera.f8e4m3, tessera.f8e4m3, tessera.f32, None),
    "e5m2": (tessera.f8e5m2, tessera.f8e5m2, tessera.f32, None),
    "e4m3xe5m2": (tessera.f8e4m3, tessera.f8e5m2, tessera.f32, None),
    "tf32": (tessera.f32, tessera.f32, tessera.f32, "tf32"),
}


def tf32(x: np.ndarray) -> np.ndarray:
    """float32 rounded to tf32 like cvt.rna.tf32.f32 (to nearest, ties away from zero: 10 mantissa bits)."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


@dataclass
class LowbitCase:
    module: Module
    grid: tuple[int, int]
    a: np.ndarray               # the values the kernel multiplies (exact in float64 / int64)
    b: np.ndarray               # logical K x N
    make_args: object           # () -> fresh arguments for run_function / run_threads

    def expected(self) -> np.ndarray:
        """numpy's product of the values the tensor cores see (int64 wrapped to i32; float64 otherwise)."""
        if np.issubdtype(self.a.dtype, np.integer):
            return (self.a.astype(np.int64) @ self.b.astype(np.int64)).astype(np.int32)
        return self.a.astype(np.float64) @ self.b.astype(np.float64)


def _values(rng, shape, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(storage for the kernel, the values it holds)."""
    if dtype in (tessera.i8, tessera.u8):
        info = np.iinfo(np.int8 if dtype == tessera.i8 else np.uint8)
        x = rng.integers(info.min, info.max + 1, shape).astype(info.dtype)
        return x, x
    x = rng.standard_normal(shape).astype(np.float32)
    if dtype == tessera.f32:
        return x, x
    bits = dtype.encode(x)                      # fp8: uint8 bit patterns
    return bits, np.asarray(dtype.decode(bits), np.float32)


def lowbit_case(name, M, N, K, BM, BN, BK, stages, b_k_major=True, seed=0) -> LowbitCase:
    a_dtype, b_dtype, acc, precision = DTYPES[name]
    rng = np.random.default_rng(seed)
    a_host, a = _values(rng, (M, K), a_dtype)
    b_host, b = _values(rng, (K, N), b_dtype)
    if a_dtype == tessera.f32:
        a, b = tf32(a), tf32(b)
    b_stored, strides = (np.ascontiguousarray(b_host.T), (1, K)) if b_k_major else (b_host, (N, 1))
    out = np.int32 if acc == tessera.i32 else np.float32

    def make_args():
        return [a_host.copy(), b_stored.copy(), np.zeros((M, N), out), M, N, K, *strides]

    typed = make_args()
    typed[0], typed[1] = _typed(typed[0], a_dtype), _typed(typed[1], b_dtype)
    module = lowbit_matmul.specialize(*typed, BM=BM, BN=BN, BK=BK, STAGES=stages, ACC=acc,
                                      PRECISION=precision).module
    grid = (tessera.cdiv(M, BM), tessera.cdiv(N, BN))
    return LowbitCase(module, grid, a, b, make_args)


def _typed(x, dtype):
    return tessera.reinterpret(x, dtype) if dtype in (dt.f8e4m3, dt.f8e5m2) else x
