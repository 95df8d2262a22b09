"""Tile-invariant TMA operands of a persistent warp-specialized loop come from the producer (`tile_operands.py`).

Specification, on a kernel that is not attention (A's row block, read by every iteration of the K loop, times
every column block of B, summed):

* sm_90a: the row block's TMA load is issued in the producer branch, inside its tile loop and outside its K
  loop, after the tile's first column block (FlashAttention-3's order: the first K block before the wait for
  Q's release); the consumers' branch issues no TMA load; the SIMT simulator with fewer programs than tiles
  computes what numpy does;
* a row block also read after the K loop stays the consumers' load (released with the tile's end, it would
  hold the next tile's fills behind this tile's epilogue); the column block read only there is the
  producer's, issued after the tile's fills.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.backends.simt import run_threads
from tessera.passes.thread_passes import lower

from pipeline_kernels import _exact, _host

M, N, BM, BN, BK = 256, 192, 64, 64, 64          # 4 row blocks (tiles) of 3 column blocks (K iterations)


@tessera.kernel
def row_times_columns(a_ptr, b_ptr, c_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr,
                      BK: tessera.constexpr, AFTER: tessera.constexpr):
    """c[m block] = a[m block] @ (sum of b's column blocks) [+ a[m block] @ b's first column block, AFTER]."""
    a = tessera.view(a_ptr, (M, BK))
    b = tessera.view(b_ptr, (BK, N))
    c = tessera.view(c_ptr, (M, BN))
    for pid_m in range(tessera.program_id(0), tessera.cdiv(M, BM), tessera.num_programs(0)):
        a_block = a.block((BM, BK), (pid_m, 0)).load()
        acc = tessera.zeros((BM, BN), dtype=tessera.f32)
        for n in tessera.pipeline(0, tessera.cdiv(N, BN), stages=2, warp_specialize=True):
            acc = tessera.dot(a_block, b.block((BK, BN), (0, n)).load(), acc)
        if AFTER:
            acc = tessera.dot(a_block, b.block((BK, BN), (0, 0)).load(), acc)
        c.block((BM, BN), (pid_m, 0)).store(acc.to(tessera.f16))


def lowered(after: bool):
    rng = np.random.default_rng(0)
    a, b = _exact(rng.standard_normal((M, BK)), tessera.bf16), _exact(rng.standard_normal((BK, N)), tessera.bf16)
    args = [_host(a, tessera.bf16), _host(b, tessera.bf16), np.zeros((M, BN), np.float16), M, N]
    module = row_times_columns.specialize(tessera.reinterpret(args[0], tessera.bf16),
                                          tessera.reinterpret(args[1], tessera.bf16), *args[2:], BM=BM, BN=BN,
                                          BK=BK, AFTER=after).module
    return lower(module, "sm_90a", 4).functions[0], args, a, b


def tma_loads(block, loops=0):
    """(name of each TMA load's map, loops around it within `block`)."""
    found = []
    for op in block.ops:
        if op.name == "tma_load":
            found.append((map_name(op), loops))
        for region in op.regions:
            found += tma_loads(region, loops + (op.name == "for"))
    return found


def map_name(op):
    return op.operands[1].name_hint.split("_ptr")[0]


def roles(fn):
    split = next(op for op in fn.body.ops if op.name == "if" and "producer_joins_at" in op.attrs)
    return split.regions


def tile_loop_events(producer):
    """The producer's tile loop body in program order, nested `if`s entered, the K loop as one event: a TMA
    load's map name, 'wait' for an mbarrier wait, 'K loop'."""
    tiles = next(op for top in producer.ops for op in top.walk() if op.name == "for")
    events = []

    def walk(block):
        for op in block.ops:
            if op.name == "for":
                events.append("K loop")
            elif op.name == "tma_load":
                events.append(map_name(op))
            elif op.name == "mbarrier_wait":
                events.append("wait")
            for region in ([] if op.name == "for" else op.regions):
                walk(region)
    walk(tiles.regions[0])
    return events


@pytest.mark.parametrize("after", [False, True])
def test_the_row_block_is_loaded_by_the_producer_unless_read_after_the_loop(after):
    fn, args, a, b = lowered(after)
    producer, consumers = roles(fn)
    expected = {("b", 2), ("b", 1)} | (set() if after else {("a", 1)})
    assert set(tma_loads(producer)) == expected
    assert set(tma_loads(consumers)) == ({("a", 1)} if after else set())
    events = tile_loop_events(producer)
    if after:       # no block read in the K loop: the fills are not split; b's block after the loop comes last
        assert events == ["K loop", "wait", "b"], events
    else:           # the first fill (its slot's wait, b), then a behind a's release (from the second tile on)
        assert events == ["wait", "b", "wait", "a", "K loop"], events
    run_threads(fn, args, (3,))                 # 4 tiles on 3 programs: one program runs two
    columns = b.astype(np.float64).reshape(BK, N // BN, BN).sum(axis=1) + (b[:, :BN] if after else 0)
    np.testing.assert_allclose(args[2].astype(np.float32), (a.astype(np.float64) @ columns).astype(np.float16),
                               rtol=2e-3, atol=5e-2)
