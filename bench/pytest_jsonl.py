"""A pytest plugin that appends each test's outcome to $TESSERA_RESULTS_JSONL the moment it is known.

    TESSERA_RESULTS_JSONL=out/results.jsonl python -m pytest -p pytest_jsonl ...   # bench/ on sys.path

Used by bench/gpu_session.py so that a GPU run cut off at its time limit keeps
the outcome of every test that finished. With pytest-xdist only the controller
writes (it receives every worker's reports, and a report for a test whose worker
died, e.g. killed by pytest-timeout on a hung kernel).
"""

from __future__ import annotations

import json
import os


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("TESSERA_RESULTS_JSONL")
    if not path or not _is_final(report):
        return
    row = {"bench": "pytest", "test": report.nodeid, "outcome": _outcome(report),
           "duration_s": round(report.duration, 3)}
    if report.failed or report.skipped:
        row["message"] = _message(report)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput"):          # an xdist worker: the controller records its reports
        os.environ.pop("TESSERA_RESULTS_JSONL", None)


def _is_final(report) -> bool:
    """One row per test: its call phase, the setup / teardown phase that failed or skipped it, or the report
    xdist makes up (phase '???') for a test whose worker died, e.g. ended by the per-test timeout."""
    return report.when not in ("setup", "teardown") or not report.passed


def _outcome(report) -> str:
    if report.when in ("setup", "teardown") and report.failed:
        return "error"
    return report.outcome


def _message(report) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    text = str(report.longrepr)
    return text if len(text) <= 4000 else text[:1000] + "\n...\n" + text[-3000:]
