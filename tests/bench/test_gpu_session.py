"""bench/gpu_session.py, the GPU session that must fit a short GPU window, checked on the CPU: steps that do
not fit the budget are not started, a step over its limit is killed and what it wrote survives, test outcomes
and benchmark rows are streamed as JSON lines (also when a hung test's worker is killed), and the dry run of
both tiers passes here, so a broken session is found before GPU time is spent on it."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_session  # noqa: E402
from gpu_session import Session, Step  # noqa: E402


def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", textwrap.dedent(code))


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_a_step_whose_estimate_does_not_fit_the_budget_is_not_started(tmp_path):
    session = Session(tmp_path, budget_s=5, dry_run=False)
    session.run(Step("long", 2, estimate_s=60, bound_s=100, command=python("open('ran', 'w')")))
    assert session.summary["steps"] == [{"step": "long", "status": "not started"}]
    assert "long: not started (60 s expected, 5 s of budget left)" in (tmp_path / "log.txt").read_text()
    assert not (ROOT / "ran").exists()


def test_a_step_over_its_limit_is_killed_and_the_rows_it_recorded_survive(tmp_path):
    session = Session(tmp_path, budget_s=100, dry_run=False)
    session.run(Step("hangs", 1, estimate_s=1, bound_s=2, command=python("""
        import subprocess, sys, time, gpu_common
        gpu_common.record("demo", {"case": "before the hang", "value": 1})
        print("measured one row", flush=True)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])   # a child is killed too
        time.sleep(60)
    """)))
    [step] = session.summary["steps"]
    assert step["status"] == "killed at its 2 s limit" and step["seconds"] < 10
    assert rows(tmp_path) == [{"bench": "demo", "case": "before the hang", "value": 1}]
    assert "measured one row" in (tmp_path / "log.txt").read_text()


def test_each_benchmark_json_is_folded_into_summary_json_as_soon_as_its_step_ends(tmp_path):
    session = Session(tmp_path, budget_s=100, dry_run=False)
    session.run(Step("bench", 1, estimate_s=1, bound_s=30, command=python("""
        import gpu_common
        gpu_common.write("demo", {"rows": [1, 2]})
    """)))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["benchmarks"] == {"demo": {"rows": [1, 2]}}
    assert summary["steps"][0]["status"] == "ok"


def test_a_failing_step_is_recorded_and_the_session_goes_on(tmp_path):
    session = Session(tmp_path, budget_s=100, dry_run=False)
    session.run(Step("fails", 1, estimate_s=1, bound_s=30, command=python("raise SystemExit(3)")))
    session.run(Step("next", 1, estimate_s=1, bound_s=30, command=python("print('still here')")))
    assert [s["status"] for s in session.summary["steps"]] == ["exit code 3", "ok"]


def test_test_outcomes_stream_as_json_lines_and_a_hung_test_loses_only_itself(tmp_path):
    pytest.importorskip("xdist")
    pytest.importorskip("pytest_timeout")
    tests = tmp_path / "suite"
    tests.mkdir()
    (tests / "test_demo.py").write_text(textwrap.dedent("""
        import time, pytest
        def test_passes(): pass
        def test_fails(): assert 1 == 2
        def test_skips(): pytest.skip("no GPU here")
        def test_hangs(): time.sleep(60)     # a kernel that never finishes
        @pytest.mark.parametrize("i", range(4))
        def test_more(i): pass
    """))
    out = tmp_path / "out"
    out.mkdir()
    env = dict(__import__("os").environ, TESSERA_RESULTS_JSONL=str(out / "results.jsonl"),
               PYTHONPATH=str(ROOT / "bench"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "pytest_jsonl", "-p", "no:cacheprovider",
                           "-n", "2", "--timeout=3", "--timeout-method=thread", str(tests)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = {r["test"].split("::")[1]: r["outcome"] for r in rows(out)}
    assert outcomes == {"test_passes": "passed", "test_fails": "failed", "test_skips": "skipped",
                        "test_hangs": "failed", **{f"test_more[{i}]": "passed" for i in range(4)}}
    messages = {r["test"].split("::")[1]: r.get("message", "") for r in rows(out)}
    assert "crashed while running" in messages["test_hangs"] and "no GPU here" in messages["test_skips"]


def test_the_report_lists_failures_and_every_benchmark_row(tmp_path):
    lines = [{"bench": "pytest", "test": "t.py::a", "outcome": "passed"},
             {"bench": "pytest", "test": "t.py::b", "outcome": "failed"},
             {"bench": "launch_overhead", "case": "tessera_empty", "median_us": 9.87},
             {"bench": "launch_overhead", "case": "cache_hit_new_process_ms", "ms": 4.25},
             {"bench": "bandwidth", "case": "softmax", "tessera_gbps": 3500.4, "torch_copy_gbps": 4000.0},
             {"bench": "moe", "model": "mixtral", "tokens": 1, "speedup": 2.5, "baseline": "torch-grouped-mm",
              "graph_speedup": 3.0, "hbm_share": 0.81},
             {"bench": "moe", "model": "mixtral", "tokens": 16, "speedup": 1.15, "baseline": "torch-grouped-mm",
              "tessera_graph_ms": 0.4},
             {"bench": "moe", "model": "qwen3", "tokens": 16, "tessera_error": "RuntimeError: boom"},
             {"bench": "gemm_bf16", "m": 16, "n": 4096, "k": 4096, "wrong": "gemm: 3 of 9 elements wrong"},
             {"bench": "gemm_bf16", "m": 8192, "n": 8192, "k": 8192, "tessera_tflops": 480.2, "ratio": 0.7,
              "cublas_tflops": 690.0, "tessera_graph_tflops": 550.0, "graph_ratio": 0.8}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert gpu_session.report_text(tmp_path).splitlines() == [
        "pytest -m gpu: 1 failed, 1 passed",
        "- FAILED t.py::b",
        "- launch tessera_empty: 9.87 µs",
        "- cache_hit_new_process_ms: 4.25 ms",
        "- softmax: 3500 GB/s (torch copy 4000)",
        "- moe mixtral 1 tokens: 2.50x torch-grouped-mm per eager call, 3.00x in a graph, 81% of HBM",
        "- moe mixtral 16 tokens: 1.15x torch-grouped-mm per eager call, no torch-grouped-mm time in a graph",
        "- moe qwen3 16 tokens: ERROR",
        "- gemm_bf16 16x4096x4096: WRONG",
        "- gemm_bf16 8192x8192x8192: 480 TFLOP/s (70%), reference 690; in a graph 550 (80%)",
    ]


def test_the_dry_run_of_both_tiers_passes_on_the_cpu_and_writes_at_most_eight_files(tmp_path):
    pytest.importorskip("xdist")
    pytest.importorskip("pytest_timeout")
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu_session.py"), "--dry-run", "--tier", "2",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [s.name for s in gpu_session.steps(dry_run=True)]
    assert {s["status"] for s in summary["steps"]} == {"ok"}, summary["steps"]
    assert "tests collected" in (tmp_path / "pytest.txt").read_text()
    assert "python" in (tmp_path / "machine.txt").read_text()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) <= 8 and set(files) <= set(gpu_session.OUTPUT_FILES)


def test_steps_named_on_the_command_line_run_alone_whatever_their_tier(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(Session, "run", lambda self, step: ran.append(step.name))
    monkeypatch.setattr(Session, "_collect_benchmarks", lambda self: None)
    monkeypatch.setattr(gpu_session, "report_text", lambda folder: "")
    gpu_session.run_session(1, 100, tmp_path, dry_run=True, only=("fusion", "pytest-gpu"))
    assert ran == ["pytest-gpu", "fusion"]                 # in the session's order, tier 2 included


def test_an_unknown_step_name_is_refused_with_the_names_there_are(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu_session.py"), "--steps", "pytest-gpu,atention",
                           "--dry-run", "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "no step named atention" in done.stderr and "attention" in done.stderr
