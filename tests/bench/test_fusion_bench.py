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
