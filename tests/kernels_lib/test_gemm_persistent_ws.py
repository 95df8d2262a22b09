"""The persistent warp-specialized library GEMM (PERSISTENT and WS, sm_90a): CUTLASS's cooperative persistent kernel.

Specification (`passes/schedule/warp_specialized_tiles.py`):

* on the SIMT simulator the kernel computes what the tile interpreter computes (and numpy) with more tiles than
  programs (three to six per program), partial tiles along M, N and K, odd M, N or K (A or B stored transposed),
  one and two consumer warpgroups, and ring depths 2 and 3, so the slot and phase wrap inside tiles and across
  tile boundaries; the simulator rejects the schedule when the consumers restart the ring at every tile (a phase
  error), when the tile's last slot is not released, or another slot instead (a deadlock);
* in the thread IR the mbarriers are initialized outside every loop and invalidated once, after the branches
  meet; the producer's branch holds the tile loop around the K loop that issues the TMA loads; the consumers'
  tile loop holds the K loop with `wgmma_wait {pending = 1}`, then the drain and the last slot's release; in
  the PTX every mbarrier.init precedes the branches (setmaxnreg) and the loop has `wgmma.wait_group 1`;
* the consumers' K loop in the SASS is the non-persistent WS twin's, within a few instructions;
* the shipped config (sm_90, 128 x 256) assembles without spills, consumers at 232 registers, and is left to
  the timed autotuner (`gemm_configs.awaits_measurement`), recorded by bench/gemm.py next to its twin;
* what the tile body does before the K loop (C read into the accumulator) is the consumers' alone; nestings the
  producer cannot follow (a bound read from memory, the K loop two loops deep) stay a CompileError in strict
  mode naming the reason and the fix;
* on an H100 the shipped config pinned equals torch.matmul (`@pytest.mark.gpu`, more tiles than SMs).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.backends.simt import run_threads
from tessera.ir.core import Operation
from tessera.kernels_lib import gemm_configs
from tessera.kernels_lib.gemm import HOPPER_CONFIGS, gemm_kernel
from tessera.passes.thread_passes import lower

from hopper_gemm import (NO_EPILOGUE, compile_gemm, lowered_gemm, needs_ptxas, needs_sass, opcode_counts, ptx_lines,
                         sass_k_loop, simulate)

torch = pytest.importorskip("torch")
gemm_module = importlib.import_module("tessera.kernels_lib.gemm")
tiles_module = importlib.import_module("tessera.passes.schedule.warp_specialized_tiles")

SHIPPED = next(c for c in HOPPER_CONFIGS if gemm_configs.is_persistent_specialized(c))
# 197 x 144 x 112 in 64 x 64 tiles, BK = 32: 4 x 3 = 12 tiles on 2 programs (lowered_gemm's 2 SMs), 6 each, 4 K
# steps per tile, none of them whole along K, the last row and column of tiles partial
M, N, K = 197, 144, 112


def small(stages: int, bm: int = 64, num_warps: int = 4) -> tessera.Config:
    return tessera.Config(dict(BM=bm, BN=64, BK=32, GROUP_M=2, PERSISTENT=True, STAGES=stages, WS=True),
                          num_warps=num_warps)


def interpreted(args, config, grid) -> np.ndarray:
    """C as the tile interpreter computes it (one program at a time, the same grid)."""
    mine = [np.zeros_like(x) if i == 5 else x for i, x in enumerate(args)]
    gemm_kernel.kernel.interpret(*mine, grid=grid, **NO_EPILOGUE, **config.kwargs)
    return mine[5]


# (config, trans_a, trans_b, M, N, K): TMA needs 16-byte rows, so the odd size is one no row stride depends on:
# M with A and B row-major, N with B stored transposed (N x K), K with A stored transposed (K x M; the
# pipeline leaves that A to the consumers' own loads, the ring holds B alone)
CASES = {
    "s2-1wg-odd-m": (small(2), False, False, M, N, K),
    "s3-1wg-odd-m": (small(3), False, False, M, N, K),
    "s2-2wg-odd-m": (small(2, bm=128, num_warps=8), False, False, M, N, K),
    "s3-1wg-odd-n-b-transposed": (small(3), False, True, M, 143, K),
    "s2-1wg-odd-k-a-transposed": (small(2), True, False, 200, N, 113),
}


@pytest.mark.parametrize("case", CASES)
def test_the_simulator_agrees_with_the_interpreter(case):
    config, trans_a, trans_b, m, n, k = CASES[case]
    fn, args, expected, grid = lowered_gemm(m, n, k, config, trans_a=trans_a, trans_b=trans_b)
    assert grid == (2,) and fn.attrs["num_threads"] == config.num_warps * 32 + 128
    assert any(op.name == "tma_load" for op in fn.walk())      # warp-specialized: the pipelined blocks by TMA
    tiles = -(-m // config.kwargs["BM"]) * -(-n // 64)
    assert tiles >= 3 * grid[0]                 # several tiles per program: the ring runs across them
    simulated = simulate(fn, args, grid)
    np.testing.assert_allclose(simulated, interpreted(args, config, grid), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(simulated, expected, rtol=1e-3, atol=1e-2)


def test_the_epilogue_reads_each_tiles_bias_in_the_consumers_tile_loop():
    """alpha, a bias and ReLU (the bias block read per tile by the consumers, after their K loop) on the simulator."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    bias = rng.standard_normal(N).astype(np.float32)
    unused = np.zeros(1, np.float32)
    args = [a, b, bias, unused, unused, np.zeros((M, N), np.float32), M, N, K, 0.5, K, 1, N, 1]
    config = small(3)
    flags = dict(NO_EPILOGUE, HAS_BIAS=True, ACTIVATION="relu")
    module = gemm_kernel.kernel.specialize(*args, **flags, **config.kwargs).module
    fn = lower(module, "sm_90a", config.num_warps).functions[0]
    run_threads(fn, args, (2,))
    expected = np.maximum(0.5 * (a.astype(np.float32) @ b.astype(np.float32)) + bias, 0.0)
    np.testing.assert_allclose(args[5], expected, rtol=1e-3, atol=1e-2)


def _restarting_consumers(monkeypatch):
    """The consumers' K loop starts every tile at slot 0, parity 0, while the producer counts on."""
    loop = tiles_module.consumer_loop
    monkeypatch.setattr(tiles_module, "consumer_loop",
                        lambda ctx, op, ring, lb, ub, step, start=None: loop(ctx, op, ring, lb, ub, step))


def _no_last_release(monkeypatch):
    """The tile's last slot is never released (as in the one-tile kernel, where no fill waits for it)."""
    monkeypatch.setattr(tiles_module, "release", lambda *args, **kwargs: None)


def _releases_the_wrong_slot(monkeypatch):
    """After the K loop the consumers release the slot two iterations back (a ring count off by one) instead of the
    tile's last."""
    ahead = tiles_module.slot_ahead
    monkeypatch.setattr(tiles_module, "slot_ahead", lambda ctx, slot, by, stages: ahead(ctx, slot, by - 1, stages))


@pytest.mark.parametrize("mutation, message", [
    (_restarting_consumers, "phase error|DEADLOCK"),
    (_no_last_release, "DEADLOCK"),
    (_releases_the_wrong_slot, "DEADLOCK"),
])
def test_the_simulator_rejects_a_ring_that_does_not_run_across_tiles(monkeypatch, mutation, message):
    mutation(monkeypatch)
    fn, args, _, grid = lowered_gemm(M, N, K, small(3))
    with pytest.raises(Exception, match=message):
        run_threads(fn, args, grid)


def _enclosing(op) -> list[str]:
    """The names of the ops holding `op`, innermost first, with the split's branch: 'producer' or 'consumers'."""
    names = []
    while isinstance(getattr(op.parent, "parent", None), Operation):
        holder = op.parent.parent
        if holder.name == "if" and "producer_joins_at" in holder.attrs:
            names.append("producer" if op.parent is holder.regions[0] else "consumers")
        names.append(holder.name)
        op = holder
    return names


def test_the_thread_ir_has_one_ring_for_the_program_and_both_roles_walk_the_tiles():
    fn, *_ = lowered_gemm(M, N, K, small(3))
    ops = list(fn.walk())
    inits = [op for op in ops if op.name == "mbarrier_init"]
    invals = [op for op in ops if op.name == "mbarrier_inval"]
    assert len(inits) == len(invals) == 2 * 3                   # full[3] and empty[3], once each
    assert all("for" not in _enclosing(op) and "producer" not in _enclosing(op) for op in inits + invals)
    assert all("consumers" in _enclosing(op) for op in invals)  # after the branches met
    (split,) = [op for op in ops if op.name == "if" and "producer_joins_at" in op.attrs]
    assert split.parent is fn.body
    fills = [op for op in ops if op.name == "tma_load"]
    assert fills and all(_enclosing(op).count("for") == 2 and "producer" in _enclosing(op) for op in fills)
    waits = [op for op in ops if op.name == "wgmma_wait"]
    assert {op.attrs["pending"] for op in waits} == {0, 1}
    assert all(_enclosing(op)[:2] == ["for", "for"] for op in waits if op.attrs["pending"] == 1)   # the K loop's
    drain = next(op for op in waits if op.attrs["pending"] == 0)
    assert _enclosing(drain)[0] == "for" and "consumers" in _enclosing(drain)  # once per tile, in the tile loop
    after = drain.parent.ops[drain.parent.ops.index(drain) + 1:]
    first_if = next(op for op in after if op.regions)          # the tile's last slot's release, before the epilogue
    assert [inner.name for inner in first_if.walk()].count("mbarrier_arrive") == 1
    # after the split no block-wide barrier (the producer never reaches one): the epilogue's are the consumers'
    # named barrier 1; barrier 2 is where both roles meet, once each
    inside = list(split.walk())
    assert not any(op.name == "barrier" for op in inside)
    named = [(op.attrs["id"], op.attrs["count"], "for" in _enclosing(op))
             for op in inside if op.name == "named_barrier"]
    assert (1, 128, True) in named and set(named) <= {(1, 128, True), (1, 128, False), (2, 256, False)}
    assert named.count((2, 256, False)) == 2
    # C's TMA store reads its buffer while the next tile's K loop runs (`tma_store.overlap_loop`): in the
    # consumers' tile loop its read-wait comes before the next tile's writes, and once more after the loop
    reads = [op for op in inside if op.name == "bulk_wait_group_read"]
    assert [_enclosing(op).count("for") for op in reads] == [1, 0]
    assert all("consumers" in _enclosing(op) for op in reads)


def test_the_shipped_config_assembles_without_spills_with_the_ring_set_up_once():
    needs_ptxas()
    compiled = compile_gemm(SHIPPED)
    ptx, meta = compiled.stages["ptx"], compiled.metadata
    assert meta["spill_stores"] == meta["spill_loads"] == 0, meta["log"]
    # the producer warpgroup's 40 registers leave the two consumer warpgroups 232 each (of 65536)
    assert meta["num_threads"] == 384 and ptx_lines(ptx, r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232;")
    stages = SHIPPED.kwargs["STAGES"]
    inits, branches = ptx_lines(ptx, r"mbarrier\.init"), ptx_lines(ptx, r"setmaxnreg")
    assert len(inits) == 2 * stages and max(inits) < min(branches)           # before the split, once
    assert len(ptx_lines(ptx, r"mbarrier\.inval")) == 2 * stages
    assert ptx_lines(ptx, r"wgmma\.wait_group\.sync\.aligned\s+1;") and ptx_lines(ptx, r"cp\.async\.bulk\.tensor")
    # the epilogue's C tile (128 x 256 bf16 through stmatrix) cannot reuse the rings' bytes: both fit in 227 KB
    rings = stages * (128 + 256) * 64 * 2
    assert rings + 128 * 256 * 2 <= meta["shared_bytes"] <= 227 * 1024


def test_the_shipped_config_assembles_without_spills_with_b_transposed_and_a_bias_gelu_epilogue():
    needs_ptxas()
    meta = compile_gemm(SHIPPED, b_layout="b-transposed", HAS_BIAS=True, ACTIVATION="gelu").metadata
    assert meta["spill_stores"] == meta["spill_loads"] == 0, meta["log"]


def test_the_consumers_k_loop_is_the_one_tile_kernels_in_the_sass():
    """Walking tiles costs the consumers' K loop nothing but a register move or two (SASS, ptxas 13.0: 45
    instructions against the non-persistent WS twin's 43, four HGMMAs, no TMA issue and no CTA barrier in it; the
    plain twin's loop, which issues the fills itself, is 116)."""
    needs_sass()
    twin = tessera.Config(dict(SHIPPED.kwargs, PERSISTENT=False), num_warps=SHIPPED.num_warps)
    mine, theirs = sass_k_loop(compile_gemm(SHIPPED)), sass_k_loop(compile_gemm(twin))
    counts = opcode_counts(mine)
    assert counts["HGMMA"] == opcode_counts(theirs)["HGMMA"] == 4
    assert "UTMALDG" not in counts and "BAR" not in counts
    assert len(mine) <= len(theirs) + 4, (len(mine), len(theirs))


def test_the_shipped_config_awaits_measurement_next_to_its_twin():
    (entry,) = [e for e in gemm_configs._DATA["sm_90"] if e["meta"].get("PERSISTENT") and e["meta"].get("WS")]
    assert "Model only" in entry["why"] and "until measured" in entry["why"]
    assert gemm_configs.awaits_measurement(SHIPPED) and not gemm_configs.awaits_measurement(HOPPER_CONFIGS[0])
    twin = dict(SHIPPED.kwargs, PERSISTENT=False)
    del twin["WS"]
    assert any(c.kwargs == twin for c in gemm_configs.configs_for("sm_90"))
    for M_, N_ in ((8192, 8192), (4096, 4096), (128, 14336), (1000, 272)):
        chosen = gemm_configs.predicted(gemm_configs.configs_for("sm_90"), {"M": M_, "N": N_})
        assert not gemm_configs.awaits_measurement(chosen)
    sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
    bench = importlib.import_module("gemm")         # bench/gemm.py
    variants = [c.kwargs for c in bench.config_variants(None)]
    at = variants.index(SHIPPED.kwargs)
    assert variants[at - 1] == dict(twin, WS=True) and variants[at - 2] == twin


@tessera.func
def _product(a, b, acc, pid_m, pid_n, steps, BM, BN, BK):
    """acc + A[pid_m, :steps] @ B[:steps, pid_n], the K loop warp-specialized."""
    for k in tessera.pipeline(0, steps, stages=3, warp_specialize=True):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    return acc


def _tile_loop_kernel(nesting: str):
    """A persistent GEMM C += A @ B whose K loop the producer cannot follow: `nesting` = "loaded-bound" (the K
    loop's bound read from memory per tile), "bound-loaded-before" (read before the tile loop, where only the
    consumers read memory) or "loop-in-loop" (the K loop two loops deep); or can: "accumulate" (C's tile read
    into the accumulator before the K loop, by the consumers alone)."""

    @tessera.kernel
    def tiles(a_ptr, b_ptr, c_ptr, k_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
              BK: tessera.constexpr, NESTING: tessera.constexpr):
        a = tessera.view(a_ptr, (M, K), (K, 1))
        b = tessera.view(b_ptr, (K, N), (N, 1))
        c = tessera.view(c_ptr, (M, N))
        tiles_n = tessera.cdiv(N, BN)
        first_steps = tessera.load(k_ptr)           # read before the tile loop: only the consumers may
        for tile in range(tessera.program_id(0), tessera.cdiv(M, BM) * tiles_n, tessera.num_programs(0)):
            pid_m, pid_n = tile // tiles_n, tile % tiles_n
            steps = tessera.cdiv(K, BK) if NESTING != "bound-loaded-before" else first_steps
            if NESTING == "loaded-bound":
                steps = tessera.load(k_ptr + tile)
            if NESTING == "loop-in-loop":
                for half in range(0, 2):
                    acc = _product(a, b, tessera.zeros((BM, BN), dtype=tessera.f32), pid_m, pid_n, steps, BM, BN,
                                   BK)
                    c.block((BM, BN), (pid_m, pid_n)).store(acc + half)
            else:
                acc = tessera.zeros((BM, BN), dtype=tessera.f32)
                if NESTING == "accumulate":
                    acc = c.block((BM, BN), (pid_m, pid_n)).load()
                acc = _product(a, b, acc, pid_m, pid_n, steps, BM, BN, BK)
                c.block((BM, BN), (pid_m, pid_n)).store(acc)
    return tiles


@pytest.mark.parametrize("nesting, message", [
    ("loaded-bound", r"the producer warpgroup runs the tile loop at line \d+.*need 'load'.*compute them from the "
                     r"tile index with scalar arithmetic, or drop warp_specialize=True"),
    ("bound-loaded-before", r"the producer warpgroup needs 'first_steps' \(a loop bound or a pipelined block's "
                            r"address\), which is read from memory before the loop"),
    ("loop-in-loop", r"must be a statement of the kernel, or of the body of a loop over tiles.*drop "
                     r"warp_specialize=True or move the loop"),
])
def test_a_nesting_the_producer_cannot_follow_is_a_compile_error(nesting, message):
    kernel = _tile_loop_kernel(nesting)
    with pytest.raises(tessera.CompileError, match=message):
        kernel.compile(signature="*bf16:16,*bf16:16,*f32:16,*i32:16,i32:16,i32:16,i32:16", target="sm_90a",
                       num_warps=4, strict=True, BM=64, BN=64, BK=64, NESTING=nesting)


def test_a_tile_read_before_the_k_loop_is_the_consumers_alone():
    """What the tile body does before the K loop (here: C's tile read into the accumulator) runs in the consumers'
    tile loop only; the producer needs none of it. 2 programs, 4 tiles, 3 K steps each on a 3-slot ring."""
    rng = np.random.default_rng(6)
    m, n, k = 100, 128, 96
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    c = rng.standard_normal((m, n)).astype(np.float32)
    expected = c + a.astype(np.float32) @ b.astype(np.float32)
    args = [a, b, c, np.zeros(1, np.int32), m, n, k]
    module = _tile_loop_kernel("accumulate").specialize(*args, BM=64, BN=64, BK=32, NESTING="accumulate").module
    fn = lower(module, "sm_90a", 4).functions[0]
    assert fn.attrs["num_threads"] == 256
    run_threads(fn, args, (2,))
    np.testing.assert_allclose(c, expected, rtol=1e-3, atol=1e-2)


@pytest.mark.gpu
def test_the_shipped_config_equals_torch_matmul_on_a_gpu():
    """On an H100 (the next GPU session): the shipped config pinned, with more tiles than SMs (several per program)
    and partial tiles along M, N and K; bias and GELU in the consumers' epilogue."""
    from tessera.runtime import cuda
    from tessera.testing import assert_close
    if cuda.device_count() == 0 or cuda.get_device(0).capability < (9, 0):
        pytest.skip("needs a Hopper GPU")
    from tessera.kernels_lib.gemm import gemm, pin_config
    g = torch.Generator().manual_seed(4)
    pin_config(SHIPPED)
    try:
        for m, n, k in ((4096, 4096, 4096), (3000, 2056, 1000), (1000, 272, 1008)):
            a = torch.randn((m, k), generator=g).to(torch.bfloat16).cuda()
            b = torch.randn((k, n), generator=g).to(torch.bfloat16).cuda()
            assert_close(gemm(a, b).float(), a.float() @ b.float(), rtol=2e-2, atol=2e-1,
                         matmul=(a.float(), b.float(), SHIPPED.kwargs["BK"]))
            bias = torch.randn(n, generator=g).cuda()
            pre = a.float() @ b.float() + bias
            assert_close(gemm(a, b, bias, activation="gelu").float(), torch.nn.functional.gelu(pre, approximate="tanh"),
                         rtol=2e-2, atol=2e-1)
            assert_close(gemm(a, b).float(), torch.matmul(a, b).float(), rtol=2e-2, atol=2e-1)
    finally:
        pin_config(None)
