"""The library GEMM at the metal on Hopper (issue 19), checked in the PTX and SASS ptxas makes of it.

Specification (each fact is read from the machine code of the shipped configs; the schedules themselves
run on the SIMT simulator in tests/simt and in test_gemm.py):

* prefetch depth STAGES - 1 on sm_90a: the prologue issues STAGES - 1 slots' TMA boxes before the K loop, and
  in the loop the refill (UTMALDG) comes after `wgmma.wait_group 1` (WARPGROUP.DEPBAR.LE gsb0, 0x1) and the
  barrier that follows it, with no barrier between the slot's mbarrier wait and the HGMMAs.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tessera
from tessera.backends.interp import InterpreterError
from tessera.kernels_lib.gemm import CONFIGS

from tessera.backends.nvptx.sass import disassemble

from hopper_gemm import (compile_gemm, first, last, lowered_gemm, needs_ptxas, needs_sass, ptx_lines, sass_k_loop,
                         simulate)

HOPPER_CONFIGS = {f"config{i}": c for i, c in enumerate(CONFIGS)}


def k_boxes(config, b_layout="b-row-major") -> int:
    """TMA boxes per slot fill: one per 128-byte column block of each bf16 slot row (BK for A, BN for B)."""
    bk, bn = config.kwargs["BK"], config.kwargs["BN"]
    return max(1, bk // 64) + (max(1, bk // 64) if b_layout == "b-transposed" else bn // 64)


@pytest.mark.parametrize("name", list(HOPPER_CONFIGS))
def test_the_prologue_fills_stages_minus_one_slots(name):
    needs_ptxas()
    config = HOPPER_CONFIGS[name]
    ptx = compile_gemm(config).stages["ptx"]
    loop_wait = ptx_lines(ptx, r"mbarrier\.try_wait")[0]
    prologue = [i for i in ptx_lines(ptx, r"cp\.async\.bulk\.tensor\.2d") if i < loop_wait]
    assert len(prologue) == (config.kwargs["STAGES"] - 1) * k_boxes(config)


@pytest.mark.parametrize("name", list(HOPPER_CONFIGS))
def test_the_refill_follows_the_wait_for_the_previous_wgmma_group(name):
    needs_sass()
    loop = sass_k_loop(compile_gemm(HOPPER_CONFIGS[name]))
    depbar = next(i for i, inst in enumerate(loop) if re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1\b", inst.text))
    barrier, refill = first(loop, "BAR.SYNC"), first(loop, "UTMALDG")
    assert last(loop, "HGMMA") < depbar < barrier < refill, [i.text for i in loop]
    assert first(loop, "SYNCS.PHASECHK") < first(loop, "HGMMA") < barrier     # no barrier before the wgmmas


# -- warp specialization (fact 5) ----------------------------------------------------------------------------

WS_CONFIGS = {name: c for name, c in HOPPER_CONFIGS.items() if not c.kwargs["PERSISTENT"]}


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
    fn, args, expected, grid = lowered_gemm(M, N, K, small(HOPPER_CONFIGS[name], WS=True), trans_b=trans_b)
    assert fn.attrs["num_threads"] == HOPPER_CONFIGS[name].num_warps * 32 + 128
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
