"""`schedule/tma_store.py` in a loop: a TMA store in a `for` body is not waited for until the next iteration
writes its staging buffer, so the store's read of shared memory overlaps the next iteration.

* a block store in a plain tile loop (any kernel, not only the library GEMM: here a persistent elementwise
  kernel whose blocks take the threads' st.shared): the staging buffer is allocated once, before the loop
  (`async_reads`, which prints and parses back), and never shares bytes with what the loop allocates; in the body thread 0 waits
  (`bulk_wait_group_read {pending = 0}`, then a barrier) before the writes, the store's `if` commits without
  waiting, and one more wait and barrier follow the loop; on the SIMT simulator the result is numpy's, the last
  tile ragged;
* a store outside any loop waits at once, in the store's `if`, followed by a barrier (as before);
* where the loop's staging buffers, each with bytes of its own, would not fit in shared memory (four 64 KiB
  stores in one loop body), the kernel is lowered again with every store waiting at once, and their buffers
  share bytes.
"""

from __future__ import annotations

import numpy as np

import tessera
from tessera.backends.simt import run_threads
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_function
from tessera.ir.target import get_target
from tessera.passes.thread_passes import lower


@tessera.kernel
def scale_tiles(x_ptr, out_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr, LOOP: tessera.constexpr):
    """out = 2 x, by BM x N row blocks: a persistent loop over them (LOOP) or one per program."""
    x = tessera.view(x_ptr, (M, N))
    out = tessera.view(out_ptr, (M, N))
    if LOOP:
        for tile in range(tessera.program_id(0), tessera.cdiv(M, BM), tessera.num_programs(0)):
            out.block((BM, BN), (tile, 0)).store(x.block((BM, BN), (tile, 0)).load() * 2.0)
    else:
        tile = tessera.program_id(0)
        out.block((BM, BN), (tile, 0)).store(x.block((BM, BN), (tile, 0)).load() * 2.0)


@tessera.kernel
def scale_four_column_blocks(x_ptr, out_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    """out = 2 x by row blocks in a persistent loop, each row block as four BN-wide stores."""
    x = tessera.view(x_ptr, (M, N))
    out = tessera.view(out_ptr, (M, N))
    for tile in range(tessera.program_id(0), tessera.cdiv(M, BM), tessera.num_programs(0)):
        out.block((BM, BN), (tile, 0)).store(x.block((BM, BN), (tile, 0)).load() * 2.0)
        out.block((BM, BN), (tile, 1)).store(x.block((BM, BN), (tile, 1)).load() * 2.0)
        out.block((BM, BN), (tile, 2)).store(x.block((BM, BN), (tile, 2)).load() * 2.0)
        out.block((BM, BN), (tile, 3)).store(x.block((BM, BN), (tile, 3)).load() * 2.0)


def _args(M, N):
    x = np.random.default_rng(0).standard_normal((M, N)).astype(np.float32)
    return [x, np.full((M, N), np.nan, np.float32), M, N]


def _names(ops) -> list[str]:
    return [op.name for op in ops]


def _wait_if(op) -> bool:
    return op.name == "if" and _names(op.regions[0].ops) == ["bulk_wait_group_read", "yield"]


def test_a_store_in_a_tile_loop_waits_for_its_read_only_before_the_next_iterations_writes():
    M, N = 300, 64                                   # 5 row blocks of 64, the last one 44 rows
    args = _args(M, N)
    fn = lower(scale_tiles.specialize(*args, BM=64, BN=64, LOOP=True).module, "sm_90a", 4).functions[0]
    staging = [op for op in fn.walk() if op.name == "shared_alloc"]
    assert len(staging) == 1 and staging[0].attrs.get("async_reads") and staging[0].parent is fn.body
    top = fn.body.ops
    loop = next(op for op in top if op.name == "for")
    assert top.index(staging[0]) < top.index(loop)
    body = loop.regions[0].ops
    wait = next(i for i, op in enumerate(body) if _wait_if(op))
    write = next(i for i, op in enumerate(body) if op.name == "store")
    issue = next(i for i, op in enumerate(body) if any(o.name == "tma_store" for o in op.walk()))
    assert wait < write < issue and body[wait + 1].name == "barrier"
    assert _names(body[issue].regions[0].ops) == ["tma_store", "bulk_commit_group", "yield"]
    assert body[issue + 1:] == [body[-1]]            # nothing after the store in the body but the yield
    after = top[top.index(loop) + 1:]
    assert _wait_if(after[0]) and after[1].name == "barrier"
    text = print_function(fn)                        # `async_reads` prints and parses back
    assert "async_reads = true" in text and print_function(parse_module(text).functions[0]) == text
    run_threads(fn, args, (2,))                      # 3 and 2 row blocks a program
    np.testing.assert_array_equal(args[1], args[0] * 2)


def test_a_store_outside_any_loop_waits_at_once():
    M, N = 300, 64
    args = _args(M, N)
    fn = lower(scale_tiles.specialize(*args, BM=64, BN=64, LOOP=False).module, "sm_90a", 4).functions[0]
    assert not any(op.attrs.get("async_reads") for op in fn.walk() if op.name == "shared_alloc")
    top = fn.body.ops
    issue = next(i for i, op in enumerate(top) if any(o.name == "tma_store" for o in op.walk()))
    assert _names(top[issue].regions[0].ops) == ["tma_store", "bulk_commit_group", "bulk_wait_group_read", "yield"]
    assert top[issue + 1].name == "barrier"
    run_threads(fn, args, (5,))
    np.testing.assert_array_equal(args[1], args[0] * 2)


def test_staging_buffers_that_do_not_fit_side_by_side_wait_at_once_and_share_bytes():
    M, N, BM, BN = 96, 1024, 64, 256                 # four 64 KiB staging buffers: 256 KiB with bytes of their own
    args = _args(M, N)
    module = scale_four_column_blocks.specialize(*args, BM=BM, BN=BN).module
    fn = lower(module, "sm_90a", 8).functions[0]
    allocs = [op for op in fn.walk() if op.name == "shared_alloc"]
    assert len(allocs) == 4 and not any(op.attrs.get("async_reads") for op in allocs)
    assert 4 * BM * BN * 4 > get_target("sm_90a").shared_memory_bytes >= fn.attrs["shared_bytes"]
    assert fn.attrs["shared_bytes"] == BM * BN * 4                  # one buffer's bytes, reused by each store
    issues = [op for op in fn.walk() if op.name == "if" and any(o.name == "tma_store" for o in op.regions[0].ops)]
    assert len(issues) == 4 and all(_names(op.regions[0].ops)[-2] == "bulk_wait_group_read" for op in issues)
    run_threads(fn, args, (1,))
    np.testing.assert_array_equal(args[1], args[0] * 2)
