"""The library GEMM at the metal on Hopper (issue 19), checked in the PTX and SASS ptxas makes of it.

Specification (each fact is read from the machine code of the shipped configs; the schedules themselves
run on the SIMT simulator in tests/simt and in test_gemm.py):

* prefetch depth STAGES - 1 on sm_90a: the prologue issues STAGES - 1 slots' TMA boxes before the K loop, and
  in the loop the refill (UTMALDG) comes after `wgmma.wait_group 1` (WARPGROUP.DEPBAR.LE gsb0, 0x1) and the
  barrier that follows it, with no barrier between the slot's mbarrier wait and the HGMMAs.
"""

from __future__ import annotations

import re

import pytest

from tessera.kernels_lib.gemm import CONFIGS

from hopper_gemm import compile_gemm, first, last, needs_ptxas, needs_sass, ptx_lines, sass_k_loop

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
