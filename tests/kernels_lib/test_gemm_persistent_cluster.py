"""The persistent library GEMM in thread-block clusters of 2 with TMA multicast (issue 19: PERSISTENT with CLUSTER_M
or CLUSTER_N = 2, WS=False and WS=True).

Specification:

* the grid is a whole number of clusters, at most one program per SM (and per tile); cluster c walks the
  cluster-tiles c, c + num_clusters, ..., each program its member tile (`cluster_tile`'s numbering), so the two
  programs of a cluster run the same number of tiles, a member tile past C loading zeros and storing nothing;
* on the SIMT simulator the clustered persistent kernel (also warp-specialized: the producer warpgroup walks the
  cluster-tiles, multicasting its share, the consumers release on both programs' empty barriers) computes what
  the unclustered persistent kernel computes, bit for bit, and what numpy does, with several cluster-tiles per
  cluster whose second member is partly or wholly past M or N, K loops shorter than the prefetch distance
  included, one or two clusters;
* the simulator catches the lockstep broken: a program of the cluster skipping its last cluster-tile (with a
  producer warpgroup too), or a tile's first fills not releasing their slots on the (cluster-wide) empty
  barriers; the early program then waits at the one cluster barrier after the tile loop, and without that
  barrier (the mutation) its peer arrives on an ended block's mbarrier, which the simulator names;
* for sm_90a the shipped cluster configs made persistent assemble without spills, with every mbarrier
  initialized once before the tile loop (full: 1 arrival, empty: 2), the cluster barrier after the inits and
  once after the tile loop (in no PTX loop, nor in the SASS tile loop), and the empty-slot handshake (mapa +
  remote arrive on both programs) before the loop's refills and the next tile's fills, which are multicast; the
  K loop's SASS is the one-tile cluster kernel's within 4 instructions; warp-specialized: the empty barriers
  count both programs' consumer warpgroups, the cluster barrier runs after the inits and once on each side of the role split;
* on the tile interpreter the kernel agrees with torch (which checks the multicast promise, too);
* one such config is shipped (persistent, warp-specialized, 128 x 256, CLUSTER_M = 2), for the timed autotuner
  only (`gemm_configs.awaits_measurement`), recorded by bench/gemm.py --part configs right after its twins; on a
  GPU (the next session) it computes torch.matmul's product.
"""

from __future__ import annotations

import importlib
import re

import numpy as np
import pytest

import tessera
from tessera.backends.interp import InterpreterError
from tessera.kernels_lib import gemm_configs
from tessera.kernels_lib.gemm import HOPPER_CONFIGS, cluster_tile, gemm_kernel, gemm_tile

from tessera.backends.nvptx.sass import disassemble, loop_containing

from hopper_gemm import (compile_gemm, lowered_gemm, needs_ptxas, needs_sass, ptx_lines, sass_k_loop,
                         simulate)

torch = pytest.importorskip("torch")
gemm_module = importlib.import_module("tessera.kernels_lib.gemm")
pipeline_module = importlib.import_module("tessera.passes.schedule.software_pipeline")
tma_fill_module = importlib.import_module("tessera.passes.schedule.tma_fill")

# the shipped one-tile-per-program cluster configs (test_gemm_cluster.py), made persistent here
CLUSTERED = {f"{c.kwargs['BM']}x{c.kwargs['BN']}-{'m' if c.kwargs.get('CLUSTER_M', 1) > 1 else 'n'}2": c
             for c in HOPPER_CONFIGS if gemm_configs.is_clustered(c) and not c.kwargs["PERSISTENT"]}
# the shipped persistent one: 128 x 256, warp-specialized, CLUSTER_M = 2
SHIPPED = next(c for c in HOPPER_CONFIGS if gemm_configs.is_clustered(c) and c.kwargs["PERSISTENT"])


def persistent(config, **changes):
    """`config` made persistent, with BK = 32 (cheaper to simulate)."""
    return tessera.Config({**config.kwargs, "BK": 32, "PERSISTENT": True, **changes}, num_warps=config.num_warps)


WS = pytest.mark.parametrize("ws", [False, True], ids=["pipelined", "warp-specialized"])


def lowered(M, N, K, config, num_sms):
    fn, args, expected, _ = lowered_gemm(M, N, K, config)
    return fn, args, expected, gemm_module._grid(M, N, config.kwargs, num_sms)


@pytest.mark.parametrize("M, N, num_sms, grid", [(300, 256, 132, 8), (300, 256, 7, 6), (300, 256, 1, 2),
                                                 (100, 100, 132, 2)])
def test_the_persistent_cluster_grid_is_whole_clusters_at_most_one_per_sm_and_tile(M, N, num_sms, grid):
    kwargs = {**CLUSTERED["128x128-m2"].kwargs, "PERSISTENT": True}
    assert gemm_module._grid(M, N, kwargs, num_sms) == (grid,)


@pytest.mark.parametrize("name, M, N, K, num_sms", [
    ("128x128-m2", 300, 256, 160, 2),   # 3 row tiles -> 2 x 2 cluster-tiles, one cluster: its 2nd program's
                                        # tiles of the second row pair lie wholly past M; 5 K steps per tile
    ("128x128-m2", 300, 256, 32, 4),    # two clusters; one K step per tile (fewer than the prefetch distance)
    ("128x256-m2", 256, 320, 96, 2),    # B's four boxes, two per program; the second column tile partial
    ("256x128-n2", 200, 384, 64, 2),    # A's box split by rows; 3 column tiles: the 2nd cluster-tile's 2nd
                                        # program past N
])
@WS
def test_a_persistent_cluster_matches_the_unclustered_persistent_kernel_on_the_simt_simulator(name, M, N, K,
                                                                                            num_sms, ws):
    config = persistent(CLUSTERED[name], WS=ws)
    fn, args, expected, grid = lowered(M, N, K, config, num_sms)
    assert fn.attrs["cluster_dims"] == (2, 1, 1) and grid[0] == num_sms
    assert any(op.attrs.get("multicast") for op in fn.walk() if op.name == "tma_load")
    alone, alone_args, _, alone_grid = lowered(M, N, K, persistent(CLUSTERED[name], WS=ws, CLUSTER_M=1,
                                                                   CLUSTER_N=1), num_sms)
    np.testing.assert_array_equal(simulate(fn, args, grid), simulate(alone, alone_args, alone_grid))
    np.testing.assert_allclose(args[5], expected, rtol=1e-4, atol=1e-3)


def test_the_simulator_catches_a_tiles_first_fills_not_releasing_their_slots(monkeypatch):
    """Without the empty-slot handshake on a tile's first fills (`software_pipeline._prologue_release`), the
    empty barriers' phases drift from the loop's: the programs fall out of lockstep."""
    def never(ctx, start, stage, plan):
        return ctx.const(0), ctx.emit("cmp", ctx.const(0), ctx.const(1), attrs={"pred": "eq"})

    monkeypatch.setattr(pipeline_module, "_prologue_release", never)
    fn, args, expected, grid = lowered(300, 256, 160, persistent(CLUSTERED["128x128-m2"]), 2)
    with pytest.raises(InterpreterError):
        simulate(fn, args, grid)


@tessera.kernel
def persistent_cluster_gemm(a_ptr, b_ptr, c_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                            BK: tessera.constexpr, STAGES: tessera.constexpr, SKIP_LAST: tessera.constexpr,
                            WS: tessera.constexpr = False):
    """The library's persistent CLUSTER_M = 2 tile loop; SKIP_LAST: the cluster's second program stops one
    cluster-tile early (the mutation the simulator must catch)."""
    tessera.cluster_dims(2)
    a = tessera.view(a_ptr, (M, K), (K, 1))
    b = tessera.view(b_ptr, (K, N), (N, 1))
    c = tessera.view(c_ptr, (M, N))
    num_pid_m, num_pid_n = tessera.cdiv(M, BM), tessera.cdiv(N, BN)
    last = tessera.cdiv(num_pid_m, 2) * num_pid_n - SKIP_LAST * (tessera.program_id(0) % 2)
    for ct in range(tessera.program_id(0) // 2, last, tessera.num_programs(0) // 2):
        pid_m, pid_n = cluster_tile(ct * 2 + tessera.program_id(0) % 2, num_pid_m, num_pid_n, 2, 2, 1)
        gemm_tile(pid_m, pid_n, a, b, c, c_ptr, c_ptr, c_ptr, M, N, K, 1.0, False, "none", "none", "none",
                  BM, BN, BK, STAGES, WS, 2, 1)


@WS
@pytest.mark.parametrize("skip", [0, 1])
def test_the_simulator_catches_a_program_of_the_cluster_skipping_its_last_tile(skip, ws):
    from tessera.backends.simt import run_threads
    from tessera.passes.thread_passes import lower
    M, N, K = 192, 128, 128
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((M, K)).astype(np.float16), rng.standard_normal((K, N)).astype(np.float16)
    args = [a, b, np.zeros((M, N), np.float32), M, N, K]
    module = persistent_cluster_gemm.specialize(*args, BM=64, BN=64, BK=32, STAGES=3, SKIP_LAST=skip, WS=ws).module
    fn = lower(module, "sm_90a", 4).functions[0]
    assert any(op.attrs.get("multicast") for op in fn.walk() if op.name == "tma_load")
    if skip:        # the first program's last tile waits for its peer's fills and releases forever
        with pytest.raises(InterpreterError):
            run_threads(fn, args, (2,))
    else:           # 2 x 2 cluster-tiles on one cluster, the second row pair's second program past M
        run_threads(fn, args, (2,))
        np.testing.assert_allclose(args[2], a.astype(np.float32) @ b.astype(np.float32), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("final_barrier", [True, False], ids=["final-barrier", "no-final-barrier"])
def test_the_cluster_barrier_after_the_tile_loop_keeps_a_program_from_ending_under_its_peer(final_barrier,
                                                                                           monkeypatch):
    """The one cluster barrier after the tile loop (`TmaRing.release`): when a program leaves the tile loop
    early (SKIP_LAST), it waits there, and the simulator reports the deadlock with it at cluster_wait; removed
    too (the mutation), that program ends, and its peer's next empty-slot release arrives on an mbarrier of an
    ended block, which the simulator names. (In lockstep every peer write into a block and every arrival on its
    barriers precede one of its own waits, so the barrier only matters once the programs part.)"""
    from tessera.backends.simt import run_threads
    from tessera.passes.thread_passes import lower
    if not final_barrier:
        release = tma_fill_module.TmaRing.release

        def without_final_barrier(ring, ctx):
            cluster = ring.cluster
            ring.cluster = None if ring.tile_loop is not None else cluster
            try:
                release(ring, ctx)
            finally:
                ring.cluster = cluster
        monkeypatch.setattr(tma_fill_module.TmaRing, "release", without_final_barrier)
    M, N, K = 192, 128, 128
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((M, K)).astype(np.float16), rng.standard_normal((K, N)).astype(np.float16)
    args = [a, b, np.zeros((M, N), np.float32), M, N, K]
    module = persistent_cluster_gemm.specialize(*args, BM=64, BN=64, BK=32, STAGES=3, SKIP_LAST=1).module
    fn = lower(module, "sm_90a", 4).functions[0]
    assert sum(op.name == "cluster_wait" for op in fn.walk()) == (2 if final_barrier else 1)
    expected = r"DEADLOCK(.|\n)*cluster rank 1\): cluster_wait" if final_barrier else \
        r"mbarrier_arrive_cluster arrives on an mbarrier of block \(1, 0, 0\).*which has already ended"
    with pytest.raises(InterpreterError, match=expected):
        run_threads(fn, args, (2,))


@pytest.mark.parametrize("name", list(CLUSTERED))
def test_persistent_cluster_configs_set_the_barriers_up_once_and_multicast_without_spills(name):
    needs_ptxas()
    config = CLUSTERED[name]
    compiled = compile_gemm(config, PERSISTENT=True)
    ptx, meta = compiled.stages["ptx"], compiled.metadata
    assert meta["cluster_dims"] == [2, 1, 1] and re.search(r"\.explicitcluster\s+\.reqnctapercluster 2, 1, 1", ptx)
    assert meta["spill_stores"] == meta["spill_loads"] == 0 and meta["registers"] <= 255
    stages = config.kwargs["STAGES"]
    consts = dict(re.findall(r"mov\.b32\s+(%r\d+),\s*(\d+);", ptx))
    inits = re.findall(r"mbarrier\.init\.shared\.b64\s+\[[^\]]+\],\s*(%r\d+|\d+);", ptx)
    assert sorted(int(consts.get(c, c)) for c in inits) == [1] * stages + [2] * stages
    # inits, then the cluster barrier, all before the first wait (the tile loop's K loop); then once more after the
    # tile loop (no PTX loop holds either), after every fill, wait and remote arrival: none per tile
    arrive, wait = ptx_lines(ptx, r"barrier\.cluster\.arrive\.aligned"), ptx_lines(ptx, r"barrier\.cluster\.wait")
    waits = ptx_lines(ptx, r"mbarrier\.try_wait")
    init_lines = ptx_lines(ptx, r"mbarrier\.init\.shared")
    assert len(arrive) == len(wait) == 2 and max(init_lines) < arrive[0] < wait[0] < waits[0]
    loops = ptx_loops(ptx)
    assert loops and not any(first <= line <= back for first, back in loops for line in arrive + wait)
    assert max(back for _, back in loops) < arrive[1] < wait[1]
    assert not ptx_lines(ptx, r"mbarrier\.inval")
    # the handshake (2 remote arrivals) before the loop's refill and before each of the next tile's S - 1 fills;
    # all of those fills and the first tile's are multicast
    remote = ptx_lines(ptx, r"mbarrier\.arrive\.shared::cluster\.b64 _")
    assert len(remote) == 2 * stages and len(ptx_lines(ptx, r"mapa\.shared::cluster")) == 2 * stages
    multicast = ptx_lines(ptx, r"cp\.async\.bulk\.tensor\.2d.*\.multicast::cluster")
    assert len(multicast) > stages and min(multicast) < waits[0]
    assert max(remote + multicast + waits) < arrive[1]


def ptx_loops(ptx: str) -> list[tuple[int, int]]:
    """(label line, branch line) of each backward branch in `ptx`: the loops' line ranges."""
    lines = ptx.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*(\$L\w+):", line))}
    return [(labels[m.group(1)], i) for i, line in enumerate(lines)
            if (m := re.search(r"\bbra(?:\.uni)?\s+(\$L\w+);", line)) and labels.get(m.group(1), i + 1) < i]


@pytest.mark.parametrize("name", list(CLUSTERED))
def test_the_persistent_cluster_k_loop_is_the_one_tile_cluster_loop(name):
    """In the SASS the persistent kernel's K loop is its one-tile-per-program twin's within 4 instructions (ptxas
    13.0: 110 vs 108, 90 vs 90, 114 vs 115): the multicast refill and its handshake, the slot arithmetic on the
    uniform datapath (no R2UR)."""
    needs_sass()
    config = CLUSTERED[name]
    compiled = compile_gemm(config, PERSISTENT=True)
    loop = sass_k_loop(compiled)
    assert any(inst.opcode.startswith("UTMALDG") and ".MULTICAST" in inst.opcode for inst in loop)
    assert sum(inst.opcode.startswith("SYNCS.ARRIVE.TRANS64.RED") for inst in loop) == 2
    assert not any(inst.opcode.startswith("R2UR") for inst in loop)
    assert len(loop) <= len(sass_k_loop(compile_gemm(config))) + 4, len(loop)
    # the cluster barrier (UCGABAR_ARV / _WAIT) twice in the kernel, never in the tile loop (the largest loop
    # around the HGMMAs): after the inits and after the last tile
    code = disassemble(compiled.cubin)
    tile_loop = loop_containing(code, "HGMMA", outermost=True)
    barriers = [inst for inst in code if inst.opcode.startswith("UCGABAR")]
    assert len(barriers) == 4 and len(tile_loop) > len(loop)
    assert not any(tile_loop[0].address <= inst.address <= tile_loop[-1].address for inst in barriers)


@pytest.mark.parametrize("axis", ["CLUSTER_M", "CLUSTER_N"])
@pytest.mark.parametrize("M, N, K", [(48, 32, 40), (80, 48, 32)])
def test_a_persistent_cluster_config_on_the_interpreter_matches_torch(M, N, K, axis):
    config = tessera.Config({"BM": 16, "BN": 16, "BK": 16, "GROUP_M": 2, "PERSISTENT": True, "STAGES": 2,
                             axis: 2}, num_warps=4)
    a, b = torch.randn(M, K), torch.randn(K, N)
    c = torch.empty(M, N)
    flags = dict(HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none")
    grid = gemm_module._grid(M, N, config.kwargs, 4)
    assert grid == (4,)         # two clusters, several cluster-tiles each
    gemm_kernel.kernel[grid](a, b, c, c, c, c, M, N, K, 1.0, K, 1, N, 1, **flags, **config.as_dict())
    torch.testing.assert_close(c, a @ b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", list(CLUSTERED))
def test_persistent_warp_specialized_cluster_configs_multicast_from_the_producer_without_spills(name):
    needs_ptxas()
    config = CLUSTERED[name]
    compiled = compile_gemm(config, PERSISTENT=True, WS=True)
    ptx, meta = compiled.stages["ptx"], compiled.metadata
    assert meta["spill_stores"] == meta["spill_loads"] == 0 and meta["cluster_dims"] == [2, 1, 1]
    stages, warpgroups = config.kwargs["STAGES"], config.num_warps // 4
    consts = dict(re.findall(r"mov\.b32\s+(%r\d+),\s*(\d+);", ptx))
    inits = re.findall(r"mbarrier\.init\.shared\.b64\s+\[[^\]]+\],\s*(%r\d+|\d+);", ptx)
    assert sorted(int(consts.get(c, c)) for c in inits) == sorted([1] * stages + [2 * warpgroups] * stages)
    # the inits and their cluster barrier before the tile loops (the first wait), then one per role at the end
    arrive, wait = ptx_lines(ptx, r"barrier\.cluster\.arrive\.aligned"), ptx_lines(ptx, r"barrier\.cluster\.wait")
    assert len(arrive) == len(wait) == 3 and max(ptx_lines(ptx, r"mbarrier\.init")) < wait[0] < \
        min(ptx_lines(ptx, r"mbarrier\.try_wait"))
    assert len(ptx_lines(ptx, r"mbarrier\.arrive\.shared::cluster\.b64 _")) >= 2
    assert ptx_lines(ptx, r"cp\.async\.bulk\.tensor\.2d.*\.multicast::cluster")


def test_the_shipped_persistent_cluster_config_awaits_measurement_next_to_its_twins():
    import sys
    from pathlib import Path
    assert SHIPPED.kwargs == {**CLUSTERED["128x256-m2"].kwargs, "PERSISTENT": True, "WS": True}
    assert gemm_configs.awaits_measurement(SHIPPED) and "until measured" in next(
        e["why"] for e in gemm_configs._DATA["sm_90"] if e["meta"] == SHIPPED.kwargs)
    for M, N in ((8192, 8192), (4096, 1024), (256, 256), (1000, 3000)):
        assert not gemm_configs.awaits_measurement(
            gemm_configs.predicted(gemm_configs.configs_for("sm_90"), {"M": M, "N": N}))
    sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
    variants = [v.kwargs for v in importlib.import_module("gemm").config_variants(None)]
    at = variants.index(SHIPPED.kwargs)         # after the one-tile-per-program cluster config and its WS variant
    assert variants[at - 2:at] == [CLUSTERED["128x256-m2"].kwargs, {**CLUSTERED["128x256-m2"].kwargs, "WS": True}]


def test_the_shipped_persistent_cluster_config_assembles_without_spills_in_either_b_layout():
    needs_ptxas()
    for layout in ("b-row-major", "b-transposed"):
        meta = compile_gemm(SHIPPED, b_layout=layout).metadata
        assert meta["spill_stores"] == meta["spill_loads"] == 0 and meta["cluster_dims"] == [2, 1, 1]
        assert meta["shared_bytes"] <= 227 * 1024


# on the GPU: the shipped config, and each one-tile cluster config made persistent without warp specialization
# (its K loop pipelined by thread 0's multicast fills, one cluster barrier after the tile loop)
ON_GPU = {"shipped": SHIPPED,
          **{f"{name}-pipelined": persistent(c, BK=c.kwargs["BK"], WS=False) for name, c in CLUSTERED.items()}}


@pytest.mark.gpu
@pytest.mark.parametrize("config", list(ON_GPU.values()), ids=list(ON_GPU))
@pytest.mark.parametrize("M, N, K", [(4096, 4096, 4096), (1000, 3000, 520), (8192, 8192, 8192)])
def test_the_persistent_cluster_configs_match_torch_matmul_on_the_gpu(M, N, K, config):
    """What the next GPU session shows: the config pinned computes torch.matmul's product (odd row tiles, partial
    tiles, several cluster-tiles per cluster), launched as 66 clusters of 2 on an H100 (cuLaunchKernelEx)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU (thread-block clusters)")
    from tessera.kernels_lib.gemm import gemm, pin_config
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    pin_config(config)
    try:
        out = gemm(a, b)
    finally:
        pin_config(None)
    torch.testing.assert_close(out.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-1)


@WS
def test_the_fused_kernel_walks_cluster_tiles_too(ws):
    """gemm(..., epilogue=...) tunes over the same configs: its persistent tile loop walks cluster-tiles as well,
    multicasting B (from the producer warpgroup with WS), without spills. (The 128 x 256 configs, persistent or
    not, clustered or not, exceed the unroll limit with bench/fusion.py's GELU epilogue: a limit of the fused
    kernel's epilogue, not of clusters.)"""
    needs_ptxas()
    from test_gemm_fused_plan import compile_bench_fused
    config = CLUSTERED["128x128-m2"]
    fused = compile_bench_fused(tessera.Config({**config.kwargs, "PERSISTENT": True, "WS": ws},
                                               num_warps=config.num_warps))
    ptx, meta = fused.stages["ptx"], fused.metadata
    assert meta["cluster_dims"] == [2, 1, 1] and meta["spill_stores"] == meta["spill_loads"] == 0
    assert ptx_lines(ptx, r"cp\.async\.bulk\.tensor\.2d.*\.multicast::cluster")
    assert len(ptx_lines(ptx, r"barrier\.cluster\.wait")) == (3 if ws else 2)
    assert len(ptx_lines(ptx, r"mbarrier\.init\.shared")) == 2 * config.kwargs["STAGES"]
