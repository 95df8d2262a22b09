"""Warp-specialized pipelines to PTX: the compiled kernel launches its producer warpgroup too, and assembles.

Specification: a `tessera.pipeline(..., warp_specialize=True)` matmul compiled for sm_90 (4 consumer warps)
and for sm_90a (8 consumer warps, with setmaxnreg) has `.maxntid` = num_warps * 32 + 128, and so do the
metadata, the launcher's block and the autotuner's register budget; the PTX holds the TMA loads, the
mbarrier waits and arrivals, and the named barriers of the consumers (bar.sync 1, C) and of all threads
(bar.sync 2, C + 128); ptxas assembles it without spilling and honours setmaxnreg.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tessera.backends.nvptx import find_ptxas
from tessera.dsl.compiler import compile_tile_module
from tessera.ir.target import get_target
from tessera.runtime.autotune import resource_problems
from tessera.runtime.launcher import KernelBinary

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "passes"))
from ws_pipeline_kernels import ws_matmul_case  # noqa: E402

HAS_PTXAS = find_ptxas() is not None


@pytest.mark.parametrize("target, num_warps, block, stages, setmaxnreg", [
    ("sm_90", 4, (64, 64), 3, None),
    ("sm_90", 4, (64, 64), 4, None),
    ("sm_90a", 8, (32, 128), 3, (40, 232)),
])
def test_ws_matmul_assembles_without_spills_and_launches_its_producer(target, num_warps, block, stages, setmaxnreg):
    threads = 32 * num_warps + 128
    compiled = compile_tile_module(ws_matmul_case(130, 96, 208, *block, 64, stages).module, target=target,
                                   num_warps=num_warps)
    ptx = compiled.stages["ptx"]
    assert re.search(rf"\.maxntid {threads}\b", ptx)
    assert compiled.metadata["num_threads"] == threads and KernelBinary.of(compiled).num_threads == threads
    assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes") == 2
    assert "mbarrier.arrive.expect_tx.shared.b64" in ptx and "mbarrier.try_wait.parity.shared.b64" in ptx
    assert re.search(r"mbarrier\.arrive\.shared\.b64", ptx)
    assert re.search(rf"bar\.sync\s+1, {threads - 128};", ptx) and re.search(rf"bar\.sync\s+2, {threads};", ptx)
    found = re.findall(r"setmaxnreg\.(dec|inc)\.sync\.aligned\.u32\s+(\d+);", ptx)
    assert found == ([("dec", str(setmaxnreg[0])), ("inc", str(setmaxnreg[1]))] if setmaxnreg else [])
    if HAS_PTXAS:
        meta = compiled.metadata
        assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0
        assert "ignored" not in meta["log"]
        assert meta["registers"] * threads <= 65536
        assert resource_problems(meta, get_target(target)) == []
