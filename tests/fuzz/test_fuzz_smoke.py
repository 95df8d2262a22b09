"""The fuzzer in CI: a small seeded budget of mutated and unusual kernels on sm_80, sm_90a, gfx942 and the
interpreter must end with no other exception, crash or hang; the harness itself must see a crash and a hang.
Long runs: `python3 -m tests.fuzz.run` (tests/fuzz/RESULTS.md)."""

from __future__ import annotations

import os

import pytest

from .cases import CRASH, DEFECTS, HANG, INTERPRETER, OK, OTHER_EXCEPTION, TARGETS, TESSERA_ERROR, Case, \
    classify, run_case
from .run import PLACES, Worker, make_case
from .seeds import SEEDS

SMOKE_SEED = 21
MUTANTS, UNUSUAL = 24, 16       # about 5 s on one core
TIME_CAP = 60


@pytest.fixture(autouse=True)
def bounded_compiles(monkeypatch):
    """LLVM past 30 s is a hang here too (the issue's bound for any valid kernel)."""
    monkeypatch.setenv("TESSERA_COMPILE_TIMEOUT", "30")


@pytest.mark.parametrize("seed", SEEDS, ids=[s.name for s in SEEDS])
def test_every_seed_compiles_for_every_target_and_runs_in_the_interpreter(seed):
    kernel = seed.source.split("@tessera.kernel\ndef ")[1].split("(")[0]
    for place in (*TARGETS, INTERPRETER):
        case = Case(f"seed-{seed.name}", seed.source, kernel, seed.signature, dict(seed.constexprs), place,
                    grid=seed.grid, array_elements=seed.array_elements)
        outcome = run_case(case, TIME_CAP)
        assert outcome.cls == OK, f"seed {seed.name} on {place}: {outcome.detail}"


@pytest.mark.parametrize("kind,count", [("mutant", MUTANTS), ("unusual", UNUSUAL)])
def test_a_seeded_budget_of_cases_ends_without_defects(kind, count):
    defects = []
    for index in range(count):
        case = make_case(kind, index, SMOKE_SEED)
        outcome = run_case(case, TIME_CAP)
        assert outcome.cls in (OK, TESSERA_ERROR, OTHER_EXCEPTION, CRASH, HANG)
        if outcome.cls in DEFECTS:
            defects.append(f"{case.name} on {case.target}: {outcome.cls}: {outcome.detail}\n{case.source}")
    assert not defects, "\n\n".join(defects)


def test_cases_are_the_same_for_the_same_seed_and_cover_every_place():
    first = [make_case("mutant", i, 5) for i in range(8)]
    assert [c.to_json() for c in first] == [make_case("mutant", i, 5).to_json() for i in range(8)]
    assert {c.target for c in first} == set(PLACES)
    assert Case.from_json(first[0].to_json()) == first[0]


def test_outcomes_are_classed_by_exception():
    from tessera import CompileError
    from tessera.backends.llvm.errors import BackendError, CompileTimeoutError

    assert classify(None).cls == OK
    assert classify(CompileError("no")).cls == TESSERA_ERROR
    assert classify(KeyError("x")).cls == OTHER_EXCEPTION
    assert classify(MemoryError()).cls == OTHER_EXCEPTION
    assert classify(CompileError("internal compiler error while tracing this line (KeyError: 1)")).cls == \
        OTHER_EXCEPTION
    assert classify(CompileTimeoutError("k", "sm_80", 30)).cls == HANG
    assert classify(BackendError("LLVM crashed ...; this process is unharmed")).cls == CRASH


def _replayed(tmp_path, source: str, time_cap: float):
    case = Case("harness", source, "k", "*f32")
    path = tmp_path / "case.json"
    path.write_text(case.to_json())
    worker = Worker(time_cap, 2048, 10, {**os.environ})
    try:
        return worker.run(f"replay {path}"), worker
    finally:
        worker.stop()


def test_the_runner_sees_a_worker_that_dies_as_a_crash(tmp_path):
    outcome, _ = _replayed(tmp_path, "import os, sys\nsys.stderr.write('last words\\n')\nos.abort()\n", 60)
    assert outcome.cls == CRASH and "signal 6" in outcome.detail and "last words" in outcome.detail


def test_the_runner_sees_a_case_past_its_time_cap_as_a_hang(tmp_path):
    outcome, _ = _replayed(tmp_path, "import time\ntime.sleep(600)\n", 3)
    assert outcome.cls == HANG and "3 s" in outcome.detail


def test_the_in_process_time_cap_ends_a_python_loop_as_a_hang():
    outcome = run_case(Case("spin", "while True:\n    pass\n", "k", "*f32"), time_cap=0.5)
    assert outcome.cls == HANG
