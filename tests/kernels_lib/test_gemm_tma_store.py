"""The library GEMM's epilogue on TMA targets (issue 19): C goes registers -> shared memory -> one TMA store.

Specification (`passes/schedule/tma_store.py`):

* on sm_90a every shipped config stores C with one cp.async.bulk.tensor ... global.shared::cta ... bulk_group,
  after the threads' st.shared, fence.proxy.async and a barrier, followed by commit_group and
  wait_group.read 0; no thread stores C to global memory itself; ptxas spills nothing and the shared memory
  (ring + C buffer) fits in 227 KiB;
* sm_80 keeps the threads' st.global (no TMA there);
* the store clips at the matrix edges: on the SIMT simulator a GEMM whose M and N are not multiples of the
  tile writes what the tile interpreter writes (to f32 rounding of the sums' order), every element of C.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.kernels_lib.gemm import CONFIGS, HOPPER_CONFIGS, gemm_kernel
from tessera.passes.thread_passes import lower

from hopper_gemm import NO_EPILOGUE, compile_gemm, needs_ptxas

SHIPPED = {**{f"config{i}": c for i, c in enumerate(CONFIGS)}, **{f"hopper{i}": c for i, c in enumerate(HOPPER_CONFIGS)}}
TMA_STORE = r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.tile\.bulk_group \[%rd\d+, \{%r\d+, %r\d+\}\]"


@pytest.mark.parametrize("name", SHIPPED)
def test_sm_90a_stores_c_with_one_tma_store_and_no_thread_global_stores(name):
    needs_ptxas()
    compiled = compile_gemm(SHIPPED[name], target="sm_90a")
    ptx = compiled.stages["ptx"]
    stores = [m.start() for m in re.finditer(TMA_STORE, ptx)]
    assert len(stores) == 1
    assert "st.global" not in ptx
    fence = ptx.rindex("fence.proxy.async.shared::cta", 0, stores[0])
    assert re.search(r"st\.shared\.v\d", ptx[:fence])            # the tile reaches shared memory vectorized
    assert "bar.sync" in ptx[fence:stores[0]]
    commit = ptx.index("cp.async.bulk.commit_group;", stores[0])
    assert re.search(r"cp\.async\.bulk\.wait_group\.read\s+0;", ptx[commit:])
    assert compiled.metadata["spill_stores"] == 0
    assert compiled.metadata["shared_bytes"] <= 227 * 1024


def test_sm_80_keeps_the_threads_global_stores():
    compiled = compile_gemm(CONFIGS[0], target="sm_80")
    ptx = compiled.stages["ptx"]
    assert "st.global" in ptx and "cp.async.bulk" not in ptx


def _gemm_args(M, N, K, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    unused = np.zeros(1, np.float32)
    c = np.full((M, N), np.nan, np.float32)
    return [a, b, unused, unused, unused, c, M, N, K, 1.0, K, 1, N, 1]


@pytest.mark.parametrize("name, M, N, K", [("config3", 160, 96, 64), ("config0", 192, 160, 128),
                                           ("config5", 320, 144, 64), ("hopper0", 160, 272, 64)])
def test_a_gemm_with_ragged_m_and_n_stores_what_the_interpreter_stores_on_the_simt_simulator(name, M, N, K):
    config = SHIPPED[name]
    bm, bn = config.kwargs["BM"], config.kwargs["BN"]
    assert M % bm and N % bn                         # the last row and column of tiles hang over the edges
    args = _gemm_args(M, N, K)
    module = gemm_kernel.kernel.specialize(*args, **{**NO_EPILOGUE, **config.kwargs}).module
    fn = lower(module, "sm_90a", config.num_warps).functions[0]
    assert [op.name for op in fn.walk()].count("tma_store") == 1
    tiles = -(-M // bm) * -(-N // bn)
    run_threads(fn, args, (min(tiles, 2),) if config.kwargs["PERSISTENT"] else (tiles,))
    want = _gemm_args(M, N, K)
    run_function(module.functions[0], want, (tiles,))
    assert not np.isnan(args[5]).any()               # every element written
    # the same sums, in the tensor cores' order on the simulator and the interpreter's: f32 rounding apart
    np.testing.assert_allclose(args[5], want[5], rtol=1e-5, atol=1e-4)

