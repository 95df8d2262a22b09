"""The TMA load of a wgmma operand (`schedule/tma_operand.py`) in a kernel with ordered memory operations.

Specification:

* ordered ops (acquire loads, release stores, atomics) that are all `scope="cta"` synchronize only threads of
  one block, so they let no other program hand the kernel data: the block load before the loop still goes
  into wgmma's tile by TMA, thread 0 issuing `fence.proxy.async.global` first (what the block's own threads
  wrote through the generic proxy reaches the async proxy), and the SIMT simulator computes what the tile
  interpreter does; in a persistent warp-specialized tile loop that load stays the consumers', fenced in its
  place each tile, rather than the producer's a tile ahead (`tile_operands.py`);
* one ordered op at a wider scope (the default "gpu", "cluster") may order another program's writes before
  the load, which a TMA read issued at the load need not see: the threads load the block instead (no TMA load,
  no fence), and the kernel's lowering notes name the kernel, the load's line, the ordered op's line and scope,
  and the fix (scope="cta" where that is what it means).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tessera
from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.passes.thread_passes import lower


@tessera.kernel
def scores_and_tickets(q_ptr, k_ptr, s_ptr, count_ptr, ticket_ptr, M: tessera.constexpr, N: tessera.constexpr,
                       D: tessera.constexpr, STEPS: tessera.constexpr, SCOPE: tessera.constexpr):
    """s[:, j] = q @ k_j^T for each of STEPS key blocks; each program also draws a ticket from its own counter."""
    q = tessera.view(q_ptr, (M, D)).block((M, D), (0, 0)).load()
    kT = tessera.view(k_ptr, (D, N * STEPS), (1, D))
    s = tessera.view(s_ptr, (M, N * STEPS))
    for j in range(STEPS):
        s.block((M, N), (0, j)).store(tessera.dot(q, kT.block((D, N), (0, j)).load()))
    pid = tessera.program_id(0)
    tessera.store(ticket_ptr + pid, tessera.atomic_add(count_ptr + pid, 1, scope=SCOPE))


M, N, D, STEPS = 64, 32, 32, 2


def args(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((M, D)).astype(np.float16), rng.standard_normal((N * STEPS, D)).astype(np.float16),
            np.zeros((M, N * STEPS), np.float32), np.full(2, 5, np.int32), np.zeros(2, np.int32)]


def lowered(scope):
    module = scores_and_tickets.specialize(*args(), M=M, N=N, D=D, STEPS=STEPS, SCOPE=scope).module
    return module.functions[0], lower(module, "sm_90a", num_warps=4).functions[0]


def before_loop(fn) -> list[str]:
    loop = next(op for op in fn.walk() if op.name == "for")
    return [o.name for op in fn.body.ops[:fn.body.ops.index(loop)] for o in op.walk()]


def tma_issues(ops: list[str]) -> list[list[str]]:
    """The ops just before each TMA load (address arithmetic left out): its fence and expect-tx."""
    named = [name for name in ops if name not in ("addptr", "constant")]
    return [named[i - 2:i] for i, name in enumerate(named) if name == "tma_load"]


def test_block_scoped_ordered_ops_keep_the_tma_load_behind_a_global_proxy_fence():
    tile_fn, fn = lowered("cta")
    ops, threads_load = before_loop(fn), before_loop(lowered("gpu")[1])
    # q straight into wgmma's tile: one TMA load more than the ring's prologue fills, and no thread stores it
    assert ops.count("tma_load") == threads_load.count("tma_load") + 1 and "store" not in ops
    assert tma_issues(ops) == [["fence_proxy_async_global", "mbarrier_arrive_expect_tx"]] * ops.count("tma_load")
    assert not any("not by TMA" in note for note in fn.attrs.get("lowering_notes", ()))
    expected, actual = args(), args()
    run_function(tile_fn, expected, (2,))
    run_threads(fn, actual, (2,))
    np.testing.assert_allclose(actual[2], expected[2], rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(actual[4], [5, 5])
    np.testing.assert_array_equal(actual[3], expected[3])


def test_the_fence_reaches_the_ptx():
    ptx = scores_and_tickets.compile(signature="*f16:16,*f16:16,*f32:16,*i32:16,*i32:16", target="sm_90a",
                                     M=M, N=N, D=D, STEPS=STEPS, SCOPE="cta").stages["ptx"]
    assert "fence.proxy.async.global" in ptx and "cp.async.bulk.tensor.2d" in ptx
    assert re.search(r"atom\.\w+\.cta\.global\.add", ptx)         # the ticket stays block-scoped


@pytest.mark.gpu
def test_block_scoped_tickets_beside_the_tma_operand_on_the_gpu():
    """What the next GPU session shows (sm_90): the fenced TMA load of q computes q @ k^T, the tickets count."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU (TMA)")
    q, k, s, count, ticket = (torch.from_numpy(x).cuda() for x in args())
    scores_and_tickets[(2,)](q, k, s, count, ticket, M=M, N=N, D=D, STEPS=STEPS, SCOPE="cta")
    torch.testing.assert_close(s, q.float() @ k.float().T, rtol=2e-3, atol=2e-3)
    assert count.tolist() == [6, 6] and ticket.tolist() == [5, 5]


@pytest.mark.parametrize("scope", ["gpu", "cluster"], ids=["scope-gpu", "scope-cluster"])   # ("gpu" alone: the marker)
def test_a_wider_scope_keeps_the_block_load_on_the_threads_and_says_why(scope):
    _, fn = lowered(scope)
    ops = before_loop(fn)
    assert "load" in ops and "store" in ops         # q through the threads' registers into wgmma's tile
    assert ops.count("tma_load") == before_loop(lowered("cta")[1]).count("tma_load") - 1     # the ring's only
    (note,) = [n for n in fn.attrs["lowering_notes"] if "not by TMA" in n]
    load_line = scores_and_tickets.fn.__code__.co_firstlineno + 4
    assert "kernel 'scores_and_tickets'" in note and f":{load_line}" in note
    assert f"atomic_rmw at line {load_line + 6}" in note and f'scope "{scope}"' in note
    assert 'give them scope="cta"' in note


@tessera.kernel
def rows_and_tickets(a_ptr, b_ptr, c_ptr, count_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr,
                     BK: tessera.constexpr, SCOPE: tessera.constexpr):
    """A persistent warp-specialized loop: c[m block] = a[m block] @ (sum of b's column blocks), and a ticket
    drawn from the program's counter per tile."""
    a = tessera.view(a_ptr, (M, BK))
    b = tessera.view(b_ptr, (BK, N))
    c = tessera.view(c_ptr, (M, BN))
    for pid_m in range(tessera.program_id(0), tessera.cdiv(M, BM), tessera.num_programs(0)):
        a_block = a.block((BM, BK), (pid_m, 0)).load()
        acc = tessera.zeros((BM, BN), dtype=tessera.f32)
        for n in tessera.pipeline(0, tessera.cdiv(N, BN), stages=2, warp_specialize=True):
            acc = tessera.dot(a_block, b.block((BK, BN), (0, n)).load(), acc)
        c.block((BM, BN), (pid_m, 0)).store(acc.to(tessera.f16))
        tessera.atomic_add(count_ptr + tessera.program_id(0), 1, scope=SCOPE)


def test_in_a_persistent_warp_specialized_loop_the_fenced_load_stays_with_the_consumers():
    """The producer would issue the row block a tile ahead (`tile_operands.py`), ahead of the previous tile's
    accesses that the fence orders before it: with block-scoped ordered ops the consumers issue it in its
    place, fenced, each tile; the SIMT simulator computes what the tile interpreter does."""
    rng = np.random.default_rng(1)
    Mr, Nr, BM, BN, BK = 256, 192, 64, 64, 64
    host = [rng.standard_normal((Mr, BK)).astype(np.float16), rng.standard_normal((BK, Nr)).astype(np.float16),
            np.zeros((Mr, BN), np.float16), np.zeros(3, np.int32), Mr, Nr]
    module = rows_and_tickets.specialize(*host, BM=BM, BN=BN, BK=BK, SCOPE="cta").module
    fn = lower(module, "sm_90a", 4).functions[0]
    split = next(op for op in fn.body.ops if op.name == "if" and "producer_joins_at" in op.attrs)
    producer, consumers = ([o.name for op in region.ops for o in op.walk()] for region in split.regions)
    assert producer.count("tma_load") == 1                      # b's ring only
    assert consumers.count("tma_load") == 1 and tma_issues(consumers) == [
        ["fence_proxy_async_global", "mbarrier_arrive_expect_tx"]]
    expected, actual = [list(host) for _ in range(2)]
    expected[2], actual[2] = np.zeros_like(host[2]), np.zeros_like(host[2])
    expected[3], actual[3] = np.zeros_like(host[3]), np.zeros_like(host[3])
    run_function(module.functions[0], expected, (3,))
    run_threads(fn, actual, (3,))                               # 4 tiles on 3 programs: one program runs two
    np.testing.assert_allclose(actual[2].astype(np.float32), expected[2].astype(np.float32), rtol=2e-3, atol=5e-2)
    np.testing.assert_array_equal(actual[3], [2, 1, 1])
