"""A K loop's accumulator stored straight after the loop keeps the dot's layout inside the loop.

Specification (layout assignment's "loops first" rule):

* `acc = dot(a, b, acc)` in a K loop followed by `c.block(...).store(acc)` (no
  cast or scale in between) lowers to a loop body with no shared-memory
  traffic for the f32 accumulator -- no f32 shared buffer, and the body is the
  same op for op as that of the kernel that stores `acc * alpha`, whose
  epilogue op takes the one conversion after the loop; the direct store's one
  conversion is after the loop too. This holds for mma.sync (sm_80, plain and
  pipelined), wgmma (sm_90a, plain and pipelined), MFMA (gfx942) and the
  warp-specialized pipeline (sm_90a);
* the lowered kernels compute numpy's product on the SIMT simulator (M, N, K
  not multiples of the blocks, so the stores are masked).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.backends.simt import run_threads
from tessera.ir.core import Function
from tessera.ir.types import PointerType
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from pipeline_kernels import _exact, _host  # noqa: E402


@tessera.kernel
def matmul_store_acc(a_ptr, b_ptr, c_ptr, M, N, K, alpha, BM: tessera.constexpr, BN: tessera.constexpr,
                     BK: tessera.constexpr, STAGES: tessera.constexpr, WS: tessera.constexpr,
                     SCALED: tessera.constexpr):
    """C = A @ B (f32), the accumulator stored as it leaves the loop, or (SCALED) times alpha first."""
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES, warp_specialize=WS):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    if SCALED:
        acc = acc * alpha
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc)


PATHS = {   # target, stages, warp_specialize, the dot's thread-IR op
    "mma.sync-sm_80": ("sm_80", 1, False, "mma"),
    "mma.sync-sm_80-pipelined": ("sm_80", 3, False, "mma"),
    "wgmma-sm_90a": ("sm_90a", 1, False, "wgmma"),
    "wgmma-sm_90a-pipelined": ("sm_90a", 4, False, "wgmma"),
    "wgmma-sm_90a-warp-specialized": ("sm_90a", 3, True, "wgmma"),
    "mfma-gfx942": ("gfx942", 1, False, "mfma"),
}
M, N, K, BM, BN, BK = 61, 100, 112, 64, 64, 32


class Problem:
    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.a = _exact(rng.standard_normal((M, K)), tessera.f16)
        self.b = _exact(rng.standard_normal((K, N)), tessera.f16)
        self.grid = (tessera.cdiv(M, BM), tessera.cdiv(N, BN))

    def make_args(self, alpha=1.0):
        return [_host(self.a, tessera.f16), _host(self.b, tessera.f16), np.zeros((M, N), np.float32),
                M, N, K, np.float32(alpha)]

    def lowered(self, path, scaled=False) -> Function:
        target, stages, ws, _ = PATHS[path]
        module = matmul_store_acc.specialize(*self.make_args(), BM=BM, BN=BN, BK=BK, STAGES=stages, WS=ws,
                                             SCALED=scaled).module
        return lower(module, target, 4).functions[0]


def loop_ops(fn: Function) -> list:
    """Every thread-IR op inside a loop's regions (nested ones included)."""
    return [inner for op in fn.walk() if op.name in ("for", "while")
            for region in op.regions for body_op in region.ops for inner in body_op.walk()]


def f32_shared_buffers(ops) -> list:
    """The shared buffers of f32 elements among `ops` (what a conversion of the accumulator allocates)."""
    return [op for op in ops if op.name == "shared_alloc"
            and isinstance(op.result.type, PointerType) and op.result.type.pointee == tessera.f32]


@pytest.fixture(scope="module")
def problem():
    return Problem()


@pytest.mark.parametrize("path", list(PATHS))
def test_a_directly_stored_accumulator_is_not_converted_inside_the_loop(problem, path):
    fn = problem.lowered(path)
    body = loop_ops(fn)
    assert PATHS[path][3] in {op.name for op in body}
    assert f32_shared_buffers(body) == []
    # the one conversion for the store is after the loop
    assert len(f32_shared_buffers(fn.walk())) == 1
    # the loop is the one the kernel that scales the accumulator first runs
    scaled = problem.lowered(path, scaled=True)
    assert Counter(op.name for op in body) == Counter(op.name for op in loop_ops(scaled))


@pytest.mark.parametrize("path", list(PATHS))
def test_a_directly_stored_accumulator_matches_numpy(problem, path):
    args = problem.make_args()
    run_threads(problem.lowered(path), args, problem.grid)
    np.testing.assert_allclose(args[2], problem.a @ problem.b, rtol=1e-4, atol=1e-4)
