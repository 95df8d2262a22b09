"""bench/attention.py, checked on the CPU: the rows it plans (the issue's shapes, the goal's first), the FLOPs and
bytes it divides by, that it starts no row once its budget is spent and still writes what it measured, the lines
the session's report prints for it, and its dry run (each part once on the interpreter against the references)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import attention as bench  # noqa: E402
import gpu_session  # noqa: E402


def test_the_dense_rows_cover_the_issue_shapes_with_head_dim_128_first():
    rows = bench.cases("forward")
    assert {r["S"] for r in rows} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {r["D"] for r in rows} == {64, 128, 256} and {r["causal"] for r in rows} == {False, True}
    assert all(r["B"] * r["S"] == 16384 and r["H"] * r["D"] == 2048 for r in rows)
    assert {r["D"] for r in rows[:12]} == {128} and len(rows) == len({tuple(r.items()) for r in rows}) == 36
    assert bench.cases("backward") == rows


def test_the_goal_head_dim_runs_first_then_decode_then_the_rest_then_fp8():
    order = bench.schedule(list(bench.PARTS))
    parts = [(part, case.get("D")) for part, case in order]
    assert parts[:24] == [("forward", 128)] * 12 + [("backward", 128)] * 12
    assert parts[24:32] == [("decode", 128)] * 8 and len(order) == 92
    assert parts[80:] == [("fp8", 128)] * 12, "fp8 last"
    assert [part for part, _ in bench.schedule(["decode"])] == ["decode"] * 8


def test_flops_and_bytes():
    assert bench.forward_flops(dict(B=2, S=1024, H=16, D=128, causal=False)) == 4 * 2 * 16 * 1024 ** 2 * 128
    assert bench.forward_flops(dict(B=2, S=1024, H=16, D=128, causal=True)) == 2 * 2 * 16 * 1024 ** 2 * 128
    case = dict(B=8, context=4096, H=32, H_kv=8, D=128, page=64)
    assert bench.decode_bytes(case) == 2 * 8 * 4096 * 8 * 128 * 2 + 2 * 8 * 32 * 128 * 2


def test_no_row_starts_after_the_budget_and_the_measured_rows_are_written(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    clock = iter(range(0, 1000, 10))                      # each look at the clock: 10 s later
    monkeypatch.setenv("TESSERA_BENCH_RESULTS", str(tmp_path))
    monkeypatch.setenv("TESSERA_RESULTS_JSONL", str(tmp_path / "rows.jsonl"))
    monkeypatch.setattr(bench.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(bench.gpu_common, "require_gpu", lambda: torch)
    monkeypatch.setattr(bench.gpu_common, "environment", lambda torch: {"gpu": "none"})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "H200")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench, "measure_decode", lambda torch, case, peak: {"part": "decode", **case,
                                                                            "tessera_error": "no GPU"})
    result = bench.run(["decode"], budget_s=35)          # rows start at 10, 20, 30 s; not at 40
    assert len(result["rows"]) == 3 and result["not_run"] == len(bench.cases("decode")) - 3
    assert json.loads((tmp_path / "attention.json").read_text())["rows"] == result["rows"]
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 3


def test_the_session_runs_it_in_tier_2_and_reports_its_rows():
    [step] = [s for s in gpu_session.steps(dry_run=False) if s.name == "attention"]
    assert step.tier == 2 and "--budget" in step.command and "attention.png" in gpu_session.PLOTS
    rows = [{"part": "forward", "B": 8, "S": 2048, "H": 16, "D": 128, "causal": True, "tessera_tflops": 512.3,
             "cudnn_tflops": 480.0, "vs_cudnn": 1.067},
            {"part": "backward", "B": 8, "S": 2048, "H": 16, "D": 256, "causal": False, "tessera_error": "no plan"},
            {"part": "decode", "B": 8, "context": 16384, "tessera_graph_us": 70.0, "tessera_gbps": 3835.0,
             "hbm_share": 0.8, "vs_sdpa": 1.25}]
    assert [gpu_session.attention_line(r) for r in rows] == [
        "- attention forward B=8 S=2048 D=128 causal: 512 TFLOP/s (1.07x cuDNN)",
        "- attention backward B=8 S=2048 D=256: ERROR",
        "- attention decode B=8 context=16384: 70.0 µs, 3835 GB/s (80% of HBM), 1.25x SDPA",
    ]
    assert bench.describe(rows[0]).endswith("tessera 512, cudnn 480 TFLOP/s (1.07x cuDNN)")


def test_a_warp_specialized_column_is_compared_with_the_plain_plan():
    """Hopper's forward rows at D 64/128 time `tessera_ws` (TESSERA_ATTENTION_WS=1) and `tessera_plain` (=0)
    beside `tessera` (the plan chosen unasked); ws over plain is in the row, the log line and the report."""
    row = {"part": "forward", "B": 8, "S": 2048, "H": 16, "D": 128, "causal": True, "tessera_tflops": 500.0,
           "tessera_ws_tflops": 550.0, "tessera_plain_tflops": 500.0, "cudnn_tflops": 480.0}
    bench._check_all(None, row, None)
    assert row["ws_vs_plain"] == pytest.approx(1.1) and row["vs_cudnn"] == pytest.approx(500 / 480)
    assert "tessera 500, tessera_ws 550, tessera_plain 500, cudnn 480 TFLOP/s" in bench.describe(row)
    assert gpu_session.attention_line(row).endswith("(1.04x cuDNN); warp-specialized 550 (1.10x)")


def test_the_overlapped_columns_are_compared_with_their_fa2_order():
    """... and each of the two in FlashAttention-3's overlapped order (TESSERA_ATTENTION_OVERLAP=1), against
    the same plan in FlashAttention-2's order, and the warp-specialized one with its warpgroups ping-ponging
    (..._PINGPONG=1) against it overlapped alone."""
    assert {who: env[:3] for who, env in bench.HOPPER_FORWARDS.items() if env[3] == "0"} == {
        "tessera_ws": ("1", "0", "0"), "tessera_plain": ("0", "0", "0"), "tessera_ws_overlap": ("1", "1", "0"),
        "tessera_plain_overlap": ("0", "1", "0"), "tessera_ws_pingpong": ("1", "1", "1")}
    row = {"part": "forward", "B": 4, "S": 4096, "H": 16, "D": 128, "causal": False, "tessera_tflops": 500.0,
           "tessera_ws_tflops": 500.0, "tessera_plain_tflops": 400.0, "tessera_ws_overlap_tflops": 600.0,
           "tessera_plain_overlap_tflops": 440.0, "tessera_ws_pingpong_tflops": 630.0, "cudnn_tflops": 480.0}
    bench._check_all(None, row, None)
    assert (row["overlap_vs_ws"], row["overlap_vs_plain"]) == (pytest.approx(1.2), pytest.approx(1.1))
    assert row["pingpong_vs_overlap"] == pytest.approx(1.05)
    assert "tessera_ws_overlap 600, tessera_plain_overlap 440, tessera_ws_pingpong 630, cudnn 480" in \
        bench.describe(row)
    assert gpu_session.attention_line(row).endswith("; overlapped 440 (1.10x plain); overlapped 600 (1.20x ws); "
                                                    "ping-pong 630 (1.05x)")


def test_the_overlapped_backward_column_is_compared_with_the_fa2_order():
    """Hopper's backward rows time `tessera_overlap` (TESSERA_ATTENTION_BWD_OVERLAP=1, set around the timed
    autograd.grad, where the backward reads it) beside `tessera`; its speed over the FA2 order is in the row,
    the log line and the report."""
    assert bench.HOPPER_BACKWARDS == {"tessera_overlap": {"TESSERA_ATTENTION_BWD_OVERLAP": "1"}}
    row = {"part": "backward", "B": 4, "S": 4096, "H": 16, "D": 128, "causal": True, "tessera_tflops": 300.0,
           "tessera_overlap_tflops": 330.0, "flash_tflops": 320.0, "cudnn_tflops": 400.0}
    bench._check_all(None, row, None)
    assert row["bwd_overlap_vs_fa2"] == pytest.approx(1.1) and "ws_vs_plain" not in row
    assert "tessera 300, tessera_overlap 330, flash 320, cudnn 400 TFLOP/s" in bench.describe(row)
    assert gpu_session.attention_line(row).endswith("(0.75x cuDNN); overlapped backward 330 (1.10x)")


def test_the_dry_run_checks_each_part_on_the_interpreter():
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(ROOT / "bench/attention.py"), "--dry-run"], capture_output=True,
                          text=True, timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    for line in ("attention forward: 36 rows", "backward on the CPU interpreter: dQ, dK, dV match",
                 "decode on the CPU interpreter", "attention fp8: 12 rows", "fp8 forward on the CPU interpreter"):
        assert line in done.stdout


def test_each_decode_row_carries_the_models_prediction():
    """The GPU run sets the measured decode time beside the model's (attention_decode_model), for the plan the op
    launches, so a session shows how far the model is off; the description prints both."""
    rows = [{"part": "decode", **case, **bench.modelled_decode(case)} for case in bench.cases("decode")]
    assert all(0 < r["model_us"] and 0 < r["model_hbm_share"] < 1 and r["model_splits"] >= 1 for r in rows)
    by_shape = {(r["B"], r["context"]): r for r in rows}
    assert by_shape[(1, 4096)]["model_us"] < by_shape[(1, 16384)]["model_us"] < by_shape[(1, 65536)]["model_us"]
    assert "model " in bench.describe(by_shape[(1, 16384)])


def test_the_persistent_columns_are_compared_with_the_one_tile_kernel():
    """The persistent kernel (TESSERA_ATTENTION_PERSISTENT=1) is timed warp-specialized, in both loop orders,
    against the same plan launched one tile per program, in the same run; both ratios are in the row and the
    session's line."""
    assert {who: env for who, env in bench.HOPPER_FORWARDS.items() if env[3] == "1"} == {
        "tessera_ws_persistent": ("1", "0", "0", "1"), "tessera_ws_overlap_persistent": ("1", "1", "0", "1")}
    row = {"part": "forward", "B": 4, "S": 4096, "H": 16, "D": 64, "causal": True, "tessera_tflops": 500.0,
           "tessera_ws_tflops": 500.0, "tessera_ws_overlap_tflops": 600.0, "tessera_ws_persistent_tflops": 550.0,
           "tessera_ws_overlap_persistent_tflops": 630.0}
    bench._check_all(None, row, None)
    assert (row["persistent_vs_ws"], row["persistent_vs_overlap"]) == (pytest.approx(1.1), pytest.approx(1.05))
    assert gpu_session.attention_line(row).endswith("; persistent 550 (1.10x ws); persistent overlapped 630 (1.05x)")
