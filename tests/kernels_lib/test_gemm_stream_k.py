"""The stream-K GEMM (tessera/kernels_lib/gemm_stream_k.py): the kernel on the interpreter against numpy where
tiles and K ranges straddle, the same bits whatever order its programs arrive in, the SIMT simulator on sm_80
and sm_90a with its happens-before check (and two mutations of the counter caught as races: narrowed to the CTA,
relaxed to a plain load and store; on sm_90a the TMA-stored partial's full wait weakened), the hand-off's
instructions in PTX, the two K loops' shared ring, ptxas without spills, the wave model and the op's choice
($TESSERA_GEMM_STREAM_K)."""

import importlib
import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera.backends.interp import InterpreterError  # noqa: E402
from tessera.backends.interp.addresses import AddressSpace  # noqa: E402
from tessera.backends.interp.interpreter import ProgramInstance, bind_arguments  # noqa: E402
from tessera.kernels_lib import gemm_configs, gemm_stream_k  # noqa: E402
from tessera.kernels_lib.gemm_stream_k import (StreamKPlan, gemm_stream_k_kernel, modelled,  # noqa: E402
                                              stream_k_plan)

from test_gemm import check, operands, reference  # noqa: E402

gemm_module = importlib.import_module("tessera.kernels_lib.gemm")
NO_EPILOGUE = dict(HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none")
SMALL = dict(BM=16, BN=16, BK=16, GROUP_M=2, STAGES=2)


def problem(M, N, K, programs, BM=16, BN=16, seed=0):
    """Random float32 operands and the kernel's arguments but sk_tiles (C, workspace and counters zeroed)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    unused = np.zeros(1, np.float32)
    tiles = -(-M // BM) * -(-N // BN)
    args = [a, b, unused, unused, unused, np.zeros((M, N), np.float32),
            np.zeros((2 * programs * BM, BN), np.float32), np.zeros(max(tiles, 1), np.int32),
            M, N, K, 1.0, K, 1, N, 1, 2 * programs * BM]
    return args, a.astype(np.float64) @ b.astype(np.float64)


def run_in_order(args, order, **constexprs):
    """The kernel on the interpreter with its programs run one by one in `order` (a permutation of the grid):
    which contributor of a tile arrives last, and sums the partials, follows the order."""
    fn = gemm_stream_k_kernel.specialize(*args, **constexprs).function
    bound = bind_arguments(fn, args)
    cache, reachable, grid = {}, AddressSpace(bound), (len(order), 1, 1)
    for program in order:
        ProgramInstance(fn, (program, 0, 0), grid, cache, reachable).run(bound)


# --- the kernel on the interpreter --------------------------------------------------------------------------

CASES = {   # M, N, K, programs, sk_tiles: what straddles what
    "odd-sizes-partial-last-wave": (37, 41, 75, 4, 1),           # 9 tiles, 5 K steps (the last 11 deep)
    "two-tiles-over-four-programs": (37, 41, 75, 4, 2),
    "every-tile-stream-k-ranges-span-tiles": (37, 41, 75, 4, 9),  # 45 steps / 4: ranges of 12 over 5-step tiles
    "programs-fewer-than-tiles-two-partials-each": (50, 50, 80, 3, 16),
    "one-tile-only": (16, 16, 200, 7, 1),                      # 13 steps over 7 programs: 7 contributors
    "more-programs-than-k-steps": (20, 16, 20, 5, 2),          # 4 steps over 5 programs: one has none
    "k-not-a-multiple-of-bk": (33, 17, 47, 2, 4),
    "data-parallel-only": (33, 50, 33, 3, 0),
    "one-k-step": (40, 40, 9, 3, 5),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_numpy_and_leaves_the_counters_at_zero(name):
    M, N, K, programs, sk_tiles = CASES[name]
    args, expected = problem(M, N, K, programs)
    gemm_stream_k_kernel[(programs,)](*args, sk_tiles, **NO_EPILOGUE, **SMALL)
    np.testing.assert_allclose(args[5], expected, rtol=1e-5, atol=1e-4)
    assert not args[7].any(), "every tile's last contributor resets its counter"
    # a second launch on the same counters (no clearing in between) computes the same bits
    first = args[5].copy()
    args[5][:] = 0
    gemm_stream_k_kernel[(programs,)](*args, sk_tiles, **NO_EPILOGUE, **SMALL)
    np.testing.assert_array_equal(args[5], first)


def test_the_same_bits_whatever_order_the_programs_arrive_in():
    """Every permutation of 4 programs over two tiles split 2 and 3 ways (19 K steps each, ranges of 10): the
    last to arrive differs, and sums the partials in K order, so C is bitwise the same (three partials, since
    two add the same in either order). Differing from the data-parallel sum shows the partials are real."""
    M, N, K, programs, sk_tiles = 37, 41, 300, 4, 2
    results = []
    for order in itertools.permutations(range(programs)):
        args, expected = problem(M, N, K, programs, seed=3)
        run_in_order(args + [sk_tiles], order, **NO_EPILOGUE, **SMALL)
        assert not args[7].any()
        results.append(args[5])
    np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=1e-4)
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])
    data_parallel, _ = problem(M, N, K, programs, seed=3)
    gemm_stream_k_kernel[(programs,)](*data_parallel, 0, **NO_EPILOGUE, **SMALL)
    assert not np.array_equal(data_parallel[5], results[0]), "the split tiles were summed in another order"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True)])
def test_the_op_forced_to_stream_k_matches_torch_with_the_epilogue(dtype, trans_a, trans_b, monkeypatch):
    """$TESSERA_GEMM_STREAM_K=1 on the interpreter (4 "SMs", 16 x 16 tiles): 30 tiles, 2 in the last wave, 6
    stream-K with the wave before it (`stream_k_tiles`)."""
    monkeypatch.setenv(gemm_module.STREAM_K_ENV, "1")
    plans = record_plans(monkeypatch)
    M, N, K = 80, 90, 100
    a, b = operands(M, N, K, dtype, trans_a, trans_b, seed=5)
    bias = torch.randn(N, generator=torch.Generator().manual_seed(1))
    out = gemm_module.gemm(a, b, bias, activation="gelu", trans_a=trans_a, trans_b=trans_b, alpha=0.5)
    check(out, reference(a, b, bias, "gelu", dtype, trans_a, trans_b, alpha=0.5))
    assert plans == [StreamKPlan(16, 16, 16, 2, 2, 4, 4, 6)]


def test_the_op_forced_to_stream_k_applies_fp8_row_and_column_scales_to_the_right_tiles(monkeypatch):
    """Per-row scales of A and per-column scales of B: a stream-K tile's epilogue finds its rows and columns."""
    import test_gemm_fp8 as fp8
    monkeypatch.setenv(gemm_module.STREAM_K_ENV, "1")
    plans = record_plans(monkeypatch)
    a, b = fp8.fp8_operands(70, 40, 200, fp8.E4M3, fp8.E4M3, seed=4)        # 15 tiles: 3 + 4 stream-K
    scale_a, scale_b = fp8.scales(70, 40, True)
    out = gemm_module.gemm(a, b, scale_a=scale_a, scale_b=scale_b)
    fp8.check(out, fp8.reference(a, b, scale_a, scale_b))
    assert [p.sk_tiles for p in plans] == [7]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(M=st.integers(1, 70), N=st.integers(1, 70), K=st.integers(1, 150), programs=st.integers(1, 9),
       data=st.data())
def test_any_split_of_any_shape_matches_numpy(M, N, K, programs, data):
    """Property: for every shape, program count and number of stream-K tiles, C is numpy's product and every
    counter is back at 0."""
    tiles = -(-M // 16) * -(-N // 16)
    sk_tiles = data.draw(st.integers(0, tiles), label="sk_tiles")
    args, expected = problem(M, N, K, programs, seed=M * N)
    gemm_stream_k_kernel[(programs,)](*args, sk_tiles, **NO_EPILOGUE, **SMALL)
    np.testing.assert_allclose(args[5], expected, rtol=1e-5, atol=1e-4)
    assert not args[7].any()


def record_plans(monkeypatch):
    plans = []
    real = gemm_stream_k.launch

    def recording(*args, **kwargs):
        plans.append(real(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(gemm_stream_k, "launch", recording)
    gemm_module._stream_k_plan.cache_clear()
    return plans


# --- the SIMT simulator: the hand-off between programs ------------------------------------------------------

SIMULATED_TILES = {"64x64": (dict(BM=64, BN=64, BK=32, GROUP_M=2, STAGES=2), 4),
                   "shipped": (dict(BM=128, BN=128, BK=64, GROUP_M=8, STAGES=3), 8)}    # two warpgroups


def simulated(target, mutate=None, tile="64x64"):
    """The kernel lowered for `target` (wgmma and TMA on sm_90a, mma.sync and cp.async on sm_80, MFMA and
    direct-to-LDS loads on gfx942) on the simulator: 2 x 2 tiles, 5 K steps, on 3 programs, the last 2 tiles
    stream-K (ranges of 4 steps: a tile of one program, tiles of two). `mutate` edits the thread IR first.
    Returns (C, numpy's C, the counters)."""
    from tessera.backends.simt import run_threads
    from tessera.passes.thread_passes import lower
    meta, warps = SIMULATED_TILES[tile]
    M, N, K, programs = int(1.5 * meta["BM"]), 2 * meta["BN"], 5 * meta["BK"], 3
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((M, K)).astype(np.float16), rng.standard_normal((K, N)).astype(np.float16)
    unused = np.zeros(1, np.float32)
    args = [a, b, unused, unused, unused, np.zeros((M, N), np.float32),
            np.zeros((2 * programs * meta["BM"], meta["BN"]), np.float32), np.zeros(4, np.int32), M, N, K, 1.0, K, 1,
            N, 1, 2 * programs * meta["BM"], 2]
    spec = gemm_stream_k_kernel.specialize(*args, **NO_EPILOGUE, **meta)
    fn = lower(spec.module, target, warps).functions[0]
    if mutate is not None:
        mutate(fn)
    run_threads(fn, args, (programs,), global_races=True)
    return args[5], a.astype(np.float32) @ b.astype(np.float32), args[7]


@pytest.mark.parametrize("target, tile", [("sm_80", "64x64"), ("sm_90a", "64x64"), ("sm_90a", "shipped"),
                                          ("gfx942", "64x64")])
def test_the_simt_simulator_runs_the_hand_off_without_races(target, tile):
    """With the simulator's happens-before check (`global_races=True`): every partial a block reads, another
    wrote before a release this block acquired; on gfx942 too (MFMA, direct-to-LDS rings, 64-wide waves), where
    the op may take stream K (`gemm_configs.stream_k_tile`)."""
    out, expected, counters = simulated(target, tile=tile)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)
    assert not counters.any()


def relax_the_counter(fn):
    """The mutation: the arrival counter bumped by a plain load, add and store (what a relaxed counter without
    fences amounts to: no release of the partial, no acquire of the others')."""
    from tessera.ir.core import Operation
    (atomic,) = [op for op in fn.walk() if op.name == "atomic_rmw"]
    pointer, one, mask = atomic.operands
    block = atomic.parent
    old = Operation("load", [pointer, mask], [atomic.results[0].type], {}, loc=atomic.loc)
    new = Operation("add", [old.results[0], one], [one.type], {}, loc=atomic.loc)
    store = Operation("store", [pointer, new.results[0], mask], [], {}, loc=atomic.loc)
    at = block.ops.index(atomic)
    block.ops[at:at + 1] = [old, new, store]
    for op in (old, new, store):
        op.parent = block
    for op in fn.walk():
        op.operands = [old.results[0] if v is atomic.results[0] else v for v in op.operands]


def test_the_simulator_reports_a_relaxed_counter_as_a_race():
    with pytest.raises(InterpreterError, match=r"global-memory race: this load in block \(1, 0, 0\) touches "
                                               r"'counter_ptr' that block \(0, 0, 0\) wrote with store"):
        simulated("sm_80", relax_the_counter)


def narrow_the_counter(fn):
    """The mutation: the arrival counter's atomic at CTA scope, which orders nothing between programs."""
    atomics = [op for op in fn.walk() if op.name == "atomic_rmw"]
    assert len(atomics) == 1
    atomics[0].attrs["scope"] = "cta"


def test_the_simulator_reports_a_counter_narrowed_to_the_cta_as_a_race():
    with pytest.raises(InterpreterError, match=r"scope race: this atomic_rmw \(scope 'cta'\) in block \(\d, 0, 0\) "
                                               r"reads 'counter_ptr' that block \(\d, 0, 0\) wrote"):
        simulated("sm_80", narrow_the_counter)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_the_partials_are_published_and_acquired_around_the_counter_in_ptx(target):
    """The hand-off as compiled: the partial's st.global (sm_90a: its TMA store's full wait), a barrier and
    fence.acq_rel.gpu, the counter's atom (GPU scope), fence.acq_rel.gpu and a barrier before the partials are
    read back; no read of them goes through the non-coherent cache (ld.global.nc could serve a stale line another
    SM has since written)."""
    compiled = compile_shipped(target)
    lines = [" ".join(line.split()) for line in compiled.stages["ptx"].splitlines()]
    published = "cp.async.bulk.wait_group 0;" if target == "sm_90a" else "st.global.v4.b32"
    atom = [i for i, line in enumerate(lines) if line.startswith("atom.")]
    assert len(atom) == 1 and re.match(r"atom\.global\.add\.u32", lines[atom[0]])
    before, after = lines[:atom[0]], lines[atom[0] + 1:]
    last_fence = max(i for i, line in enumerate(before) if line == "fence.acq_rel.gpu;")
    last_barrier = max(i for i, line in enumerate(before) if line.startswith("bar.sync"))
    last_partial_store = max(i for i, line in enumerate(before) if line.startswith(published))
    assert last_partial_store < last_barrier < last_fence
    first_barrier = min(i for i, line in enumerate(after) if line.startswith("bar.sync"))
    first_partial_load = min(i for i, line in enumerate(after) if line.startswith("ld.global.v4.b32"))
    assert after.index("fence.acq_rel.gpu;") < first_barrier < first_partial_load
    assert not any(line.startswith("ld.global.nc") for line in after)


def weaken_full_waits(fn):
    """The mutation: every full wait for TMA stores (`bulk_wait_group`, cp.async.bulk.wait_group) becomes the
    read-wait (`bulk_wait_group_read`), which does not wait for their global writes."""
    from tessera.ir.core import Operation
    weakened = 0
    for old in [op for op in fn.walk() if op.name == "bulk_wait_group"]:
        new = Operation("bulk_wait_group_read", [], [], dict(old.attrs), loc=old.loc)
        new.parent = old.parent
        old.parent.ops[old.parent.ops.index(old)] = new
        weakened += 1
    assert weakened


def test_the_simulator_reports_partials_stored_by_tma_without_the_full_wait():
    """sm_90a stores the partial by TMA: weakened to the read-wait, its writes may still be under way when the
    counter publishes it (`schedule/tma_store.py`), and the last contributor's read of it is a race."""
    with pytest.raises(InterpreterError, match=r"global-memory race: this load in block \(\d, 0, 0\) touches "
                                               r"'partial_ptr' that block \(\d, 0, 0\) wrote with tma_store"):
        simulated("sm_90a", weaken_full_waits)


def test_the_sm_90a_epilogue_stores_by_tma_and_waits_in_full_before_the_counter():
    """C and the partials leave by cp.async.bulk.tensor stores; the partial's store and the counter's release are
    each preceded by thread 0's cp.async.bulk.wait_group 0 (not .read: that one waits only for the shared
    memory to be read); C, read by no op, keeps the read-wait."""
    compiled = compile_shipped("sm_90a")
    ptx = [" ".join(line.split()) for line in compiled.stages["ptx"].splitlines()]
    assert sum(line.startswith("cp.async.bulk.tensor.2d.global.shared::cta") for line in ptx) >= 3
    assert "cp.async.bulk.wait_group.read 0;" in ptx
    thread_ir = [line.strip() for line in compiled.stages["thread_ir"].splitlines()]
    (atomic,) = [i for i, line in enumerate(thread_ir) if "atomic_rmw" in line]
    last_wait = max(i for i, line in enumerate(thread_ir[:atomic]) if line.startswith("bulk_wait_group"))
    assert thread_ir[last_wait] == "bulk_wait_group {pending = 0}"
    assert [line for line in thread_ir[last_wait:atomic] if line == "barrier"], "thread 0 waits, then the block"
    full = [i for i, line in enumerate(ptx) if line == "cp.async.bulk.wait_group 0;"]
    assert len(full) == 2 and not any(line.startswith("cp.async.bulk.tensor") for line in ptx[full[1]:full[1] + 8])


# --- ptxas: the shipped config without spills ---------------------------------------------------------------

SIGNATURE = ("*{t}:16,*{t}:16,*f32:16,*f32:16,*f32:16,*bf16:16,*f32:16,*i32:16,i32:16,i32:16,i32:16,f32,"
             "i32:16,i32:1,{b},i32:16,i32")
B_ROW_MAJOR, B_TRANSPOSED = "i32:16,i32:1", "i32:1,i32:16"     # stride_bk, stride_bn


def compile_shipped(target, dtype="bf16", element_bytes=2):
    from tessera.backends.nvptx import find_ptxas
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    p = stream_k_plan(3072, 3072, 3072, element_bytes, 132, mode="1")
    # 8-bit operands must be contiguous along K: B as an [N, K] weight
    b = B_TRANSPOSED if element_bytes == 1 else B_ROW_MAJOR
    return gemm_stream_k_kernel.compile(
        signature=SIGNATURE.format(t=dtype, b=b), target=target, num_warps=p.num_warps, **NO_EPILOGUE, BM=p.BM,
        BN=p.BN, BK=p.BK, GROUP_M=p.GROUP_M, STAGES=p.STAGES)


@pytest.mark.parametrize("target,dtype,element_bytes", [("sm_80", "bf16", 2), ("sm_89", "f8e4m3", 1),
                                                        ("sm_90a", "bf16", 2), ("sm_90a", "f8e4m3", 1)])
def test_the_shipped_config_compiles_pipelined_without_spills(target, dtype, element_bytes):
    """Strict mode (tests/kernels_lib/conftest.py): both K loops get their rings (TMA and wgmma on sm_90a)."""
    from tessera.ir.target import get_target
    compiled = compile_shipped(target, dtype, element_bytes)
    metadata, ptx = compiled.metadata, compiled.stages["ptx"]
    assert metadata["spill_stores"] == metadata["spill_loads"] == 0, metadata["log"]
    assert metadata["shared_bytes"] <= get_target(target).shared_memory_bytes
    if target == "sm_90a":
        assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor.2d" in ptx and "mma.sync" not in ptx
    else:
        assert "mma.sync.aligned.m16n8k" in ptx and "cp.async.cg.shared.global" in ptx


def test_the_two_k_loops_share_one_ring_on_sm_90a():
    """The data-parallel tiles' ring (allocated in the prologue: the next tile's fills land during the epilogue)
    is live only until the tile loop ends, so the stream-K ranges' ring takes bytes it held (`persistent.py`): the
    kernel needs what its data-parallel phase needs (a ring and the epilogue's staging beside it, 160 KiB here),
    not two rings (213,016 bytes before on the shipped config's compile)."""
    from tessera.passes.thread_passes import lower
    meta = SIMULATED_TILES["shipped"][0]
    args = [np.zeros((192, 320), np.float16), np.zeros((320, 256), np.float16), *[np.zeros(1, np.float32)] * 3,
            np.zeros((192, 256), np.float32), np.zeros((768, 128), np.float32), np.zeros(4, np.int32),
            192, 256, 320, 1.0, 320, 1, 256, 1, 768, 2]
    fn = lower(gemm_stream_k_kernel.specialize(*args, **NO_EPILOGUE, **meta).module, "sm_90a", 8).functions[0]
    ring_bytes = meta["STAGES"] * meta["BM"] * meta["BK"] * 2
    rings = [op for op in fn.walk() if op.name == "shared_alloc" and op.attrs["bytes"] == ring_bytes]
    assert len(rings) == 4 and not any(op.attrs.get("whole_kernel") for op in rings)
    data_parallel, stream_k = rings[:2], rings[2:]
    end = lambda ops: max(op.attrs["offset"] + op.attrs["bytes"] for op in ops)     # noqa: E731
    assert end(stream_k) <= end(data_parallel), "the stream-K ring lies in bytes the data-parallel phase needs"
    assert fn.attrs["shared_bytes"] == end(data_parallel) + 24 < 2 * len(data_parallel) * ring_bytes   # + 3 bars


# --- the wave model and the op's choice ----------------------------------------------------------------------

def test_the_wave_model_pays_where_the_last_wave_is_nearly_empty():
    """3072^3 (576 tiles on 132 SMs, 4.36 waves): 5 waves data-parallel, 4 + 18/48 of one stream-K plus the
    partials; 2048^3 (1.94 waves) gains too little K to pay for the partials."""
    waves = modelled(3072, 3072, 3072, 2, 132, 128, 128, 64)
    assert waves.stream_k < 0.95 * waves.data_parallel
    waves = modelled(2048, 2048, 2048, 2, 132, 128, 128, 64)
    assert waves.stream_k > waves.data_parallel
    assert modelled(4224, 4096, 4096, 2, 132, 128, 128, 64).stream_k == modelled(
        4224, 4096, 4096, 2, 132, 128, 128, 64).data_parallel          # 1056 tiles: 8 whole waves


def test_a_last_wave_of_few_tiles_is_split_with_one_more_wave():
    """8192^3: 4096 tiles, 4 past 31 waves. Those 4 alone give each program 4 of 128 K steps, so a tile has 33
    contributors and its last reads 33 partials; with one more wave (136 tiles) each program gets a tile's worth
    and a tile at most 2 partials: the model picks that (CUTLASS's DP + two-tile stream-K)."""
    assert gemm_stream_k.stream_k_tiles(4096, 132) == (4, 136)
    assert gemm_stream_k.stream_k_tiles(140, 132) == (8, 140)                 # or every tile
    one, two = (modelled(8192, 8192, 8192, 2, 132, 128, 128, 64, sk) for sk in (4, 136))
    assert two.stream_k < one.stream_k < one.data_parallel
    assert stream_k_plan(8192, 8192, 8192, 2, 132, mode="1").sk_tiles == 136


def test_the_plan_needs_a_partial_last_wave_and_auto_waits_for_a_measurement(monkeypatch):
    forced = stream_k_plan(3072, 3072, 3072, 2, 132, mode="1")
    assert forced == StreamKPlan(128, 128, 64, 8, 3, 8, 132, 576 - 3 * 132)     # DP + two tiles (see below)
    assert stream_k_plan(3072, 3072, 3072, 2, 132, mode="0") is None
    assert stream_k_plan(4224, 4096, 4096, 2, 132, mode="1") is None       # whole waves
    assert stream_k_plan(1024, 1024, 4096, 2, 132, mode="1") is None       # 64 tiles: one wave (split K's)
    assert gemm_configs.awaits_measurement(gemm_configs.STREAM_K_CONFIG)
    assert stream_k_plan(3072, 3072, 3072, 2, 132) is None                 # auto, unmeasured
    monkeypatch.setattr(gemm_configs, "STREAM_K_MEASURED", True)
    assert stream_k_plan(3072, 3072, 3072, 2, 132) == forced
    assert stream_k_plan(2048, 2048, 2048, 2, 132) is None                 # the model says no
    with pytest.raises(ValueError, match=r"TESSERA_GEMM_STREAM_K must be 1 .*, 0 \(never\) or auto, got 'yes'"):
        stream_k_plan(3072, 3072, 3072, 2, 132, mode="yes")


@pytest.mark.parametrize("value, taken", [("0", False), ("", False), ("1", True)])
def test_the_env_var_decides_on_the_interpreter(value, taken, monkeypatch):
    monkeypatch.setenv(gemm_module.STREAM_K_ENV, value)
    plans = record_plans(monkeypatch)
    a, b = operands(80, 90, 40, torch.float32, seed=2)
    check(gemm_module.gemm(a, b), reference(a, b))
    assert bool(plans) == taken


def test_the_shipped_config_is_measured_only_by_a_gpu_run():
    assert gemm_configs.STREAM_K_CONFIG.kwargs["STREAM_K"] and gemm_configs.is_stream_k(gemm_configs.STREAM_K_CONFIG)
    assert not any(gemm_configs.is_stream_k(c) for c in gemm_configs.ALL), "not a config of the tiled kernel"
    assert tessera.cdiv(3072, gemm_configs.STREAM_K["BM"]) == 24
