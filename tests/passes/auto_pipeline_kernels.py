"""Triton-style matmuls with plain `range` K loops, and the loops the compiler must not pipeline on its own.

`plain_matmul` is what `auto_pipeline.py` pipelines; `staged_matmul` is the
same loop under `tessera.pipeline(..., stages=STAGES)`. The other kernels
are one K loop each that feeds a dot but may not be read ahead: a store in
the loop (into C, which the caller may make A itself), an offset chased
through memory from one iteration to the next, a `while` re-reading its
bound from memory. `kernel.loop_line` is the source line of each one's loop,
where its refusal must point; `run_<kernel>()` runs it on the tile
interpreter and returns (numpy's result, the kernel's).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import tessera

SOURCE = Path(__file__).read_text().splitlines()


def _loop_line(name: str) -> int:
    """The line of the loop marked `# loop of <name>` in this file."""
    return next(i for i, line in enumerate(SOURCE, 1) if line.endswith(f"# loop of {name}"))


@tessera.kernel
def plain_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                 BK: tessera.constexpr):
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in range(0, tessera.cdiv(K, BK)):  # loop of plain_matmul
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


@tessera.kernel
def staged_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                  BK: tessera.constexpr, STAGES: tessera.constexpr):
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES):
        acc = tessera.dot(a.block((BM, BK), (0, k)).load(), b.block((BK, BN), (k, 0)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (0, 0)).store(acc.to(tessera.f16))


@tessera.kernel
def aliasing_store(a_ptr, b_ptr, c_ptr, K, BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr):
    """Writes the running sum to C in every iteration (a progress snapshot): harmless unless C is A or B."""
    a = tessera.view(a_ptr, (BM, K))
    b = tessera.view(b_ptr, (K, BN))
    c = tessera.view(c_ptr, (BM, BN))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in range(0, tessera.cdiv(K, BK)):  # loop of aliasing_store
        acc = tessera.dot(a.block((BM, BK), (0, k)).load(), b.block((BK, BN), (k, 0)).load(), acc)
        c.block((BM, BN), (0, 0)).store(acc.to(tessera.f16))


@tessera.kernel
def chased_offsets(a_ptr, b_ptr, c_ptr, next_ptr, K, BM: tessera.constexpr, BN: tessera.constexpr,
                   BK: tessera.constexpr):
    """Visits K blocks in the order a linked list in memory gives (next_ptr[i]: the block after the i-th)."""
    a = tessera.view(a_ptr, (BM, K))
    b = tessera.view(b_ptr, (K, BN))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    kb = 0
    for k in range(0, tessera.cdiv(K, BK)):  # loop of chased_offsets
        acc = tessera.dot(a.block((BM, BK), (0, kb)).load(), b.block((BK, BN), (kb, 0)).load(), acc)
        kb = tessera.load(next_ptr + k)
    tessera.view(c_ptr, (BM, BN)).block((BM, BN), (0, 0)).store(acc.to(tessera.f16))


@tessera.kernel
def while_from_memory(a_ptr, b_ptr, c_ptr, steps_ptr, K, BM: tessera.constexpr, BN: tessera.constexpr,
                      BK: tessera.constexpr):
    """Runs while k is below a count it reads from memory at every test."""
    a = tessera.view(a_ptr, (BM, K))
    b = tessera.view(b_ptr, (K, BN))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    k = 0
    while k < tessera.load(steps_ptr):  # loop of while_from_memory
        acc = tessera.dot(a.block((BM, BK), (0, k)).load(), b.block((BK, BN), (k, 0)).load(), acc)
        k += 1
    tessera.view(c_ptr, (BM, BN)).block((BM, BN), (0, 0)).store(acc.to(tessera.f16))


@tessera.kernel
def loaded_trip_count(a_ptr, b_ptr, c_ptr, steps_ptr, K, BM: tessera.constexpr, BN: tessera.constexpr,
                      BK: tessera.constexpr):
    """Reads its trip count from memory once, before the loop: known on entry, so pipelined."""
    a = tessera.view(a_ptr, (BM, K))
    b = tessera.view(b_ptr, (K, BN))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in range(0, tessera.load(steps_ptr)):  # loop of loaded_trip_count
        acc = tessera.dot(a.block((BM, BK), (0, k)).load(), b.block((BK, BN), (k, 0)).load(), acc)
    tessera.view(c_ptr, (BM, BN)).block((BM, BN), (0, 0)).store(acc.to(tessera.f16))


@tessera.kernel
def half_by_hand(a_ptr, b_ptr, c_ptr, K, BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr):
    """Copies A's block into shared memory itself (one slot, waited for at once); reads B's directly."""
    a = tessera.view(a_ptr, (BM, K))
    b = tessera.view(b_ptr, (K, BN))
    a_smem = tessera.shared((BM, BK), a_ptr.dtype)
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in range(0, tessera.cdiv(K, BK)):  # loop of half_by_hand
        tessera.async_copy(a_smem, a.block((BM, BK), (0, k)))
        tessera.async_commit()
        tessera.async_wait(0)
        tessera.barrier()
        acc = tessera.dot(a_smem.load(), b.block((BK, BN), (k, 0)).load(), acc)
        tessera.barrier()
    tessera.view(c_ptr, (BM, BN)).block((BM, BN), (0, 0)).store(acc.to(tessera.f16))


@tessera.kernel
def pointer_matmul(a_ptr, b_ptr, c_ptr, K, BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr):
    """Triton's pointer-arithmetic style: blocks read through tiles of pointers, not views."""
    rows, cols = tessera.arange(0, BM)[:, None], tessera.arange(0, BN)[None, :]
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in range(0, K, BK):  # loop of pointer_matmul
        ks = k + tessera.arange(0, BK)
        a = tessera.load(a_ptr + rows * K + ks[None, :])
        b = tessera.load(b_ptr + ks[:, None] * BN + cols)
        acc = tessera.dot(a, b, acc)
    tessera.store(c_ptr + rows * BN + cols, acc.to(tessera.f16))


for _kernel in (plain_matmul, pointer_matmul, aliasing_store, chased_offsets, while_from_memory, loaded_trip_count):
    _kernel.loop_line = _loop_line(_kernel.__name__)


def matmul_args(M: int, N: int, K: int, seed: int = 0) -> list:
    """f16 A (M x K), B (K x N) of small integers and a zeroed f16 C, then M, N, K."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-2, 3, (M, K)).astype(np.float16)
    b = rng.integers(-2, 3, (K, N)).astype(np.float16)
    return [a, b, np.zeros((M, N), np.float16), M, N, K]


BLOCKS = dict(BM=64, BN=64, BK=32)


def _product(a, b) -> np.ndarray:
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float32)


def run_aliasing_store():
    a, b, c, _, _, K = matmul_args(64, 64, 64)
    aliasing_store.interpret(a, b, c, K, grid=(1,), **BLOCKS)
    return _product(a, b), c.astype(np.float32)


def run_chased_offsets():
    a, b, c, _, _, K = matmul_args(64, 64, 64)
    chased_offsets.interpret(a, b, c, np.array([1, 2], np.int32), K, grid=(1,), **BLOCKS)
    return _product(a, b), c.astype(np.float32)


def run_while_from_memory():
    a, b, c, _, _, K = matmul_args(64, 64, 64)
    while_from_memory.interpret(a, b, c, np.array([2], np.int32), K, grid=(1,), **BLOCKS)
    return _product(a, b), c.astype(np.float32)


def run_half_by_hand():
    a, b, c, _, _, K = matmul_args(64, 64, 64)
    half_by_hand.interpret(a, b, c, K, grid=(1,), **BLOCKS)
    return _product(a, b), c.astype(np.float32)


def run_pointer_matmul():
    a, b, c, _, _, K = matmul_args(64, 64, 64)
    pointer_matmul.interpret(a, b, c, K, grid=(1,), **BLOCKS)
    return _product(a, b), c.astype(np.float32)


def run_loaded_trip_count():
    a, b, c, _, _, K = matmul_args(64, 64, 64)
    loaded_trip_count.interpret(a, b, c, np.array([2], np.int32), K, grid=(1,), **BLOCKS)
    return _product(a, b), c.astype(np.float32)
