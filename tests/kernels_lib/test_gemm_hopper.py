"""The library GEMM at the metal on Hopper (issue 19), checked in the PTX and SASS ptxas makes of it.

Specification (each fact is read from the machine code of the shipped configs; the schedules themselves
run on the SIMT simulator in tests/simt and in test_gemm.py):

* prefetch depth STAGES - 1 on sm_90a: the prologue issues STAGES - 1 slots' TMA boxes before the K loop, and
  in the loop the refill (UTMALDG) comes after `wgmma.wait_group 1` (WARPGROUP.DEPBAR.LE gsb0, 0x1) and the
  barrier that follows it, with no barrier between the slot's mbarrier wait and the HGMMAs;
* warp specialization: the consumers wait with `wgmma.wait_group 1`, then one thread per consumer warpgroup
  releases the previous slot (empty mbarriers count warpgroups); the producer's registers go to the
  consumers (setmaxnreg, USETMAXREG in SASS); on the simulator the schedule equals numpy, and dropping the
  wait is reported;
* 128 x 256 and 256 x 128 tiles (the sm_90 configs of gemm_configs.json, which the autotuner keeps only on
  sm_90 GPUs): one HGMMA 64x256x16, or two 64x128x16, per K slice and warpgroup, two consumer warpgroups, no
  spills, equal to numpy on the simulator, with and without warp specialization;
* the persistent config: its tiles share the K loop's mbarriers, initialized once before the tile loop (no
  SYNCS.EXCH in it), and the next tile's first fills (UTMALDG) are issued before the epilogue's stores; on
  the simulator tiles that start mid-ring compute what numpy does, and restarting the phases per tile or
  dropping the carried-over fills is reported;
* the K loop's descriptors: the slot's descriptor plus constants, no 64-bit shifts or wide multiplies in the
  loop, whose SASS length stays within a recorded ceiling;
* fast math: the op runs `gemm_kernel_fast` where the output's precision hides it; its FMA-path K loop is all
  FFMA (the exact kernel's is FMUL + FADD), its silu epilogue divides approximately.
"""

from __future__ import annotations

import importlib
import re

import numpy as np
import pytest

import tessera
from tessera.backends.interp import InterpreterError
from tessera.kernels_lib import gemm_configs
from tessera.kernels_lib.gemm import CONFIGS, HOPPER_CONFIGS, gemm_kernel, gemm_kernel_fast

torch = pytest.importorskip("torch")
gemm_module = importlib.import_module("tessera.kernels_lib.gemm")

from tessera.backends.nvptx.sass import disassemble, loop_containing

from hopper_gemm import (compile_gemm, compile_signature, first, last, lowered_gemm, needs_ptxas, needs_sass,
                         opcode_counts, ptx_lines, sass_k_loop, simulate)
from sass_checks import assert_wgmma_descriptors_built

# (the cluster-multicast configs, CLUSTER_M, have their own facts: test_gemm_cluster.py; the persistent
# warp-specialized one, whose producer warpgroup fills the ring, test_gemm_persistent_ws.py)
SHIPPED = {**{f"config{i}": c for i, c in enumerate(CONFIGS)},
           **{f"hopper{i}": c for i, c in enumerate(HOPPER_CONFIGS)
              if not gemm_configs.awaits_measurement(c)}}


def k_boxes(config, b_layout="b-row-major") -> int:
    """TMA boxes per slot fill: one per 128-byte column block of each bf16 slot row (BK for A, BN for B)."""
    bk, bn = config.kwargs["BK"], config.kwargs["BN"]
    return max(1, bk // 64) + (max(1, bk // 64) if b_layout == "b-transposed" else bn // 64)


@pytest.mark.parametrize("name", list(SHIPPED))
def test_the_prologue_fills_stages_minus_one_slots(name):
    needs_ptxas()
    config = SHIPPED[name]
    ptx = compile_gemm(config).stages["ptx"]
    loop_wait = ptx_lines(ptx, r"mbarrier\.try_wait")[0]
    prologue = [i for i in ptx_lines(ptx, r"cp\.async\.bulk\.tensor\.2d") if i < loop_wait]
    assert len(prologue) == (config.kwargs["STAGES"] - 1) * k_boxes(config)


@pytest.mark.parametrize("name", list(SHIPPED))
def test_the_refill_follows_the_wait_for_the_previous_wgmma_group(name):
    needs_sass()
    loop = sass_k_loop(compile_gemm(SHIPPED[name]))
    depbar = next(i for i, inst in enumerate(loop) if re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1\b", inst.text))
    barrier, refill = first(loop, "BAR.SYNC"), first(loop, "UTMALDG")
    assert last(loop, "HGMMA") < depbar < barrier < refill, [i.text for i in loop]
    assert first(loop, "SYNCS.PHASECHK") < first(loop, "HGMMA") < barrier     # no barrier before the wgmmas


# -- warp specialization (fact 5) ----------------------------------------------------------------------------

WS_CONFIGS = {name: c for name, c in SHIPPED.items() if not c.kwargs["PERSISTENT"]}


@pytest.mark.parametrize("name", list(WS_CONFIGS))
def test_ws_consumers_keep_a_group_in_flight_and_arrive_once_per_warpgroup(name):
    """The consumers' loop waits with `wgmma.wait_group 1` and only then releases a slot (the previous one):
    its empty mbarriers count one arrival per consumer warpgroup, and the arrive runs on one thread of each."""
    needs_sass()
    config = WS_CONFIGS[name]
    compiled = compile_gemm(config, WS=True)
    ptx = compiled.stages["ptx"]
    stages, warpgroups = config.kwargs["STAGES"], config.num_warps // 4
    consts = dict(re.findall(r"mov\.b32\s+(%r\d+),\s*(\d+);", ptx))
    counts = [int(consts.get(c, c)) for c in re.findall(r"mbarrier\.init\.shared\.b64\s+\[[^\]]+\],\s*(%r\d+|\d+);", ptx)]
    assert sorted(counts) == sorted([1] * stages + [warpgroups] * stages), counts      # full[], empty[]
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx)
    loop = sass_k_loop(compiled)
    depbar = next(i for i, inst in enumerate(loop) if re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1\b", inst.text))
    arrive = [i for i, inst in enumerate(loop) if inst.opcode.startswith("SYNCS.ARRIVE")]
    assert len(arrive) == 1 and last(loop, "HGMMA") < depbar < arrive[0], [i.text for i in loop]
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x0" not in " ".join(i.text for i in loop)


def test_ws_with_eight_warps_hands_the_producer_registers_to_the_consumers():
    needs_sass()
    compiled = compile_gemm(CONFIGS[0], WS=True)
    ptx = compiled.stages["ptx"]
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+40;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232;", ptx)
    sass = [i.text for i in disassemble(compiled.cubin)]
    assert sum("USETMAXREG.DEALLOC" in t for t in sass) == 1 and sum("USETMAXREG" in t for t in sass) == 2
    assert "C7508" not in compiled.metadata["log"]          # ptxas did not ignore setmaxnreg


def small(config, **changes):
    """`config` with BK = 32 (short simulations) and `changes`."""
    return tessera.Config({**config.kwargs, "BK": 32, **changes}, num_warps=config.num_warps)


@pytest.mark.parametrize("name, M, N, K, trans_b", [
    ("config0", 131, 128, 224, False),      # two consumer warpgroups, 128 x 128, odd M
    ("config2", 64, 96, 160, True),         # one consumer warpgroup, B transposed
])
def test_ws_gemm_with_a_group_in_flight_matches_numpy_on_the_simt_simulator(name, M, N, K, trans_b):
    fn, args, expected, grid = lowered_gemm(M, N, K, small(SHIPPED[name], WS=True), trans_b=trans_b)
    assert fn.attrs["num_threads"] == SHIPPED[name].num_warps * 32 + 128
    np.testing.assert_allclose(simulate(fn, args, grid), expected, rtol=1e-4, atol=1e-3)


def consumer_loop(fn):
    """The consumers' K loop (the `for` holding the wgmmas)."""
    return next(op for op in fn.walk() if op.name == "for" and any(o.name == "wgmma" for o in op.regions[0].ops))


def test_ws_releasing_slots_without_the_wgmma_wait_is_reported():
    # without wait_group 1 in the consumers' loop the releases free slots whose wgmmas never retired: the
    # producer refills them under the running wgmmas
    fn, args, _, grid = lowered_gemm(128, 128, 224, small(CONFIGS[0], WS=True))
    body = consumer_loop(fn).regions[0].ops
    body.remove(next(op for op in body if op.name == "wgmma_wait"))
    with pytest.raises(InterpreterError, match="written while it was in flight"):
        simulate(fn, args, grid)


# -- fast math (fact 7) --------------------------------------------------------------------------------------

F32 = "*f32:16,*f32:16,*f32:16,*f32:16,*f32:16,*f32:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,i32:16,i32:1"
BF16 = "*bf16:16,*bf16:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,i32:16,i32:1"


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_the_fast_kernel_contracts_the_fma_path_dot_into_ffma(target):
    """float32 inputs run the dot on FMA (no tf32 asked): exact, its K loop multiplies and adds separately;
    compiled with fast math, every product is fused into its sum (fma.rn.f32 in PTX, FFMA in SASS)."""
    needs_sass()
    config = CONFIGS[3]
    # (strict=False: an FMA-path dot has no tensor-core operands to pipeline, which strict mode refuses)
    exact = compile_signature(gemm_kernel.kernel, config, F32, target, HAS_BIAS=True, strict=False)
    fast = compile_signature(gemm_kernel_fast.kernel, config, F32, target, HAS_BIAS=True, strict=False)
    assert "fma.rn.f32" not in exact.stages["ptx"] and "fma.rn.f32" in fast.stages["ptx"]
    exact_loop = opcode_counts(loop_containing(disassemble(exact.cubin), "FMUL"))
    fast_loop = opcode_counts(loop_containing(disassemble(fast.cubin), "FFMA"))
    assert exact_loop.get("FFMA", 0) == 0 and exact_loop["FMUL"] == exact_loop["FADD"] > 0, exact_loop
    assert fast_loop["FFMA"] == exact_loop["FMUL"] and "FMUL" not in fast_loop and "FADD" not in fast_loop
    assert fast.metadata["spill_stores"] == 0


def test_the_fast_kernel_approximates_the_silu_epilogue():
    needs_ptxas()
    exact = compile_signature(gemm_kernel.kernel, CONFIGS[0], BF16, ACTIVATION="silu").stages["ptx"]
    fast = compile_signature(gemm_kernel_fast.kernel, CONFIGS[0], BF16, ACTIVATION="silu").stages["ptx"]
    assert "rcp.rn.f32" in exact and "rcp.rn.f32" not in fast and "__nv_expf" not in fast
    assert re.search(r"(div\.approx|div\.full|rcp\.approx)[.\w]*\.f32", fast)


@pytest.mark.parametrize("out_dtype, activation, fast", [
    (torch.bfloat16, "gelu", True), (torch.float16, "silu", True), (torch.float32, "none", True),
    (torch.float32, "relu", True), (torch.float32, "gelu", False), (torch.float32, "silu", False)])
def test_the_op_uses_fast_math_only_where_the_output_hides_it(out_dtype, activation, fast):
    assert gemm_module._fast_math_allows(out_dtype, activation) == fast
    assert gemm_kernel_fast.kernel.fast_math and not gemm_kernel.kernel.fast_math
    assert gemm_kernel_fast.tuner.configs == gemm_kernel.tuner.configs == gemm_configs.ALL


# -- 128 x 256 tiles, configs per GPU (facts 2 and 8) ---------------------------------------------------------

@pytest.mark.parametrize("name", [name for name in SHIPPED if name.startswith("hopper")])
def test_hopper_configs_run_128_by_256_and_256_by_128_tiles_on_two_consumer_warpgroups(name):
    """128 x 256: one HGMMA 64x256x16 per K slice and warpgroup (each its own 64 rows); 256 x 128: two HGMMA
    64x128x16 per K slice and warpgroup (each its own 128 rows)."""
    needs_sass()
    config = SHIPPED[name]
    compiled = compile_gemm(config)
    meta = compiled.metadata
    assert meta["spill_stores"] == meta["spill_loads"] == 0 and meta["registers"] <= 255
    assert meta["shared_bytes"] <= 227 * 1024
    loop = sass_k_loop(compiled)
    hgmma = [i.opcode for i in loop if i.opcode.startswith("HGMMA")]
    BM, BN = config.kwargs["BM"], config.kwargs["BN"]
    assert (BM, BN, config.num_warps) in ((128, 256, 8), (256, 128, 8))
    assert hgmma and all(op.startswith(f"HGMMA.64x{BN}x16.F32.BF16") for op in hgmma)
    assert len(hgmma) == config.kwargs["BK"] // 16 * (BM // 128)      # per K slice: the warpgroup's 64-row blocks
    assert_wgmma_descriptors_built(compiled)                            # each warpgroup's A descriptor whole


@pytest.mark.parametrize("ws", [False, True], ids=["pipelined", "warp-specialized"])
def test_a_128_by_256_tile_matches_numpy_on_the_simt_simulator(ws):
    fn, args, expected, grid = lowered_gemm(131, 250, 96, small(HOPPER_CONFIGS[0], WS=ws))
    assert {op.attrs["n"] for op in fn.walk() if op.name == "wgmma"} == {256}
    np.testing.assert_allclose(simulate(fn, args, grid), expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("ws", [False, True], ids=["pipelined", "warp-specialized"])
def test_a_256_by_128_tile_matches_numpy_on_the_simt_simulator(ws):
    """Two consumer warpgroups of 128 rows each (two m64 wgmmas per K slice, both fragments left in flight
    across iterations: wait_group 1), odd M past the first warpgroup's rows, N over two column tiles (the
    second partial; rows of 144 elements, a multiple of 16, so both operands ride the rings)."""
    tall = next(c for c in HOPPER_CONFIGS if c.kwargs["BM"] == 256)
    fn, args, expected, grid = lowered_gemm(197, 144, 128, small(tall, WS=ws))
    assert {op.attrs["n"] for op in fn.walk() if op.name == "wgmma"} == {128}
    assert 1 in {op.attrs["pending"] for op in fn.walk() if op.name == "wgmma_wait"}
    np.testing.assert_allclose(simulate(fn, args, grid), expected, rtol=1e-4, atol=1e-3)


class _Device:
    type = "cuda"


class _Tensor:
    device = _Device()


@pytest.mark.parametrize("capability, hopper", [((9, 0), True), ((8, 0), False), ((8, 9), False), (None, False)])
def test_the_autotuner_keeps_the_configs_shipped_for_the_launching_gpu(monkeypatch, capability, hopper):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    args = {"a_ptr": _Tensor() if capability else np.zeros(1), "M": 64}
    kept = gemm_configs.prune_for_device(list(gemm_configs.ALL), args)
    assert kept == CONFIGS + (HOPPER_CONFIGS if hopper else [])
    assert gemm_kernel.tuner.prune is gemm_kernel_fast.tuner.prune is gemm_configs.prune_for_device


# -- the persistent kernel (fact 4) -------------------------------------------------------------------------

PERSISTENT = CONFIGS[5]


@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
def test_the_persistent_kernel_initializes_its_mbarriers_once(target):
    """The tile loop holds no mbarrier init (SYNCS.EXCH) and no invalidation: the slots' mbarriers are set up
    once, before it, and their phases run on from tile to tile."""
    needs_sass()
    assert PERSISTENT.kwargs["PERSISTENT"]
    compiled = compile_gemm(PERSISTENT, target=target)
    ptx = compiled.stages["ptx"]
    assert ptx.count("mbarrier.init") == PERSISTENT.kwargs["STAGES"] and "mbarrier.inval" not in ptx
    code = disassemble(compiled.cubin)
    tiles = loop_containing(code, "HGMMA" if target == "sm_90a" else "HMMA", outermost=True)
    inits = [i.address for i in code if i.opcode.startswith("SYNCS.EXCH")]
    assert len(inits) == PERSISTENT.kwargs["STAGES"] and max(inits) < tiles[0].address
    assert not any(i.opcode.startswith("SYNCS.EXCH") for i in tiles)


@pytest.mark.parametrize("name, M, N, K", [
    ("three-tiles-per-program", 200, 256, 160),     # 5 K steps through 3 stages: tiles start mid-ring
    ("one-k-step", 256, 384, 32),
])
def test_persistent_tiles_share_the_ring_on_the_simt_simulator(name, M, N, K):
    fn, args, expected, grid = lowered_gemm(M, N, K, small(PERSISTENT))
    np.testing.assert_allclose(simulate(fn, args, grid), expected, rtol=1e-4, atol=1e-3)


def test_restarting_the_phases_each_tile_is_reported():
    # the K loop's carried slot and phase start from 0 in every tile, as with per-tile mbarriers
    fn, args, _, grid = lowered_gemm(200, 256, 160, small(PERSISTENT))
    tiles = next(op for op in fn.body.ops if op.name == "for")
    k_loop = next(op for op in tiles.regions[0].ops if op.name == "for" and op.attrs.get("stages"))
    zero = next(op for op in fn.walk() if op.name == "constant" and op.attrs["value"] == 0 and
                op.result.type == k_loop.operands[-1].type).result
    k_loop.operands[-2] = k_loop.operands[-1] = zero
    with pytest.raises(InterpreterError, match="phase error|DEADLOCK|shared-memory race"):
        simulate(fn, args, grid)


@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
def test_the_next_tiles_loads_are_issued_before_the_epilogue(target):
    """In the tile loop, after the K loop (the innermost loop with the matrix instructions) and before the
    epilogue's global store (the TMA store of C, UTMASTG: `passes/schedule/tma_store.py`), thread 0 starts the
    next tile's first STAGES - 1 fills (UTMALDG), so they land while the epilogue runs; the K loop's own
    prologue runs for the program's first tile only."""
    needs_sass()
    compiled = compile_gemm(PERSISTENT, target=target)
    code = disassemble(compiled.cubin)
    mma = "HGMMA" if target == "sm_90a" else "HMMA"
    tiles, k_loop = loop_containing(code, mma, outermost=True), loop_containing(code, mma)
    after_k = [i for i in tiles if i.address > k_loop[-1].address]
    assert first(after_k, "STG") == -1
    first_store = first(after_k, "UTMASTG")
    assert first_store > 0 and first(after_k, "UTMALDG") < first_store
    boxes = k_boxes(PERSISTENT) if target == "sm_90a" else 2     # mma.sync slots: one box per load
    assert sum(i.opcode.startswith("UTMALDG") for i in after_k[:first_store]) == (PERSISTENT.kwargs["STAGES"] - 1) * boxes
    assert compiled.metadata["shared_bytes"] <= 227 * 1024 and compiled.metadata["spill_stores"] == 0


def test_a_persistent_tile_without_the_fills_its_predecessor_issued_deadlocks():
    fn, args, _, grid = lowered_gemm(200, 256, 160, small(PERSISTENT))
    tiles = next(op for op in fn.body.ops if op.name == "for")
    ops = tiles.regions[0].ops
    k_loop = next(i for i, op in enumerate(ops) if op.name == "for")
    prefetch = [op for op in ops[k_loop + 1:] if op.name == "if" and any(o.name == "tma_load" for o in op.walk())]
    assert len(prefetch) == PERSISTENT.kwargs["STAGES"] - 1
    for op in prefetch:
        ops.remove(op)
    with pytest.raises(InterpreterError, match="DEADLOCK"):
        simulate(fn, args, grid)


# -- the K loop's own instructions (fact 8) -------------------------------------------------------------------

# SASS instructions in the K loop (refill branch included) with ptxas 13.0, after descriptors moved to integer
# adds on a descriptor of the ring and the warpgroup index to a warp-uniform shuffle (was 134 / 122 / 139 / 161
# for config0 / config2 / config5 / hopper0); the ceilings leave 5% for other ptxas versions.
LOOP_INSTRUCTIONS = {"config0": 90, "config1": 81, "config2": 89, "config3": 75, "config4": 82, "config5": 96,
                     "hopper0": 119, "hopper1": 119, "hopper2": 109}


@pytest.mark.parametrize("name", list(SHIPPED))
def test_wgmma_descriptors_in_the_k_loop_take_no_64_bit_pointer_arithmetic(name):
    """Each K slice's descriptor is the slot's descriptor plus a constant in its start-address field, and the
    warpgroup's slab offset is warp-uniform: no 64-bit shift (SHF/USHF .U64) or wide multiply and no move
    from vector to uniform registers (R2UR) is left in the loop, and the loop stays within its count."""
    needs_sass()
    loop = sass_k_loop(compile_gemm(SHIPPED[name]))
    wide = [i.text for i in loop if ".U64" in i.opcode or ".WIDE" in i.opcode]
    assert not wide, wide
    assert not any(i.opcode.startswith("R2UR") for i in loop)     # descriptors stay in uniform registers
    assert len(loop) <= LOOP_INSTRUCTIONS[name] * 1.05, len(loop)
