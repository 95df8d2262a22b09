"""The library GEMM in thread-block clusters of 2 with TMA multicast of B (issue 19: CLUSTER_M configs).

Specification:

* the sm_90 configs with CLUSTER_M = 2 or CLUSTER_N = 2 (gemm_configs.json) compile for sm_90a with the cluster
  in the PTX (.explicitcluster, .reqnctapercluster 2, 1, 1), the cluster barrier after the mbarrier inits and
  after the K loop, half of the shared operand's boxes (B's, or the rows of A's) per fill issued by each program
  with .multicast::cluster to both (the other operand whole), and
  before each refill the empty-slot handshake (mapa + remote arrive on both programs' barriers); ptxas
  assembles them without spills; in the SASS the refill (UTMALDG) still follows `wgmma.wait_group 1`;
* on the SIMT simulator a pair of programs computes what the same kernel without clusters computes, bit for
  bit, and what numpy does, with an odd number of row (column) tiles (the last cluster's second program is
  past M or N);
* on the tile interpreter the kernel agrees with torch, which also checks that the programs of a cluster load
  the same B blocks (the multicast promise);
* the configs are shipped for the autotuner to time (and bench/gemm.py --part configs to record) but are
  never what the untimed model picks (`gemm_configs.predicted`), until a GPU has measured them.

(The persistent kernel in clusters: test_gemm_persistent_cluster.py.)
"""

from __future__ import annotations

import importlib
import re

import numpy as np
import pytest

import tessera
from tessera.kernels_lib import gemm_configs
from tessera.kernels_lib.gemm import HOPPER_CONFIGS, gemm_kernel

from hopper_gemm import (compile_gemm, first, last, lowered_gemm, needs_ptxas, needs_sass, ptx_lines, sass_k_loop,
                         simulate)

torch = pytest.importorskip("torch")
gemm_module = importlib.import_module("tessera.kernels_lib.gemm")

CLUSTERED = {f"{c.kwargs['BM']}x{c.kwargs['BN']}-{'m' if c.kwargs.get('CLUSTER_M', 1) > 1 else 'n'}2": c
             for c in HOPPER_CONFIGS if gemm_configs.is_clustered(c) and not c.kwargs["PERSISTENT"]}


def shares_b(config) -> bool:
    """CLUSTER_M: the cluster's programs share B's blocks; CLUSTER_N: A's."""
    return config.kwargs.get("CLUSTER_M", 1) > 1


def test_the_cluster_configs_are_shipped_with_a_bandwidth_model_reason():
    assert set(CLUSTERED) == {"128x256-m2", "128x128-m2", "256x128-n2"}
    entries = [e for e in gemm_configs._DATA["sm_90"] if gemm_configs.is_clustered(tessera.Config(e["meta"]))
               and not e["meta"]["PERSISTENT"]]        # (the persistent one: test_gemm_persistent_cluster.py)
    per_clock = 700e12 / 132 / 1.83e9           # bf16 FLOP per clock per SM at 700 TFLOP/s (the "why"s' model)
    for entry in entries:
        m, why = entry["meta"], entry["why"]
        a, b = m["BM"] * m["BK"] * 2, m["BK"] * m["BN"] * 2            # bf16 bytes of each operand per K step
        clocks = 2 * m["BM"] * m["BN"] * m["BK"] / per_clock
        shared = b if m.get("CLUSTER_M", 1) > 1 else a          # the multicast operand: half of it per program
        assert f"{(a + b) // 1024} -> {(a + b - shared // 2) // 1024} KB" in why
        assert f"~{round((a + b) / clocks)} -> ~{round((a + b - shared / 2) / clocks)} B/clk/SM" in why, why
        assert f"{round(clocks)} clk of HGMMA" in why and "until measured" in why
        twin = {k: v for k, v in entry["meta"].items() if k not in ("CLUSTER_M", "CLUSTER_N")}
        assert any(c.kwargs == twin for c in gemm_configs.configs_for("sm_90")), "timed next to its twin"


@pytest.mark.parametrize("name", list(CLUSTERED))
def test_the_untimed_model_never_picks_a_cluster_config(name):
    for M, N in ((8192, 8192), (4096, 1024), (256, 256), (1000, 3000)):
        chosen = gemm_configs.predicted(gemm_configs.configs_for("sm_90"), {"M": M, "N": N})
        assert not gemm_configs.is_clustered(chosen)


def test_bench_records_the_cluster_configs_plain_and_warp_specialized():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
    bench = importlib.import_module("gemm")
    variants = bench.config_variants(None)
    clustered = [v for v in variants if gemm_configs.is_clustered(v) and not v.kwargs["PERSISTENT"]]
    assert len(clustered) == 2 * len(CLUSTERED) and sum(bool(v.kwargs.get("WS")) for v in clustered) == len(CLUSTERED)


@pytest.mark.parametrize("name", list(CLUSTERED))
def test_cluster_configs_multicast_b_in_the_ptx_and_assemble_without_spills(name):
    needs_ptxas()
    config = CLUSTERED[name]
    compiled = compile_gemm(config)
    ptx, meta = compiled.stages["ptx"], compiled.metadata
    assert meta["cluster_dims"] == [2, 1, 1] and re.search(r"\.explicitcluster\s+\.reqnctapercluster 2, 1, 1", ptx)
    assert meta["spill_stores"] == meta["spill_loads"] == 0 and meta["registers"] <= 255
    assert meta["shared_bytes"] <= 227 * 1024
    arrive, wait = ptx_lines(ptx, r"barrier\.cluster\.arrive\.aligned"), ptx_lines(ptx, r"barrier\.cluster\.wait")
    inits, loop_wait = ptx_lines(ptx, r"mbarrier\.init\.shared"), ptx_lines(ptx, r"mbarrier\.try_wait")[0]
    assert len(arrive) == len(wait) == 2 and max(inits) < arrive[0] < wait[0] < loop_wait < arrive[1]
    # each fill: the program's own operand's boxes (64 bf16 columns each), and its share of the shared operand's,
    # multicast to both programs: half of B's four or two column boxes, or half of the rows of A's one box
    stages, bk, bn = config.kwargs["STAGES"], config.kwargs["BK"], config.kwargs["BN"]
    shared_boxes, own_boxes = (bn // 64, bk // 64) if shares_b(config) else (bk // 64, bn // 64)
    share = shared_boxes // 2 if shared_boxes % 2 == 0 else shared_boxes
    multicast = [i for i in ptx_lines(ptx, r"cp\.async\.bulk\.tensor\.2d.*\.multicast::cluster") if i < loop_wait]
    own = [i for i in ptx_lines(ptx, r"cp\.async\.bulk\.tensor\.2d") if i < loop_wait and i not in multicast]
    assert len(multicast) == (stages - 1) * share and len(own) == (stages - 1) * own_boxes
    # the refill's handshake: arrive on both programs' empty slot (mapa + remote arrive), then wait for both
    assert len(ptx_lines(ptx, r"mapa\.shared::cluster")) == 2
    assert len(ptx_lines(ptx, r"mbarrier\.arrive\.shared::cluster\.b64 _")) == 2
    # empty mbarriers count the cluster's 2 programs
    consts = dict(re.findall(r"mov\.b32\s+(%r\d+),\s*(\d+);", ptx))
    inits = re.findall(r"mbarrier\.init\.shared\.b64\s+\[[^\]]+\],\s*(%r\d+|\d+);", ptx)
    counts = [int(consts.get(c, c)) for c in inits]
    assert sorted(counts) == [1] * stages + [2] * stages, counts


@pytest.mark.parametrize("name", list(CLUSTERED))
def test_the_cluster_refill_follows_the_wait_for_the_previous_wgmma_group_and_no_fence(name):
    needs_sass()
    loop = sass_k_loop(compile_gemm(CLUSTERED[name]))
    depbar = next(i for i, inst in enumerate(loop) if re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1\b", inst.text))
    refills = [i for i, inst in enumerate(loop) if inst.opcode.startswith("UTMALDG")]
    assert refills and last(loop, "HGMMA") < depbar < first(loop, "BAR.SYNC") < min(refills)
    assert any(".MULTICAST" in loop[i].opcode for i in refills), [loop[i].text for i in refills]
    # the empty-slot handshake: two remote arrivals with no GPU-wide fence before them (release at CTA scope)
    assert sum(inst.opcode.startswith("SYNCS.ARRIVE.TRANS64.RED") for inst in loop) == 2
    assert not any(inst.opcode.startswith("MEMBAR") for inst in loop), [i.text for i in loop if "MEMBAR" in i.text]
    # the slot and descriptor arithmetic stays on the uniform datapath, as in the unclustered twin's loop
    assert not any(inst.opcode.startswith("R2UR") for inst in loop), len(loop)
    twin = tessera.Config({k: v for k, v in CLUSTERED[name].kwargs.items() if k not in ("CLUSTER_M", "CLUSTER_N")},
                          num_warps=CLUSTERED[name].num_warps)
    assert len(loop) <= len(sass_k_loop(compile_gemm(twin))) + 16, len(loop)   # the handshake: 2 arrivals, a wait


def small(config, **changes):
    return tessera.Config({**config.kwargs, "BK": 32, **changes}, num_warps=config.num_warps)


@pytest.mark.parametrize("name, M, N, K", [
    ("128x128-m2", 300, 128, 160),  # three row tiles: the second cluster's second program lies past M
    ("128x256-m2", 256, 320, 96),   # B of four 64-column boxes, two per program; the second N tile partial
    ("256x128-n2", 200, 384, 96),   # A's one box split by rows (128 each); three column tiles, the last cluster's
                                    # second program past N
])
def test_a_cluster_pair_matches_the_unclustered_kernel_bit_for_bit_on_the_simt_simulator(name, M, N, K):
    config = small(CLUSTERED[name])
    fn, args, expected, grid = lowered_gemm(M, N, K, config)
    assert fn.attrs["cluster_dims"] == (2, 1, 1) and grid[0] % 2 == 0
    assert any(op.attrs.get("multicast") for op in fn.walk() if op.name == "tma_load")
    alone, alone_args, _, alone_grid = lowered_gemm(M, N, K, small(CLUSTERED[name], CLUSTER_M=1, CLUSTER_N=1))
    np.testing.assert_array_equal(simulate(fn, args, grid), simulate(alone, alone_args, alone_grid))
    np.testing.assert_allclose(args[5], expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("axis", ["CLUSTER_M", "CLUSTER_N"])
@pytest.mark.parametrize("M, N, K", [(48, 32, 40), (64, 48, 32)])
def test_a_cluster_config_on_the_interpreter_matches_torch(M, N, K, axis):
    config = tessera.Config({"BM": 16, "BN": 16, "BK": 16, "GROUP_M": 2, "PERSISTENT": False, "STAGES": 2,
                             axis: 2}, num_warps=4)
    a, b = torch.randn(M, K), torch.randn(K, N)
    c = torch.empty(M, N)
    flags = dict(HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none")
    grid = gemm_module._grid(M, N, config.kwargs, 4)
    rows, columns = -(-M // 16), -(-N // 16)
    assert grid == (-(-rows // 2) * 2 * columns if axis == "CLUSTER_M" else rows * -(-columns // 2) * 2,)
    gemm_kernel.kernel[grid](a, b, c, c, c, c, M, N, K, 1.0, K, 1, N, 1, **flags, **config.as_dict())
    torch.testing.assert_close(c, a @ b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", list(CLUSTERED))
def test_warp_specialized_cluster_configs_multicast_from_the_producer_without_spills(name):
    """WS=True with a cluster: CUTLASS's protocol (`passes/schedule/multicast.py`): the empty barriers count both
    programs' consumer warpgroups, each warpgroup's release arrives on both programs (mapa + remote arrive, once
    in the consumers' loop), the producer's fills multicast its share, and the cluster barrier runs after the
    inits and, after the loop, once on each side of the producer / consumer split."""
    needs_ptxas()
    config = CLUSTERED[name]
    compiled = compile_gemm(config, WS=True)
    ptx, meta = compiled.stages["ptx"], compiled.metadata
    assert meta["spill_stores"] == meta["spill_loads"] == 0 and meta["cluster_dims"] == [2, 1, 1]
    stages, warpgroups = config.kwargs["STAGES"], config.num_warps // 4
    consts = dict(re.findall(r"mov\.b32\s+(%r\d+),\s*(\d+);", ptx))
    inits = re.findall(r"mbarrier\.init\.shared\.b64\s+\[[^\]]+\],\s*(%r\d+|\d+);", ptx)
    counts = [int(consts.get(c, c)) for c in inits]
    assert sorted(counts) == sorted([1] * stages + [2 * warpgroups] * stages), counts
    assert len(ptx_lines(ptx, r"mbarrier\.arrive\.shared::cluster\.b64 _")) == 2
    assert ptx_lines(ptx, r"\.multicast::cluster") and len(ptx_lines(ptx, r"barrier\.cluster\.wait")) == 3


@pytest.mark.parametrize("name, M, N, K", [("128x128-m2", 300, 128, 160), ("256x128-n2", 200, 384, 96)])
def test_a_warp_specialized_cluster_pair_matches_the_unclustered_kernel_on_the_simt_simulator(name, M, N, K):
    fn, args, expected, grid = lowered_gemm(M, N, K, small(CLUSTERED[name], WS=True))
    assert any(op.attrs.get("multicast") for op in fn.walk() if op.name == "tma_load")
    alone, alone_args, _, alone_grid = lowered_gemm(M, N, K, small(CLUSTERED[name], WS=True, CLUSTER_M=1,
                                                                   CLUSTER_N=1))
    np.testing.assert_array_equal(simulate(fn, args, grid), simulate(alone, alone_args, alone_grid))
    np.testing.assert_allclose(args[5], expected, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("ws", [False, True], ids=["pipelined", "warp-specialized"])
@pytest.mark.parametrize("name", list(CLUSTERED))
@pytest.mark.parametrize("M, N, K", [(4096, 4096, 4096), (1000, 3000, 520)])
def test_cluster_configs_match_torch_matmul_on_the_gpu(name, M, N, K, ws):
    """What the next GPU session shows: each cluster config pinned computes torch.matmul's product (odd row
    tiles and partial tiles included), launched in clusters of 2 (cuLaunchKernelEx)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU (thread-block clusters)")
    from tessera.kernels_lib.gemm import gemm, pin_config
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    pin_config(tessera.Config(dict(CLUSTERED[name].kwargs, WS=ws), num_warps=CLUSTERED[name].num_warps))
    try:
        out = gemm(a, b)
    finally:
        pin_config(None)
    torch.testing.assert_close(out.float(), (a.float() @ b.float()), rtol=2e-2, atol=2e-1)


def test_the_fused_kernel_takes_the_cluster_configs_too():
    """gemm(..., epilogue=...) tunes over the same configs: with CLUSTER_M its K loop multicasts B just the same,
    and the epilogue's K loop keeps the plain kernel's instructions."""
    needs_ptxas()
    from test_gemm_fused_plan import compile_bench_fused, k_loop
    config = CLUSTERED["128x128-m2"]
    fused, plain = compile_bench_fused(config), compile_gemm(config)
    assert fused.metadata["cluster_dims"] == [2, 1, 1] and fused.metadata["spill_stores"] == 0
    for pattern in (r"\.multicast::cluster", r"mbarrier\.arrive\.shared::cluster", r"barrier\.cluster\.wait"):
        assert len(re.findall(pattern, fused.stages["ptx"])) == len(re.findall(pattern, plain.stages["ptx"])) > 0
    needs_sass()
    assert k_loop(fused)[0] == k_loop(plain)[0]
