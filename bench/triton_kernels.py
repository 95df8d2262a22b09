"""The tutorial kernels written in Triton, for compile-time comparison (bench/compile_time.py).

Each mirrors its Tessera tutorial: same tile sizes, same dtypes. Compiling
for a GPU target needs no GPU.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def softmax(x_ptr, out_ptr, rows, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * cols + offs, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        kk = k * BK + rk
        a = tl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * N + rn[None, :], mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=(rm[:, None] < M) & (rn[None, :] < N))


SOURCES = {
    "vector_add": (add, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                   {"BLOCK": 1024}),
    "softmax": (softmax, {"x_ptr": "*fp32", "out_ptr": "*fp32", "rows": "i32", "cols": "i32", "BLOCK": "constexpr"},
                {"BLOCK": 1024}),
    "matmul": (matmul, {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
                        "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}, {"BM": 64, "BN": 64, "BK": 32}),
}


def _gpu_target(name: str) -> GPUTarget:
    arch = int(name.removeprefix("sm_").rstrip("a"))
    return GPUTarget("cuda", arch, 32)


def _compile(key: str, target: str) -> float:
    fn, signature, constexprs = SOURCES[key]
    start = time.perf_counter()
    triton.compile(ASTSource(fn, signature, constexprs), target=_gpu_target(target))
    return time.perf_counter() - start


def compile_times(target: str, repeat: int) -> dict:
    """Cold (empty cache) and warm (cache hit) compile seconds per kernel."""
    results = {}
    for key in SOURCES:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cache-")
        cold = _compile(key, target)
        warm = statistics.median(_compile(key, target) for _ in range(repeat))
        results[key] = {"cold": cold, "warm": warm}
    return results
