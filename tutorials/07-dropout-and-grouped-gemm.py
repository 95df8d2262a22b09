"""Tutorial 07: random numbers (dropout) and pointer arrays (a grouped GEMM).

Two kernels that need more of the language than arithmetic on tiles.

Dropout without a mask in memory. `tessera.rand(seed, offsets)` draws one
uniform float in [0, 1) per offset from a counter-based generator (Philox,
the stream of Triton's `tl.rand`, bit for bit): the number for (seed,
offset) is a pure function of the two, so the backward pass regenerates the
same mask instead of reading one that the forward pass stored.

A grouped GEMM over separate allocations (Triton's tutorial 08). Each group
g multiplies its own A_g (M_g x K_g) by B_g, in arrays of their own; the
kernel gets arrays of their *addresses* and of their sizes. A program loads
its group's addresses, turns them into pointers with
`.to(tessera.pointer_type(dtype))`, and builds views on them as on any
pointer argument. Three more things make it fast and correct:

* the grid is padded to the largest group's tile count; programs past
  their group's last tile `return` at once (a return under a runtime
  condition);
* the sizes come from memory, so the compiler cannot see that rows are
  16-byte aligned: `tessera.multiple_of(K, 16)` says so, and the K loop is
  pipelined (without it, `tessera.pipeline` would warn at its line that it
  runs as a plain loop, and why -- try deleting a hint and compiling);
* on the CPU, `tessera.addresses(arrays)` gives the addresses of numpy
  arrays, and the interpreter follows them, bounds-checking every access
  against the array each address points into. On a GPU, pass CUDA tensors:
  `tessera.addresses(tensors)` is then an int64 tensor of their data pointers.

    python tutorials/07-dropout-and-grouped-gemm.py
"""

import numpy as np

import tessera


@tessera.kernel
def dropout(x_ptr, out_ptr, n, p, seed, BLOCK: tessera.constexpr):
    offsets = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    mask = offsets < n
    x = tessera.load(x_ptr + offsets, mask=mask)
    keep = tessera.rand(seed, offsets) > p           # the same numbers for the same (seed, offsets), anywhere
    tessera.store(out_ptr + offsets, tessera.where(keep, x / (1 - p), 0.0), mask=mask)


@tessera.kernel
def grouped_gemm(a_ptrs, b_ptrs, c_ptrs, sizes_ptr, BM: tessera.constexpr, BN: tessera.constexpr,
                 BK: tessera.constexpr):
    tile, g = tessera.program_id(0), tessera.program_id(1)
    M = tessera.load(sizes_ptr + 3 * g)
    N = tessera.multiple_of(tessera.load(sizes_ptr + 3 * g + 1), 16)
    K = tessera.multiple_of(tessera.load(sizes_ptr + 3 * g + 2), 16)
    tiles_n = tessera.cdiv(N, BN)
    if tile >= tessera.cdiv(M, BM) * tiles_n:        # a padding program: this group has fewer tiles
        return
    pid_m, pid_n = tile // tiles_n, tile % tiles_n
    f16 = tessera.pointer_type(tessera.f16)
    a = tessera.view(tessera.multiple_of(tessera.load(a_ptrs + g), 16).to(f16), (M, K))
    b = tessera.view(tessera.multiple_of(tessera.load(b_ptrs + g), 16).to(f16), (K, N))
    c = tessera.view(tessera.load(c_ptrs + g).to(tessera.pointer_type(tessera.f32)), (M, N))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=2):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    c.block((BM, BN), (pid_m, pid_n)).store(acc)


def reference_dropout(x: np.ndarray, p: float, seed: int) -> np.ndarray:
    """numpy's Philox4x32-10 for counter (offset, 0, 0, 0) and key (seed low, seed high): the kept lanes."""
    c0 = np.arange(x.size, dtype=np.uint64)
    c1 = c2 = c3 = np.zeros_like(c0)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    low = np.uint64(0xFFFFFFFF)
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & low, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & low
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & low, (k1 + np.uint64(0xBB67AE85)) & low
    word = c0.astype(np.uint32).view(np.int32)
    uniform = np.where(word < 0, ~word, word).astype(np.float32) * np.float32(4.6566127342e-10)
    return np.where(uniform > np.float32(p), x / np.float32(1 - p), np.float32(0)).astype(np.float32)


def main() -> None:
    rng = np.random.default_rng(0)

    n, p, seed = 10_000, 0.2, 1234
    x = rng.standard_normal(n, dtype=np.float32)
    out = np.zeros_like(x)
    dropout[(tessera.cdiv(n, 1024),)](x, out, n, p, seed, BLOCK=1024)
    np.testing.assert_array_equal(out, reference_dropout(x, p, seed))
    again = np.zeros_like(x)
    dropout[(tessera.cdiv(n, 1024),)](x, again, n, p, seed, BLOCK=1024)
    assert (again == out).all()                      # recomputed, not stored: the same mask
    print(f"dropout: kept {np.count_nonzero(out) / n:.1%} of {n} elements at p = {p} -- matches numpy")

    shapes = [(48, 32, 64), (16, 64, 32), (80, 16, 16)]          # (M, N, K) per group
    a = [rng.standard_normal((m, k)).astype(np.float16) for m, nn, k in shapes]
    b = [rng.standard_normal((k, nn)).astype(np.float16) for m, nn, k in shapes]
    c = [np.zeros((m, nn), np.float32) for m, nn, k in shapes]
    sizes = np.array(shapes, np.int32).reshape(-1)
    tiles = max(tessera.cdiv(m, 16) * tessera.cdiv(nn, 16) for m, nn, k in shapes)
    grouped_gemm[(tiles, len(shapes))](tessera.addresses(a), tessera.addresses(b), tessera.addresses(c), sizes,
                                       BM=16, BN=16, BK=16)
    for ai, bi, ci in zip(a, b, c):
        np.testing.assert_allclose(ci, ai.astype(np.float32) @ bi.astype(np.float32), rtol=1e-3, atol=1e-3)
    print(f"grouped GEMM: {len(shapes)} groups of different shapes, each in its own arrays -- matches numpy")


if __name__ == "__main__":
    main()
