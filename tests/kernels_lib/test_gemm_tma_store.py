"""The library GEMM's epilogue on TMA targets (issue 19): C goes registers -> shared memory -> one TMA store.

Specification (`passes/schedule/tma_store.py`):

* on sm_90a every shipped config stores C with one cp.async.bulk.tensor ... global.shared::cta ... bulk_group,
  after the threads' st.shared, fence.proxy.async and a barrier, followed by commit_group and
  wait_group.read 0; no thread stores C to global memory itself; ptxas spills nothing and the shared memory
  (ring + C buffer) fits in 227 KiB;
* the kernel's hidden tensor maps, and so what its launcher builds, are exactly A's and B's (read by the K
  loop's TMA loads) and C's (written by the store); where C's rows are not provably 16-byte aligned the
  epilogue keeps the threads' stores and there is no map of C;
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
from tma_maps import launcher_map_uses, maps_by_use

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
    assert maps_by_use(ptx, compiled.metadata["tensor_maps"]) == {"load": ["a_ptr", "b_ptr"], "store": ["c_ptr"]}


# B stored transposed ([N, K], rows of K elements), so B's rows stay 16-byte aligned when N is not
UNALIGNED_N = "*bf16:16,*bf16:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,i32:16,i32,i32:16,f32,i32:16,i32:1,i32:1,i32:16"


def test_the_launcher_builds_the_maps_of_the_tma_loads_and_of_c_only_when_c_is_stored_by_tma():
    """What `test_gemm_tma_on_gpu.py` checks of the launchers on a GPU, here on launchers built (not loaded)
    from CPU compiles: N a multiple of 16 gives A's, B's and C's maps; N of unknown alignment leaves C to
    the threads' stores (its rows may not start 16-byte aligned, which TMA needs), so only A's and B's."""
    from tessera.dsl.gpu_launch import launch_parameters
    from tessera.ir import dtypes as dt
    from tessera.ir.types import PointerType, ScalarType
    from tessera.runtime.launcher import Launcher

    needs_ptxas()
    aligned = compile_gemm(CONFIGS[0], target="sm_90a", b_layout="b-transposed")
    unaligned = gemm_kernel.kernel.compile(signature=UNALIGNED_N, target="sm_90a", num_warps=CONFIGS[0].num_warps,
                                           **NO_EPILOGUE, **CONFIGS[0].kwargs)
    uses = []
    for compiled in (aligned, unaligned):
        names = ["a_ptr", "b_ptr", "bias_ptr", "scale_a_ptr", "scale_b_ptr", "c_ptr", "M", "N", "K", "alpha",
                 "stride_am", "stride_ak", "stride_bk", "stride_bn"]
        params = ([PointerType(t) for t in (dt.bf16, dt.bf16, dt.f32, dt.bf16, dt.bf16, dt.bf16)]
                  + [ScalarType(dt.i32)] * 3 + [ScalarType(dt.f32)] + [ScalarType(dt.i32)] * 4)
        types, names, recipes = launch_parameters(params, names, compiled.metadata)
        uses.append(launcher_map_uses(Launcher(compiled, types, backend=None, names=names, tensor_maps=recipes)))
    assert uses == [{"load": ["a_ptr", "b_ptr"], "store": ["c_ptr"]}, {"load": ["a_ptr", "b_ptr"], "store": []}]
    assert "st.global" in unaligned.stages["ptx"]


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

