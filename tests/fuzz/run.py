"""Long fuzz runs: `python3 -m tests.fuzz.run --mutants 10000 --unusual 2000 --jobs 2 --out fuzz-out`.

Each case runs in a worker subprocess (`--worker`) under a memory cap (RLIMIT_AS) and a time cap: a case past
the cap is a hang (the worker's process group is killed), a worker that dies mid-case a crash (its exit status
and last stderr lines are kept); either way the next case gets a fresh worker. A worker is also replaced every
`--recycle` cases so that no state builds up. Cases are made from (kind, index, seed) alone, so any one can be
rerun: `--replay out/<name>.json`. Every case that is not ok or a tessera error is written to `--out` with its
outcome, and the run ends with a table of outcomes per kind and target (also written as `summary.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from .cases import CLASSES, CRASH, DEFECTS, HANG, INTERPRETER, TARGETS, Case, Outcome, run_case
from .mutate import mutant
from .seeds import SEEDS
from .unusual import unusual

ROOT = Path(__file__).resolve().parents[2]
PLACES = (*TARGETS, INTERPRETER)


def make_case(kind: str, index: int, seed: int) -> Case:
    """Case `index` of `kind` ("mutant" or "unusual") in the run seeded `seed`: the same every time."""
    rng = random.Random(f"{seed}/{kind}/{index}")
    place = PLACES[index % len(PLACES)]
    name = f"{kind}-{seed}-{index}"
    if kind == "mutant":
        return mutant(SEEDS[rng.randrange(len(SEEDS))], rng, name, place)
    return unusual(rng, name, place)


def worker_main() -> None:
    """Answer `kind index seed` (or `replay PATH`) lines with one JSON outcome line each."""
    for line in sys.stdin:
        words = line.split()
        case = Case.from_json(Path(words[1]).read_text()) if words[0] == "replay" else \
            make_case(words[0], int(words[1]), int(words[2]))
        outcome = run_case(case)
        print(json.dumps({"cls": outcome.cls, "detail": outcome.detail, "seconds": outcome.seconds}), flush=True)


class Worker:
    """A `--worker` subprocess under the memory cap, restarted after a crash, a hang or `recycle` cases."""

    def __init__(self, time_cap: float, memory_mb: int, recycle: int, environment: dict):
        self.time_cap, self.memory_mb, self.recycle, self.environment = time_cap, memory_mb, recycle, environment
        self.process: subprocess.Popen | None = None
        self.served = 0

    def run(self, request: str) -> Outcome:
        if self.process is None or self.served >= self.recycle:
            self.stop()
            self.start()
        self.served += 1
        start = time.monotonic()
        try:
            self.process.stdin.write(request + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            return self._died(start)
        ready, _, _ = select.select([self.process.stdout], [], [], self.time_cap)
        if not ready:
            self.stop()
            return Outcome(HANG, f"no answer within the {self.time_cap:g} s time cap", time.monotonic() - start)
        line = self.process.stdout.readline()
        if not line:
            return self._died(start)
        answer = json.loads(line)
        return Outcome(answer["cls"], answer["detail"], answer["seconds"])

    def start(self) -> None:
        limit = self.memory_mb * 1024 * 1024

        def cap_memory():
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        self.stderr = tempfile.TemporaryFile("w+")     # a file, not a pipe: nobody reads it until the worker dies
        self.process = subprocess.Popen([sys.executable, "-m", "tests.fuzz.run", "--worker"], cwd=ROOT,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                        text=True, env=self.environment, preexec_fn=cap_memory,
                                        start_new_session=True)
        self.served = 0

    def _died(self, start: float) -> Outcome:
        self.process.wait()
        status = self.process.returncode
        self.stderr.seek(0)
        last = self.stderr.read().strip().splitlines()[-3:]
        self.process = None
        how = f"signal {-status}" if status < 0 else f"exit status {status}"
        return Outcome(CRASH, f"the worker died ({how}): {' | '.join(last)[:300]}", time.monotonic() - start)

    def stop(self) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
            self.process = None


def campaign(args) -> list[tuple[str, int, str, Outcome]]:
    """Run every case of the campaign over `args.jobs` workers; returns (kind, index, place, outcome) each."""
    work: queue.Queue = queue.Queue()
    for kind, count in (("mutant", args.mutants), ("unusual", args.unusual)):
        for index in range(args.first, args.first + count):
            work.put((kind, index))
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "TESSERA_COMPILE_TIMEOUT": str(args.compile_timeout)}
    if args.no_ptxas:
        environment.update(TESSERA_PTXAS="/nonexistent/ptxas", TESSERA_LLD="/nonexistent/ld.lld")
    results, lock, started = [], threading.Lock(), time.monotonic()
    total = work.qsize()

    def serve():
        worker = Worker(args.time_cap, args.memory_mb, args.recycle, environment)
        while True:
            try:
                kind, index = work.get_nowait()
            except queue.Empty:
                break
            outcome = worker.run(f"{kind} {index} {args.seed}")
            with lock:
                results.append((kind, index, PLACES[index % len(PLACES)], outcome))
                _record(args, kind, index, outcome)
                if len(results) % args.progress == 0:
                    counts = Counter(o.cls for *_, o in results)
                    print(f"[{time.monotonic() - started:7.0f} s] {len(results)}/{total} "
                          + ", ".join(f"{c}: {counts[c]}" for c in CLASSES), flush=True)
        worker.stop()

    threads = [threading.Thread(target=serve) for _ in range(args.jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _record(args, kind: str, index: int, outcome: Outcome) -> None:
    """Log every outcome to `args.out`/outcomes.jsonl, and keep a defect's case there to replay and debug it."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "outcomes.jsonl", "a") as log:
        log.write(json.dumps({"kind": kind, "index": index, "place": PLACES[index % len(PLACES)],
                              "cls": outcome.cls, "detail": outcome.detail,
                              "seconds": round(outcome.seconds, 2)}) + "\n")
    if outcome.cls not in DEFECTS:
        return
    case = make_case(kind, index, args.seed)
    (out / f"{case.name}.json").write_text(case.to_json())
    with open(out / "defects.txt", "a") as log:
        log.write(f"{case.name} {case.target} {outcome.cls}: {outcome.detail}\n")


def summary(results: list, seconds: float) -> str:
    """The table of outcomes: one row per kind and place, one column per class."""
    rows = [("kind", "place", *CLASSES, "cases")]
    for kind in ("mutant", "unusual"):
        for place in (*PLACES, "all"):
            picked = [o for k, _, p, o in results if k == kind and place in (p, "all")]
            if picked:
                counts = Counter(o.cls for o in picked)
                rows.append((kind, place, *(str(counts[c]) for c in CLASSES), str(len(picked))))
    counts = Counter(o.cls for *_, o in results)
    rows.append(("all", "all", *(str(counts[c]) for c in CLASSES), str(len(results))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines) + f"\n\n{len(results)} cases in {seconds:.0f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.fuzz.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mutants", type=int, default=100, help="mutated seed kernels (default 100)")
    parser.add_argument("--unusual", type=int, default=20, help="unusual-but-valid kernels (default 20)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first", type=int, default=0, help="index of the first case (to resume a run)")
    parser.add_argument("--jobs", type=int, default=1, help="workers running cases at once")
    parser.add_argument("--time-cap", type=float, default=120, help="seconds a case may take (default 120)")
    parser.add_argument("--compile-timeout", type=float, default=30, help="TESSERA_COMPILE_TIMEOUT (default 30)")
    parser.add_argument("--memory-mb", type=int, default=4096, help="address-space cap per worker (default 4096)")
    parser.add_argument("--recycle", type=int, default=200, help="cases per worker before a fresh one")
    parser.add_argument("--no-ptxas", action="store_true", help="stop at PTX / AMDGCN text (faster)")
    parser.add_argument("--progress", type=int, default=100, help="print counts every N cases")
    parser.add_argument("--out", default="fuzz-out", help="folder for the defects and summary.json")
    parser.add_argument("--replay", help="run one saved case in this process and print its outcome")
    args = parser.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    if args.replay:
        outcome = run_case(Case.from_json(Path(args.replay).read_text()))
        print(f"{outcome.cls}: {outcome.detail} ({outcome.seconds:.1f} s)")
        return 0 if outcome.cls not in DEFECTS else 1
    started = time.monotonic()
    results = campaign(args)
    table = summary(results, time.monotonic() - started)
    print(table)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    counts = Counter(o.cls for *_, o in results)
    (Path(args.out) / "summary.json").write_text(json.dumps({"argv": sys.argv[1:], "counts": counts,
                                                             "table": table}, indent=1))
    return 1 if any(counts[c] for c in DEFECTS) else 0


if __name__ == "__main__":
    sys.exit(main())
