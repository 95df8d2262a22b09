"""The library GEMM with WS = True (a warp-specialized K loop, sm_90): a config flag, False by default.

Specification: no common shipped config sets WS, and their tile IR carries no `warp_specialize` (the sm_90
family's persistent one does: test_gemm_persistent_ws.py); with WS = True
the K loop is `tessera.pipeline(..., warp_specialize=True)`: on sm_90 (mma.sync consumers) and sm_90a
(wgmma consumers) the kernel launches num_warps * 32 + 128 threads and every non-persistent config
assembles without spills; it needs no more shared memory than without WS but its mbarriers, and on the
SIMT simulator equals numpy (odd sizes, B transposed, bias and activation in the consumers' epilogue).
"""

import re

import numpy as np
import pytest

pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera.backends.simt import run_threads  # noqa: E402
from tessera.kernels_lib.gemm import CONFIGS, gemm_kernel  # noqa: E402
from tessera.passes.thread_passes import lower  # noqa: E402

SIGNATURE = "*bf16:16,*bf16:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,i32:16,i32:1"
EPILOGUE = dict(HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none")


def bf16_bits(x):
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def test_no_common_config_warp_specializes():
    assert all("WS" not in config.kwargs for config in CONFIGS)
    module = gemm_kernel.kernel.specialize(
        *[tessera.reinterpret(np.zeros((64, 64), np.uint16), tessera.bf16)] * 2, np.zeros(64, np.float32),
        np.zeros(1, np.float32), np.zeros(1, np.float32), np.zeros((64, 64), np.float32), 64, 64, 64, 1.0,
        64, 1, 64, 1, **EPILOGUE, **CONFIGS[3].kwargs).module
    text = tessera.ir.printer.print_module(module)
    assert "stages = 4" in text and "warp_specialize" not in text


def test_ws_config_on_sm_90_assembles_without_spills():
    from tessera.backends.nvptx import find_ptxas
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    config = CONFIGS[0]             # BM = BN = 128, BK = 64, 3 stages, 8 warps
    compiled = gemm_kernel.kernel.compile(signature=SIGNATURE, target="sm_90", num_warps=config.num_warps,
                                          **EPILOGUE, **dict(config.kwargs, WS=True))
    ptx, meta = compiled.stages["ptx"], compiled.metadata
    assert meta["num_threads"] == 384 and re.search(r"\.maxntid 384\b", ptx)
    # A's and B's fills (the producer's); C's TMA stores (the consumers', thread 0 among them): stmatrix into a
    # 128B-swizzled tile, one store per 64-column block of BN = 128
    assert ptx.count("cp.async.bulk.tensor.2d.shared") == 2 and "mma.sync.aligned.m16n8k16" in ptx
    assert ptx.count("cp.async.bulk.tensor.2d.global.shared::cta") == 2 and "stmatrix.sync.aligned" in ptx
    assert meta["spill_stores"] == meta["spill_loads"] == 0, meta["log"]
    # the epilogue's buffers reuse the rings' bytes as without WS: only the 2 x 3 mbarriers are extra
    plain = gemm_kernel.kernel.compile(signature=SIGNATURE, target="sm_90", num_warps=config.num_warps, **EPILOGUE,
                                       **config.kwargs).metadata
    assert plain["shared_bytes"] < meta["shared_bytes"] <= plain["shared_bytes"] + 64


@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
def test_every_non_persistent_config_warp_specialized_assembles_without_spills(target):
    """WS = True on every shipped non-persistent config: mma.sync consumers on sm_90, wgmma consumers on
    sm_90a (with setmaxnreg where 8 warps make it pay: the epilogue runs in the consumers' branch, under
    it), one producer warpgroup more, no spills."""
    from tessera.backends.nvptx import find_ptxas
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    for config in (c for c in CONFIGS if not c.kwargs["PERSISTENT"]):
        compiled = gemm_kernel.kernel.compile(signature=SIGNATURE, target=target, num_warps=config.num_warps,
                                              **EPILOGUE, **dict(config.kwargs, WS=True))
        ptx, meta = compiled.stages["ptx"], compiled.metadata
        assert meta["num_threads"] == config.num_warps * 32 + 128, config
        assert meta["spill_stores"] == meta["spill_loads"] == 0, (config, meta["log"])
        assert ("wgmma.mma_async" in ptx) == (target == "sm_90a") and "cp.async.bulk.tensor" in ptx, config
        assert ("setmaxnreg.inc" in ptx) == (target == "sm_90a" and config.num_warps == 8), config


@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_ws_gemm_equals_numpy_on_the_simt_simulator(trans_b, target):
    M, N, K = 77, 64 if not trans_b else 61, 144
    rng = np.random.default_rng(0)
    a = bf16_bits(rng.standard_normal((M, K)))
    b = bf16_bits(rng.standard_normal((K, N)))
    b_stored, (sbk, sbn) = (np.ascontiguousarray(b.T), (1, K)) if trans_b else (b, (N, 1))
    bias = rng.standard_normal(N).astype(np.float32)
    args = [tessera.reinterpret(a, tessera.bf16), tessera.reinterpret(b_stored, tessera.bf16), bias,
            np.zeros(1, np.float32), np.zeros(1, np.float32), np.zeros((M, N), np.float32), M, N, K, 0.5,
            K, 1, sbk, sbn]
    config = dict(BM=64, BN=64, BK=32, GROUP_M=8, PERSISTENT=False, STAGES=3, WS=True)
    module = gemm_kernel.kernel.specialize(*args, **dict(EPILOGUE, HAS_BIAS=True, ACTIVATION="relu"),
                                           **config).module
    fn = lower(module, target, 4).functions[0]
    assert fn.attrs["num_threads"] == 256 and [op.name for op in fn.walk()].count("tma_load") >= 2
    assert any(op.name == "wgmma" for op in fn.walk()) == (target == "sm_90a")
    run_threads(fn, [a, b_stored, *args[2:]], (tessera.cdiv(M, 64) * tessera.cdiv(N, 64),))

    def real(bits):
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)

    expected = np.maximum(0.5 * (real(a) @ real(b)) + bias, 0.0)
    np.testing.assert_allclose(args[5], expected, rtol=1e-4, atol=1e-3)
