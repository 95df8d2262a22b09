"""Tutorial 03: a tiled matrix multiplication with `dot`.

C = A @ B, with each program instance computing one BM x BN block of C.
It walks the K dimension in steps of BK, loading a BM x BK block of A and a
BK x BN block of B and accumulating their product in float32 with
`tessera.dot`. Block loads through views are bounds-checked, so M, N and K
need not be multiples of the block sizes: the edges read zeros, which add
nothing to the sum, and stores past the edge are dropped.

On a GPU `dot` maps to tensor cores, and the compiler pipelines this plain
`range` K loop on its own: the next blocks of A and B stream into
shared-memory ring buffers (cp.async on sm_80, TMA on sm_90a) while this
one computes (tutorial 04 shows the explicit `tessera.pipeline`). Here it
runs on the CPU interpreter.

    python tutorials/03-matmul.py
"""

import numpy as np

import tessera


@tessera.kernel
def matmul(a_ptr, b_ptr, c_ptr, M, N, K,
           BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr):
    pid_m = tessera.program_id(0)
    pid_n = tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    c = tessera.view(c_ptr, (M, N))

    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in range(0, tessera.cdiv(K, BK)):
        a_block = a.block((BM, BK), (pid_m, k)).load()
        b_block = b.block((BK, BN), (k, pid_n)).load()
        acc = tessera.dot(a_block, b_block, acc)
    c.block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


def main() -> None:
    M, N, K = 200, 136, 300
    BM, BN, BK = 64, 64, 32
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = np.zeros((M, N), dtype=np.float16)

    grid = (tessera.cdiv(M, BM), tessera.cdiv(N, BN))
    matmul[grid](a, b, c, M, N, K, BM=BM, BN=BN, BK=BK)

    expected = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    np.testing.assert_allclose(c.astype(np.float32), expected.astype(np.float32), rtol=1e-2, atol=1e-2)
    print(f"matmul: ({M}x{K}) @ ({K}x{N}) in float16 with float32 accumulation, "
          f"{grid[0]}x{grid[1]} programs of {BM}x{BN} -- matches numpy")


if __name__ == "__main__":
    main()
