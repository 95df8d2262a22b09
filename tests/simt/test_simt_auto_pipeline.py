"""A Triton-style matmul with a plain `range` K loop, pipelined by the compiler, on the SIMT simulator.

Specification: `plain_matmul` (no `tessera.pipeline`) lowered for sm_80 (a
cp.async ring read by ldmatrix into mma.sync) and for sm_90a (a TMA ring
read by wgmma, one group in flight) is pipelined, and computes on the SIMT
simulator what the tile interpreter computes, with the simulator's ring
checks on, at a size whose K loop wraps the three-slot ring (5 iterations)
and whose M is not a multiple of the block.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from auto_pipeline_kernels import matmul_args, plain_matmul  # noqa: E402


@pytest.mark.parametrize("target,fill", [("sm_80", "async_copy"), ("sm_90a", "tma_load")])
def test_auto_pipelined_range_loop_matches_the_tile_interpreter(target, fill):
    M, N, K = 61, 64, 160
    blocks = dict(BM=64, BN=64, BK=32)
    module = plain_matmul.specialize(*matmul_args(M, N, K), **blocks).module
    fn = lower(module, target, 4).functions[0]
    loop = next(op for op in fn.walk() if op.name == "for")
    assert loop.attrs.get("stages") == 3 and any(op.name == fill for op in fn.walk())
    expected, actual = matmul_args(M, N, K), matmul_args(M, N, K)
    run_function(module.functions[0], expected, (1, 1))
    run_threads(fn, actual, (1, 1))
    np.testing.assert_array_equal(actual[2], expected[2])
    a, b = expected[0].astype(np.float32), expected[1].astype(np.float32)
    np.testing.assert_array_equal(expected[2], (a @ b).astype(np.float16))     # small integers: exact
