"""A cluster-multicast TMA pipeline (`passes/schedule/multicast.py`) on the SIMT simulator: two blocks of a
cluster compute C tiles (2c, n) and (2c + 1, n), each loading its own A block and half of their shared B block,
multicast to both; the result is bit for bit the simulator's without the cluster and agrees with the tile
interpreter (which also checks the multicast promise) to the f16 result's rounding, and the lowered loop has
the protocol: the cluster barrier after the inits and after the loop, one share of B per block with the
cluster's mask, the empty-slot handshake before each refill. The same with a producer warpgroup, and the
language's cluster_rank / cluster_id."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.backends.interp import InterpreterError, run_function
from tessera.backends.simt import run_threads
from tessera.ir.target import get_target
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from pipeline_kernels import F16_RESULT, _exact, _host  # noqa: E402

SM_90A = get_target("sm_90a")


@tessera.kernel
def cluster_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                   BK: tessera.constexpr, STAGES: tessera.constexpr, CLUSTER: tessera.constexpr,
                   SKEW: tessera.constexpr = 0, WS: tessera.constexpr = False):
    tessera.cluster_dims(CLUSTER)
    pid = tessera.program_id(0)
    pid_m = pid % tessera.cdiv(M, BM)          # blocks 2c, 2c + 1 (one cluster): consecutive rows of tiles
    pid_n = pid // tessera.cdiv(M, BM) + SKEW * (pid % 2)      # SKEW: the promise broken
    a = tessera.view(a_ptr, (M, K), (K, 1))
    b = tessera.view(b_ptr, (K, N), (N, 1))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES, warp_specialize=WS):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(multicast=True),
                          acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


def case(M, N, K, BM, BN, BK, stages, cluster=2, skew=0, seed=0, ws=False):
    rng = np.random.default_rng(seed)
    a = _exact(rng.standard_normal((M, K)), tessera.f16)
    b = _exact(rng.standard_normal((K, N)), tessera.f16)
    make = lambda: [_host(a, tessera.f16), _host(b, tessera.f16), np.zeros((M, N), np.float16), M, N, K]  # noqa: E731
    module = cluster_matmul.specialize(*make(), BM=BM, BN=BN, BK=BK, STAGES=stages, CLUSTER=cluster,
                                       SKEW=skew, WS=ws).module
    grid = (tessera.cdiv(M, BM) * tessera.cdiv(N, BN),)
    return a, b, make, module, grid


@pytest.mark.parametrize("M, N, K, BM, BN, BK, stages, warps, target", [
    (128, 64, 128, 64, 64, 32, 3, 4, "sm_90a"),     # B 32 x 64: one box per slot, split by rows (16 each)
    (128, 128, 192, 64, 128, 64, 3, 4, "sm_90a"),   # B 64 x 128: two column boxes, one per block
    (128, 64, 64, 64, 64, 64, 2, 4, "sm_90a"),      # one K step: the prologue's fill only, the refill never runs
    (128, 64, 128, 64, 64, 32, 3, 4, "sm_90"),      # mma.sync: ldmatrix reads the slots (a proxy fence before
])                                                  # each release), one box per slot, split by rows
def test_multicast_pipeline_is_the_unclustered_kernel_bit_for_bit_and_agrees_with_the_interpreter(
        M, N, K, BM, BN, BK, stages, warps, target):
    target = get_target(target)
    a, b, make, module, grid = case(M, N, K, BM, BN, BK, stages)
    fn = lower(module, target, warps).functions[0]
    names = [op.name for op in fn.walk()]
    assert names.count("cluster_arrive") == 2 and names.count("cluster_wait") == 2
    multicast = [op for op in fn.walk() if op.name == "tma_load" and op.attrs.get("multicast")]
    assert multicast and all(op.attrs["multicast"] == 3 for op in multicast)
    assert names.count("mbarrier_arrive_cluster") == 2      # the refill arrives on both blocks' empty slot
    release = names.index("mbarrier_arrive_cluster")
    assert ("fence_proxy_async" in names[release - 4:release]) == (target.name == "sm_90")   # ldmatrix reads
    expected, actual, alone = make(), make(), make()
    run_function(module.functions[0], expected, grid)
    run_threads(fn, actual, grid)
    # the same kernel without a cluster (every block loads all of B) on the simulator: the same bits, since
    # the multicast changes where B's bytes come from, not the arithmetic; the interpreter adds the products
    # in another order than wgmma, so it agrees to the f16 result's rounding (as in test_simt_pipelined_wgmma)
    single = case(M, N, K, BM, BN, BK, stages, cluster=1)[3]
    run_threads(lower(single, target, warps).functions[0], alone, grid)
    np.testing.assert_array_equal(actual[2], alone[2])
    np.testing.assert_allclose(actual[2].astype(np.float32), expected[2].astype(np.float32), **F16_RESULT)
    np.testing.assert_allclose(expected[2].astype(np.float32), a @ b, rtol=2e-2, atol=2e-2)


def test_each_block_issues_half_of_b_and_all_of_a():
    # A's 64 x 64 slot is one box (64 f16 = one 128B swizzle row), B's 64 x 128 slot two column boxes: each fill
    # (two in the prologue, the refill) issues A's box and one of B's, the one at the block's cluster rank
    _, _, _, module, _ = case(128, 128, 192, 64, 128, 64, 3)
    fn = lower(module, SM_90A, 4).functions[0]
    loads = [op for op in fn.walk() if op.name == "tma_load"]
    shared = sum(bool(op.attrs.get("multicast")) for op in loads)
    assert shared == len(loads) - shared == 3
    assert len([op for op in fn.walk() if op.name == "cluster_rank"]) == 1


def test_the_interpreter_checks_the_multicast_promise():
    _, _, make, module, grid = case(128, 128, 64, 64, 64, 64, 2, skew=1)
    with pytest.raises(InterpreterError, match="every program of a cluster must load the same block"):
        run_function(module.functions[0], make(), grid)


def test_a_grid_of_partial_clusters_is_refused_by_the_interpreter():
    _, _, make, module, _ = case(64, 64, 64, 64, 64, 64, 2)
    with pytest.raises(InterpreterError, match=r"grid \(1, 1, 1\) is not a whole number of clusters"):
        run_function(module.functions[0], make(), (1,))


def test_without_a_cluster_the_multicast_hint_changes_nothing():
    _, _, _, module, _ = case(128, 64, 128, 64, 64, 32, 3, cluster=1)
    fn = lower(module, SM_90A, 4).functions[0]
    assert not any(op.name.startswith("cluster") or op.attrs.get("multicast") for op in fn.walk())


def test_refilling_without_the_empty_slot_handshake_is_reported(monkeypatch):
    # block 0 runs ahead and multicasts into block 1's slot before block 1 has waited for its previous fill
    from tessera.passes.schedule import multicast
    monkeypatch.setattr(multicast.ClusterMulticast, "release_slot", lambda self, *args: None)
    _, _, make, module, grid = case(128, 64, 256, 64, 64, 32, 3)
    with pytest.raises(InterpreterError, match="program \\(1, 0, 0\\), op 'tma_load': shared-memory race: access to "
                                               "shared memory before the mbarrier_wait"):
        run_threads(lower(module, SM_90A, 4).functions[0], make(), grid)


def test_multicasting_before_the_cluster_barrier_is_reported(monkeypatch):
    from tessera.passes.schedule import multicast
    monkeypatch.setattr(multicast.ClusterMulticast, "sync", staticmethod(lambda ctx: None))
    _, _, make, module, grid = case(128, 64, 128, 64, 64, 32, 3)
    with pytest.raises(InterpreterError, match="of block \\(1, 0, 0\\) \\(cluster rank 1\\), which was never "
                                               "initialized"):
        run_threads(lower(module, SM_90A, 4).functions[0], make(), grid)


@tessera.kernel
def where_am_i(out_ptr, CX: tessera.constexpr, CY: tessera.constexpr):
    tessera.cluster_dims((CX, CY))
    x, y = tessera.program_id(0), tessera.program_id(1)
    value = tessera.cluster_rank() + 100 * tessera.cluster_id(0) + 10000 * tessera.cluster_id(1)
    tessera.store(out_ptr + y * tessera.num_programs(0) + x, value)


def test_cluster_rank_and_id_agree_on_the_interpreter_the_simulator_and_in_the_ptx():
    expected = np.array([[(x % 2 + 2 * (y % 2)) + 100 * (x // 2) + 10000 * (y // 2) for x in range(4)]
                         for y in range(4)], np.int32)
    interpreted = np.zeros((4, 4), np.int32)
    where_am_i[(4, 4)](interpreted, CX=2, CY=2)
    np.testing.assert_array_equal(interpreted, expected)
    module = where_am_i.specialize(interpreted, CX=2, CY=2).module
    simulated = np.zeros((4, 4), np.int32)
    run_threads(lower(module, SM_90A, 4).functions[0], [simulated], (4, 4))
    np.testing.assert_array_equal(simulated, expected)
    ptx = where_am_i.compile(interpreted, CX=2, CY=2, target="sm_90a").stages["ptx"]
    assert "%cluster_ctarank" in ptx and "%clusterid.x" in ptx and "%clusterid.y" in ptx
    assert ".reqnctapercluster 2, 2, 1" in ptx


@pytest.mark.parametrize("target", ["sm_80", "gfx942"])
def test_without_clusters_cluster_rank_and_id_are_0_and_the_program_id_on_every_target(target):
    expected = np.array([[100 * x + 10000 * y for x in range(4)] for y in range(4)], np.int32)
    out = np.zeros((4, 4), np.int32)
    where_am_i[(4, 4)](out, CX=1, CY=1)
    np.testing.assert_array_equal(out, expected)
    module = where_am_i.specialize(out, CX=1, CY=1).module
    fn = lower(module, get_target(target), 4).functions[0]
    assert not any(op.name.startswith("cluster") for op in fn.walk())
    simulated = np.zeros((4, 4), np.int32)
    run_threads(fn, [simulated], (4, 4))
    np.testing.assert_array_equal(simulated, expected)
    where_am_i.compile(out, CX=1, CY=1, target=target)


@pytest.mark.parametrize("M, N, K, BM, BN, BK, stages, target", [
    (128, 64, 160, 64, 64, 32, 3, "sm_90a"),        # wgmma consumers: one release per warpgroup and block
    (128, 128, 192, 64, 128, 64, 2, "sm_90a"),      # B of two column boxes, one per producer; a 2-slot ring
    (128, 64, 128, 64, 64, 32, 3, "sm_90"),         # mma.sync consumers: every thread releases, on both blocks
])
def test_a_warp_specialized_multicast_loop_is_the_unclustered_kernel_bit_for_bit(M, N, K, BM, BN, BK, stages,
                                                                                  target):
    """CUTLASS's protocol: each block's producer issues its share multicast once its own empty barrier has every
    consumer release of both blocks; the producer and the consumers each take part in the final cluster barrier
    on their side of the warp-specialized `if`."""
    target = get_target(target)
    a, b, make, module, grid = case(M, N, K, BM, BN, BK, stages, ws=True)
    fn = lower(module, target, 4).functions[0]
    names = [op.name for op in fn.walk()]
    assert fn.attrs["num_threads"] == 4 * 32 + 128                                      # + the producer
    assert names.count("cluster_arrive") == 3 and names.count("cluster_wait") == 3     # inits; producer; consumers
    assert any(op.attrs.get("multicast") == 3 for op in fn.walk() if op.name == "tma_load")
    assert names.count("mbarrier_arrive_cluster") == 2 and "mbarrier_arrive" not in names
    actual, alone, expected = make(), make(), make()
    run_threads(fn, actual, grid)
    run_threads(lower(case(M, N, K, BM, BN, BK, stages, cluster=1, ws=True)[3], target, 4).functions[0], alone, grid)
    np.testing.assert_array_equal(actual[2], alone[2])
    run_function(module.functions[0], expected, grid)
    np.testing.assert_allclose(actual[2].astype(np.float32), expected[2].astype(np.float32), **F16_RESULT)


def test_a_warp_specialized_consumer_releasing_only_its_own_block_deadlocks(monkeypatch):
    """The peer's producer waits for this block's consumers too: releasing locally alone never completes its
    empty barrier (counting both blocks' releases), which the simulator reports rather than hangs."""
    from tessera.passes.schedule import multicast
    monkeypatch.setattr(multicast.ClusterMulticast, "release_remote",
                        lambda self, ctx, bar: ctx.create("mbarrier_arrive", [bar]))
    _, _, make, module, grid = case(128, 64, 192, 64, 64, 32, 2, ws=True)
    with pytest.raises(InterpreterError, match="DEADLOCK"):
        run_threads(lower(module, SM_90A, 4).functions[0], make(), grid)
