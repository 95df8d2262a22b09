"""bench/fusion.py on the CPU: its dry run fuses each case as the GPU run will (the chain's five launches into one,
eight independent launches into one), checks fused against unfused, and counts the bytes each variant moves."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import fusion  # noqa: E402


def test_the_dry_run_fuses_each_case_and_counts_the_bytes_moved():
    chain, horizontal, *epilogues = fusion.dry_run()
    assert chain["launches"] == "5 -> 1" and horizontal["launches"] == "8 -> 1"
    assert chain["bytes_fused"] == (2 * 37 * 48 + 37) * 4            # x and z read, the row sums written
    assert chain["bytes_unfused"] > 4 * chain["bytes_fused"]         # each intermediate written and read back
    assert horizontal["bytes_fused"] == horizontal["bytes_unfused"]  # one launch, the same bytes
    M, N, K = fusion.EPILOGUE_SHAPES[0]
    assert epilogues[0]["bytes_fused"] == (M * K + K * N + N + 2 * M * N) * 2
    assert all(e["bytes_eager"] > 2 * e["bytes_fused"] for e in epilogues)


def test_each_row_describes_itself_for_the_session_report():
    row = {"case": "chain", "shape": "8x8", "launches": "5 -> 1", "speedup": 3.5, "speedup_graph": 4.0,
           "bytes_unfused": 10, "bytes_fused": 2}
    assert fusion.describe(row) == "chain 8x8 (5 -> 1 launches): 3.50x eager, 4.00x in a graph; 10 -> 2 bytes"
    assert fusion.describe({"case": "epilogue", "shape": "1x1x1", "error": "boom"}) == "epilogue 1x1x1: ERROR boom"


def test_an_epilogue_row_shows_the_graph_times_and_the_configs_chosen():
    row = {"case": "epilogue", "shape": "2x2x2", "tessera_ms": 0.3, "eager_ms": 0.35, "compile_ms": 0.36,
           "speedup_vs_compile": 1.2, "plain_gemm_ms": 0.25, "cublas_ms": 0.24, "tessera_graph_ms": 0.28,
           "compile_graph_ms": 0.33, "fused_config": "BM=128", "plain_config": "BM=128"}
    assert fusion.describe(row) == ("epilogue 2x2x2: tessera 0.300 ms, eager 0.350 ms, torch.compile 0.360 ms "
                                    "(1.20x compile); plain gemm 0.250 ms, cuBLAS 0.240 ms; in a graph (ms): "
                                    "tessera 0.280, compile 0.330; configs: fused BM=128, plain BM=128")


def test_the_config_a_kernel_chose_is_read_from_its_tuner():
    from tessera.kernels_lib.gemm import CONFIGS, pin_config
    from tessera.kernels_lib.gemm_fused import gemm_fused_kernel
    from tessera.runtime.autotune import tuning_key

    tuner = gemm_fused_kernel.tuner
    slot = ("some GPU", tuning_key(tuner.key, {"M": 48, "N": 80, "K": 16}))
    assert fusion.tuned_config(gemm_fused_kernel, 48, 80, 16) == "not tuned"
    tuner.chosen[slot] = CONFIGS[2]
    try:
        assert fusion.tuned_config(gemm_fused_kernel, 48, 80, 16) == str(CONFIGS[2])
        assert fusion.tuned_config(gemm_fused_kernel, 48, 80, 32) == "not tuned"
        pin_config(CONFIGS[1])
        assert fusion.tuned_config(gemm_fused_kernel, 48, 80, 16) == f"pinned {CONFIGS[1]}"
    finally:
        pin_config(None)
        del tuner.chosen[slot]
