"""Kernels written with explicit shared memory (`tessera.shared`, `async_copy`, ...), for the tests.

`double_buffered_matmul` is the reference use: C = A @ B with two slots per
operand, the K block k + 1 copied asynchronously while the dot consumes
block k. `no_wait_matmul` is the same kernel with the wait left out.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

import tessera


@tessera.kernel
def double_buffered_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                           BK: tessera.constexpr):
    pid_m = tessera.program_id(0)
    pid_n = tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    a_smem = tessera.shared((2, BM, BK), tessera.f16)
    b_smem = tessera.shared((2, BK, BN), tessera.f16)
    tessera.async_copy(a_smem[0], a.block((BM, BK), (pid_m, 0)))
    tessera.async_copy(b_smem[0], b.block((BK, BN), (0, pid_n)))
    tessera.async_commit()
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in range(0, tessera.cdiv(K, BK)):
        s = k % 2
        # prefetch block k + 1 into the other slot (past the end the view zero-fills it)
        tessera.async_copy(a_smem[1 - s], a.block((BM, BK), (pid_m, k + 1)))
        tessera.async_copy(b_smem[1 - s], b.block((BK, BN), (k + 1, pid_n)))
        tessera.async_commit()
        tessera.async_wait(1)           # block k has landed; block k + 1 may still be in flight
        tessera.barrier()               # ... for every thread
        acc = tessera.dot(a_smem[s].load(), b_smem[s].load(), acc)
        tessera.barrier()               # everyone is done with slot s before it is refilled
    tessera.async_wait(0)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


@tessera.kernel
def no_wait_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                   BK: tessera.constexpr):
    pid_m = tessera.program_id(0)
    pid_n = tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    a_smem = tessera.shared((2, BM, BK), tessera.f16)
    b_smem = tessera.shared((2, BK, BN), tessera.f16)
    tessera.async_copy(a_smem[0], a.block((BM, BK), (pid_m, 0)))
    tessera.async_copy(b_smem[0], b.block((BK, BN), (0, pid_n)))
    tessera.async_commit()
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in range(0, tessera.cdiv(K, BK)):
        s = k % 2
        tessera.async_copy(a_smem[1 - s], a.block((BM, BK), (pid_m, k + 1)))
        tessera.async_copy(b_smem[1 - s], b.block((BK, BN), (k + 1, pid_n)))
        tessera.async_commit()
        tessera.barrier()
        acc = tessera.dot(a_smem[s].load(), b_smem[s].load(), acc)
        tessera.barrier()
    tessera.async_wait(0)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


@dataclass
class MatmulCase:
    M: int
    N: int
    K: int
    BM: int = 64
    BN: int = 64
    BK: int = 32
    seed: int = 0

    def __post_init__(self):
        rng = np.random.default_rng(self.seed)
        self.a = rng.standard_normal((self.M, self.K)).astype(np.float16)
        self.b = rng.standard_normal((self.K, self.N)).astype(np.float16)

    def args(self) -> list:
        return [self.a.copy(), self.b.copy(), np.zeros((self.M, self.N), np.float16), self.M, self.N, self.K]

    @property
    def grid(self) -> tuple[int, int]:
        return (-(-self.M // self.BM), -(-self.N // self.BN))

    @property
    def constexprs(self) -> dict:
        return {"BM": self.BM, "BN": self.BN, "BK": self.BK}

    def module(self, kernel=double_buffered_matmul):
        return kernel.specialize(*self.args(), **self.constexprs).module

    def expected(self) -> np.ndarray:
        return self.a.astype(np.float32) @ self.b.astype(np.float32)


F16_RESULT = {"rtol": 2e-2, "atol": 5e-2}


def line_of(kernel, text: str) -> int:
    """The source line of `kernel` that contains `text`."""
    lines, first = inspect.getsourcelines(kernel.source.fn if hasattr(kernel, "source") else kernel)
    return first + next(i for i, line in enumerate(lines) if text in line)


@tessera.kernel
def mbarrier_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                    BK: tessera.constexpr):
    """The double-buffered matmul with one mbarrier per slot instead of copy groups."""
    pid_m = tessera.program_id(0)
    pid_n = tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    a_smem = tessera.shared((2, BM, BK), tessera.f16)
    b_smem = tessera.shared((2, BK, BN), tessera.f16)
    bars = tessera.mbarriers(2)
    tessera.async_copy(a_smem[0], a.block((BM, BK), (pid_m, 0)), barrier=bars[0])
    tessera.async_copy(b_smem[0], b.block((BK, BN), (0, pid_n)), barrier=bars[0])
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    steps = tessera.cdiv(K, BK)
    for k in range(0, steps):
        s = k % 2
        if k + 1 < steps:           # prefetch block k + 1 into the other slot
            tessera.async_copy(a_smem[1 - s], a.block((BM, BK), (pid_m, k + 1)), barrier=bars[1 - s])
            tessera.async_copy(b_smem[1 - s], b.block((BK, BN), (k + 1, pid_n)), barrier=bars[1 - s])
        bars[s].wait((k // 2) % 2)  # block k has landed, for every thread
        acc = tessera.dot(a_smem[s].load(), b_smem[s].load(), acc)
        tessera.barrier()           # everyone is done with slot s before it is refilled
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))
