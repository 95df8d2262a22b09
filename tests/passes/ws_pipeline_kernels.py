"""The warp-specialized pipelined matmul the tests share (IR, SIMT simulator and PTX).

`ws_matmul_case(...)` traces `pipelined_matmul` of `pipeline_kernels.py` with
`tessera.pipeline(..., warp_specialize=True)` on its K loop, for one problem,
and returns it as a `MatmulCase` (its tile-IR module, grid and fresh arguments).
"""

from __future__ import annotations

import numpy as np

import tessera

from pipeline_kernels import MatmulCase, _exact, _host


@tessera.kernel
def ws_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_bk, stride_bn, BM: tessera.constexpr, BN: tessera.constexpr,
              BK: tessera.constexpr, STAGES: tessera.constexpr):
    pid_m = tessera.program_id(0)
    pid_n = tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N), (stride_bk, stride_bn))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES, warp_specialize=True):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


def ws_matmul_case(M, N, K, BM, BN, BK, stages, trans_b=False, seed=0, dtype=tessera.bf16) -> MatmulCase:
    rng = np.random.default_rng(seed)
    a = _exact(rng.standard_normal((M, K)), dtype)
    b = _exact(rng.standard_normal((K, N)), dtype)
    b_stored, strides = (np.ascontiguousarray(b.T), (1, K)) if trans_b else (b, (N, 1))

    def make_args():
        return [_host(a, dtype), _host(b_stored, dtype), np.zeros((M, N), np.float16), M, N, K, *strides]

    typed = [tessera.reinterpret(x, dtype) if i < 2 else x for i, x in enumerate(make_args())]
    module = ws_matmul.specialize(*typed, BM=BM, BN=BN, BK=BK, STAGES=stages).module
    return MatmulCase(module, (tessera.cdiv(M, BM), tessera.cdiv(N, BN)), a, b, make_args)
