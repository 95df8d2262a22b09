"""The warp-specialized GEMM (`tests/backends/ws_gemm_programs.py`: a TMA producer warpgroup and two wgmma
consumer warpgroups around an S-stage mbarrier ring) runs in the SIMT simulator, whose path scheduler lets the
producer and the consumers take turns: it equals numpy on sizes that are not multiples of the boxes (TMA zero
fill), and each classic mistake is reported instead of computing garbage or hanging."""

import sys
from pathlib import Path

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError

from tessera.backends.simt import run_threads
from tessera.ir import dtypes as dt
from tessera.ir.parser import parse_module
from tessera.ir.verifier import verify_module
from tessera.runtime.tensor_map import TensorMapDescription

sys.path.insert(0, str(Path(__file__).parents[1] / "backends"))
from ws_gemm_programs import BLOCK_K, BLOCK_M, ws_gemm  # noqa: E402


def operands(m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    a = dt.bf16.quantize(rng.standard_normal((m, k)).astype(np.float32))
    bt = dt.bf16.quantize(rng.standard_normal((n, k)).astype(np.float32))
    return a, bt


def simulate(text, a, bt, bn=64):
    (m, k), n = a.shape, bt.shape[0]
    maps = [TensorMapDescription.for_array(dt.bf16.encode(x).astype(np.uint16), (rows, BLOCK_K), dtype=dt.bf16,
                                           swizzle="128B") for x, rows in ((a, BLOCK_M), (bt, bn))]
    c = np.full((m, n), np.nan, np.float32)
    module = parse_module(text)
    verify_module(module)
    run_threads(module.functions[0], [*maps, c, m, n, k], grid=(-(-m // BLOCK_M), -(-n // bn)))
    return c


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("m, n, k", [(200, 100, 328), (128, 64, 64)])
def test_warp_specialized_gemm_equals_numpy(stages, m, n, k):
    a, bt = operands(m, n, k)
    c = simulate(ws_gemm(stages), a, bt)
    expected = a.astype(np.float64) @ bt.astype(np.float64).T
    # f32 accumulation, one rounding per k step: a few ulps of the running sums
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-4 * np.sqrt(k))


def test_producer_that_refills_without_waiting_for_the_consumers_is_a_race():
    a, bt = operands(128, 64, 328)   # 6 K steps through 2 stages: stages are refilled
    with pytest.raises(InterpreterError, match=r"op 'tma_load'.*race: the tma_load overwrites bytes in use: thread 0 "
                                               r"writes shared byte \d+, which a wgmma of warpgroup 1 read"):
        simulate(ws_gemm(2, empty_wait=False), a, bt)


def test_producer_waiting_for_a_release_that_never_happened_deadlocks():
    a, bt = operands(128, 64, 328)
    with pytest.raises(InterpreterError) as info:
        simulate(ws_gemm(2, producer_first_parity=0), a, bt)
    message = str(info.value)
    assert "DEADLOCK: no thread of the block can make progress" in message
    assert "thread 0 waits: mbarrier_wait on the mbarrier at shared byte 49168 for phase 0 (parity 0)" in message
    assert "0 of 256 arrivals seen" in message                  # empty[0]: no consumer has released it
    assert "threads 128..383 wait: mbarrier_wait on the mbarrier at shared byte 49152" in message   # full[0]


def test_missing_expect_tx_deadlocks_with_the_surplus_bytes_named():
    a, bt = operands(128, 64, 328)
    with pytest.raises(InterpreterError, match=r"(?s)DEADLOCK.*threads 128\.\.383 wait: mbarrier_wait on the "
                                               r"mbarrier at shared byte 49152 for phase 0.*0 of 1 arrivals seen, "
                                               r"24576 more transaction bytes delivered than announced"):
        simulate(ws_gemm(2, expect_tx=False), a, bt)
