"""HEAD and LOOP blocks first read by one op share one full mbarrier (`tile_operands._shared_landing`).

Specification, on the row-block kernel of `test_tile_operands.py` with its first column block peeled (read
before the K loop only: a HEAD block, as attention's first K block; the row block is read in the K loop: a
LOOP block, as Q):

* when the peeled product reads both (`acc = a_block @ b_0`, attention's first S), the consumers wait once,
  before the K loop, on one full mbarrier that counts two arrivals (one per group's issue), and the kernel
  initializes one mbarrier less than when they do not share;
* when the first reader reads a HEAD block only (`a2_block @ b_0` before `a_block @ b_0`), the groups keep a
  full mbarrier each and the consumers wait twice before the K loop;
* both compute what numpy does in the SIMT simulator with fewer programs than tiles (its race and deadlock
  checks: a write over bytes in use, a read before the landing, an arrival past a phase's count).
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.backends.simt import run_threads
from tessera.passes.thread_passes import lower

from pipeline_kernels import _exact, _host
from test_tile_operands import roles, tma_loads

M, N, BM, BN, BK = 256, 192, 64, 64, 64          # 4 row blocks (tiles) of 3 column blocks (1 peeled + 2 loop)


@tessera.kernel
def peeled_row_times_columns(a_ptr, a2_ptr, b_ptr, c_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr,
                             BK: tessera.constexpr, HEAD_FIRST: tessera.constexpr):
    """c[m block] = a[m block] @ (sum of b's column blocks) [+ a2[m block] @ b's first column block]."""
    a = tessera.view(a_ptr, (M, BK))
    a2 = tessera.view(a2_ptr, (M, BK))
    b = tessera.view(b_ptr, (BK, N))
    c = tessera.view(c_ptr, (M, BN))
    for pid_m in range(tessera.program_id(0), tessera.cdiv(M, BM), tessera.num_programs(0)):
        a_block = a.block((BM, BK), (pid_m, 0)).load()
        b_first = b.block((BK, BN), (0, 0)).load()
        acc = tessera.zeros((BM, BN), dtype=tessera.f32)
        if HEAD_FIRST:
            acc = tessera.dot(a2.block((BM, BK), (pid_m, 0)).load(), b_first, acc)
        acc = tessera.dot(a_block, b_first, acc)
        for n in tessera.pipeline(1, tessera.cdiv(N, BN), stages=2, warp_specialize=True):
            acc = tessera.dot(a_block, b.block((BK, BN), (0, n)).load(), acc)
        c.block((BM, BN), (pid_m, 0)).store(acc.to(tessera.f16))


def lowered(head_first: bool):
    rng = np.random.default_rng(1)
    a, a2 = (_exact(rng.standard_normal((M, BK)), tessera.bf16) for _ in range(2))
    b = _exact(rng.standard_normal((BK, N)), tessera.bf16)
    args = [_host(a, tessera.bf16), _host(a2, tessera.bf16), _host(b, tessera.bf16), np.zeros((M, BN), np.float16),
            M, N]
    module = peeled_row_times_columns.specialize(*(tessera.reinterpret(x, tessera.bf16) for x in args[:3]),
                                                 *args[3:], BM=BM, BN=BN, BK=BK, HEAD_FIRST=head_first).module
    return lower(module, "sm_90a", 4).functions[0], args, a, a2, b


def waits_before_k_loop(consumers):
    """The mbarrier waits of the consumers' tile loop body before its K loop (nested `if`s entered)."""
    tiles = next(op for top in consumers.ops for op in top.walk() if op.name == "for")
    waits = []

    def walk(block) -> bool:
        for op in block.ops:
            if op.name == "for":
                return True
            if op.name == "mbarrier_wait":
                waits.append(op)
            if any(walk(region) for region in op.regions):
                return True
        return False
    walk(tiles.regions[0])
    return waits


def inits(fn):
    return [op for top in fn.body.ops for op in top.walk() if op.name == "mbarrier_init"]


@pytest.mark.parametrize("head_first", [False, True])
def test_one_landing_when_one_op_first_reads_head_and_loop_blocks(head_first):
    fn, args, a, a2, b = lowered(head_first)
    producer, consumers = roles(fn)
    assert not tma_loads(consumers)                        # every block is the producer's
    waits = waits_before_k_loop(consumers)
    # the ring's full and empty of 2 slots, HEAD's and LOOP's full and empty (one warpgroup: all count 1)
    # -- less one full, when they share one that counts two arrivals
    counts = [op.operands[1].owner.attrs["value"] for op in inits(fn)]
    assert sorted(counts) == ([1] * 8 if head_first else [1] * 6 + [2]), counts
    assert len(waits) == (2 if head_first else 1), waits
    run_threads(fn, args, (3,))                            # 4 tiles on 3 programs: one program runs two
    columns = b.astype(np.float64).reshape(BK, N // BN, BN).sum(axis=1)
    expected = a.astype(np.float64) @ columns + (a2.astype(np.float64) @ b[:, :BN] if head_first else 0)
    np.testing.assert_allclose(args[3].astype(np.float32), expected.astype(np.float16), rtol=2e-3, atol=5e-2)
