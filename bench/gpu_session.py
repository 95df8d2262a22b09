"""One GPU session in tiers that fits a short window of GPU time, keeping every result it reaches.

    python bench/gpu_session.py [--tier 1|2] [--budget SECONDS] [--out DIR] [--dry-run]
    python bench/gpu_session.py --steps pytest-gpu,moe,fusion --budget 420   # just these, any tier
    python bench/gpu_session.py --report DIR      # a finished session's table, as Markdown

GPU time comes in windows of about 15 minutes (machine start included), at
most 10 minutes a command and 8 files back. So the session is a list of
steps, each with an estimate and a hard bound, run in order:

* tier 1 (about 4 minutes): machine facts; `pytest -m gpu` in parallel
  (pytest-xdist, one worker per core) with a per-test timeout that ends a hung
  kernel's worker without losing the other results; launch overhead;
  bandwidth; bf16 GEMM at 4096^3, 8192^3 and four LLM shapes on one pinned
  config; the decode GEMMs (M <= 64, the small-M path) against cuBLAS.
* tier 2 (the next 6 minutes): fp8 GEMM, the config sweep, the autotuned
  shapes, compile time, tutorial 04's GEMM steps (TFLOP/s per step), the
  quantized GEMM against cuBLAS fp16 (bench/quant_gemm.py), attention
  forward/backward against SDPA flash and cuDNN and paged decode
  (bench/attention.py, which stops starting rows after its `--budget`), the
  MoE layer against torch reference layers and Triton's fused MoE
  (bench/moe.py), and fusion against the same work unfused, torch eager and
  torch.compile (bench/fusion.py). MoE's and fusion's rows come back in
  results.jsonl and summary.json; their plots stay behind (the eight files
  are taken).

Each library kernel's benchmark joins tier 2 as it lands (attention, MoE,
quantized GEMM, fusion): one `Step` in `steps()`, its rows written with
`gpu_common.record`, and a `--dry-run` flag.

A step starts only if its estimate fits in what is left of `--budget`, and is
killed when the budget runs out. Whatever happens, the output folder
($OUT when set, else `--out`) holds at most these files, each written as the
session goes: machine.txt, pytest.txt, log.txt, results.jsonl (one JSON line
per test outcome and per benchmark row, appended as each finishes),
summary.json (each finished benchmark's whole JSON plus the step timings),
gemm_bf16.png, quant_gemm.png and attention.png.

`--dry-run` runs everything that needs no GPU (imports, test collection with
the same pytest arguments, each benchmark's plan, the output files) so that a
broken session is found on the CPU, not in GPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
PER_TEST_TIMEOUT_S = 120
MAX_WORKER_RESTARTS = 400       # about one per GPU test (368 on 2026-11-26): every crash gets a fresh worker
PLOTS = ("gemm_bf16.png", "quant_gemm.png", "attention.png")
OUTPUT_FILES = ("machine.txt", "pytest.txt", "log.txt", "results.jsonl", "summary.json", *PLOTS)


@dataclass(frozen=True)
class Step:
    """One unit of session work: a command, the tier it belongs to, its expected and maximal duration."""
    name: str
    tier: int
    estimate_s: float
    bound_s: float
    command: tuple[str, ...]
    log: str = "log.txt"


def pytest_command(workers: int, dry_run: bool) -> tuple[str, ...]:
    """`pytest -m gpu` spread over `workers` processes; a test over PER_TEST_TIMEOUT_S ends its worker
    (pytest-timeout's thread method: a kernel hung in a driver call cannot be interrupted by a signal), and so
    does a test after which the CUDA context no longer synchronizes (an illegal address is sticky:
    `tests/gpu_isolation.py`); pytest-xdist reports that test failed and starts a fresh worker for the rest.
    MAX_WORKER_RESTARTS is high so that a bad kernel which breaks the context in every test using it cannot
    use up the restarts and leave the other tests unrun (a restart costs seconds: the step's bound caps it)."""
    command = (sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rfEs", "-p", "no:cacheprovider",
               "-p", "pytest_jsonl", "-n", str(workers), "--max-worker-restart", str(MAX_WORKER_RESTARTS),
               f"--timeout={PER_TEST_TIMEOUT_S}", "--timeout-method=thread", str(ROOT / "tests"))
    return command + (("--collect-only",) if dry_run else ())


def bench_command(script: str, *args: str, dry_run: bool = False) -> tuple[str, ...]:
    return (sys.executable, str(BENCH / script), *args) + (("--dry-run",) if dry_run else ())


def steps(dry_run: bool) -> list[Step]:
    """The session's steps in the order they run; estimates are for an H100/H200 with 16 cores."""
    workers = max(2, min(16, os.cpu_count() or 2))
    b = lambda *a: bench_command(*a, dry_run=dry_run)  # noqa: E731
    return [
        Step("pytest-gpu", 1, 90, 170, pytest_command(workers, dry_run), log="pytest.txt"),
        Step("launch_overhead", 1, 15, 45, b("launch_overhead.py")),
        Step("bandwidth", 1, 20, 60, b("bandwidth.py")),
        Step("gemm-bf16-pinned", 1, 45, 100, b("gemm.py", "--part", "bf16", "--shapes", "tier1", "--pin", "0")),
        # M <= 64 against cuBLAS, both B layouts (issue 19's 1.1x goal): ~15 compiles and 24 shapes, never timed yet
        Step("gemm-decode", 1, 45, 110, b("gemm.py", "--part", "bf16", "--shapes", "decode")),
        Step("gemm-fp8", 2, 60, 100, b("gemm.py", "--part", "fp8", "--shapes", "tier1", "--pin", "0")),
        Step("gemm-configs", 2, 90, 150, b("gemm.py", "--part", "configs")),
        # stream K vs the data-parallel persistent kernel, split K, the autotuned op and cuBLAS: never timed yet
        Step("gemm-stream-k", 2, 60, 150, b("gemm.py", "--part", "stream_k")),
        Step("moe", 2, 190, 300, b("moe.py")),              # never timed yet (int4 and fp8 sides: ~12 more compiles)
        Step("gemm-autotuned", 2, 120, 200, b("gemm.py", "--part", "bf16", "--shapes", "all")),
        Step("compile_time", 2, 40, 90, b("compile_time.py", "--repeat", "3")),
        Step("tutorial-04", 2, 60, 120, (sys.executable, str(ROOT / "tutorials/04-layouts-and-async.py"))
             + (("--dry-run",) if dry_run else ())),
        Step("quant-gemm", 2, 120, 240, b("quant_gemm.py")),
        Step("attention", 2, 150, 300, b("attention.py", "--budget", "240")),
        Step("fusion", 2, 60, 150, b("fusion.py")),
    ]


class Session:
    """Runs steps against a budget, appending their output to files in `out` as they go."""

    def __init__(self, out: Path, budget_s: float, dry_run: bool):
        self.out, self.budget_s, self.dry_run = out, budget_s, dry_run
        self.start = time.monotonic()
        self.bench_results = Path(tempfile.mkdtemp(prefix="tessera-bench-"))
        self.summary = {"budget_s": budget_s, "dry_run": dry_run, "steps": [], "benchmarks": {}}
        out.mkdir(parents=True, exist_ok=True)
        for name in ("log.txt", "pytest.txt", "results.jsonl"):
            (out / name).write_text("")
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", TESSERA_RESULTS_JSONL=str(out / "results.jsonl"),
                        TESSERA_BENCH_RESULTS=str(self.bench_results),
                        PYTHONPATH=os.pathsep.join([str(ROOT), str(BENCH)] + (
                            [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def log(self, text: str, file: str = "log.txt") -> None:
        print(text, flush=True)
        with open(self.out / file, "a") as f:
            f.write(text + "\n")

    def run(self, step: Step) -> None:
        left = self.left_s()
        if step.estimate_s > left and not self.dry_run:
            self.log(f"== {step.name}: not started ({step.estimate_s:.0f} s expected, {left:.0f} s of budget left)")
            self.summary["steps"].append({"step": step.name, "status": "not started"})
            return
        limit = min(step.bound_s, max(left, 1.0))
        self.log(f"== {step.name} (tier {step.tier}, up to {limit:.0f} s): {' '.join(step.command)}", step.log)
        began = time.monotonic()
        status = self._execute(step, limit)
        seconds = time.monotonic() - began
        self.log(f"== {step.name}: {status} after {seconds:.1f} s", step.log)
        self.summary["steps"].append({"step": step.name, "status": status, "seconds": round(seconds, 1)})
        self._collect_benchmarks()

    def _execute(self, step: Step, limit: float) -> str:
        """Run the step's command in its own process group, its output appended line by line to its log."""
        with open(self.out / step.log, "a") as log:
            process = subprocess.Popen(step.command, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, start_new_session=True)
            deadline = time.monotonic() + limit
            timed_out = _pump(process, log, deadline)
            if timed_out:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                return f"killed at its {limit:.0f} s limit"
        return "ok" if process.returncode == 0 else f"exit code {process.returncode}"

    def _collect_benchmarks(self) -> None:
        """Fold every benchmark JSON written so far into summary.json; bring back the plots (`PLOTS`)."""
        for path in sorted(self.bench_results.glob("*.json")):
            self.summary["benchmarks"][path.stem] = json.loads(path.read_text())
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str) + "\n")
        for name in PLOTS:
            plot = self.bench_results / name
            if plot.exists():
                shutil.copy(plot, self.out / name)


def _pump(process: subprocess.Popen, log, deadline: float) -> bool:
    """Copy the process's output to `log` and stdout until it exits (False) or the deadline passes (True)."""
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        if selector.select(timeout=min(left, 1.0)):
            line = process.stdout.readline()
            if line:
                sys.stdout.write(line)
                sys.stdout.flush()
                log.write(line)
                log.flush()
                continue
            process.wait()
            return False
        if process.poll() is not None and not selector.select(timeout=0):
            return False


def machine_facts() -> str:
    """GPU, driver, CUDA, Python and library versions, ptxas and libdevice: what every result is read with."""
    commands = [
        ["nvidia-smi"],
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem",
         "--format=csv"],
        [sys.executable, "-c", "import sys, platform; print('python', sys.version); print(platform.platform())"],
        [sys.executable, "-c", "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda);"
         "print('device', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"],
        [sys.executable, "-c", "import llvmlite, numpy, lark, importlib.metadata as m; print('llvmlite',"
         "llvmlite.__version__, 'numpy', numpy.__version__, 'lark', lark.__version__, 'cuda-bindings',"
         "m.version('cuda-bindings'))"],
        [sys.executable, "-c", "import triton; print('triton', triton.__version__)"],
        [sys.executable, "-c", "from tessera.backends.nvptx import find_ptxas, find_libdevice;"
         "print('ptxas', find_ptxas()); print('libdevice', find_libdevice())"],
        [sys.executable, "-c", "import pytest, xdist, pytest_timeout; print('pytest', pytest.__version__,"
         "'xdist', xdist.__version__)"],
    ]
    lines = [time.strftime("date %Y-%m-%d %H:%M:%S %Z")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + (
        [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    for command in commands:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
            lines.append((done.stdout + done.stderr).strip() or f"({command[0]}: no output)")
        except (OSError, subprocess.TimeoutExpired) as error:
            lines.append(f"{' '.join(command[:2])}: {error}")
    return "\n".join(lines) + "\n"


def run_session(tier: int, budget_s: float, out: Path, dry_run: bool, only: tuple[str, ...] = ()) -> Session:
    """Run the steps of tiers up to `tier` in order, or, when `only` names steps, just those (whatever their
    tier), within `budget_s`."""
    session = Session(out, budget_s, dry_run)
    facts = machine_facts()
    (out / "machine.txt").write_text(facts)
    chosen = f"steps {', '.join(only)}" if only else f"tier {tier}"
    session.log(facts.splitlines()[0] + f"; {chosen}, budget {budget_s:.0f} s" + (", dry run" if dry_run else ""))
    for step in steps(dry_run):
        if step.name in only if only else step.tier <= tier:
            session.run(step)
    session._collect_benchmarks()
    session.log(report_text(out))
    return session


# -- the report ---------------------------------------------------------------

def report_text(folder: Path) -> str:
    """A short Markdown summary of a session folder: the tests' outcomes and each benchmark row."""
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    tests = [r for r in rows if r["bench"] == "pytest"]
    lines = []
    if tests:
        counts = {}
        for r in tests:
            counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        lines.append("pytest -m gpu: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
        lines += [f"- {r['outcome'].upper()} {r['test']}" for r in tests if r["outcome"] in ("failed", "error")]
    for r in rows:
        if r["bench"] == "launch_overhead" and "ms" in r:
            lines.append(f"- {r['case']}: {r['ms']:.2f} ms")
        elif r["bench"] == "launch_overhead":
            lines.append(f"- launch {r['case']}: {r['median_us']:.2f} µs")
        elif r["bench"] == "bandwidth":
            lines.append(f"- {r['case']}: " + (f"{r['tessera_gbps']:.0f} GB/s (torch copy {r['torch_copy_gbps']:.0f})"
                                               if "tessera_gbps" in r else "WRONG"))
        elif r["bench"] == "quant_gemm":
            lines.append(f"- quant_gemm {r['part']} {r['m']}x{r['n']}x{r['k']}: " + (
                f"{r['speedup']:.2f}x cuBLAS fp16" + (f", in a graph {r['graph_speedup']:.2f}x" if "graph_speedup"
                                                      in r else "")
                + (f", {r['hbm_share']:.0%} of HBM" if "hbm_share" in r else "")
                if "speedup" in r else "ERROR" if "error" in r else "WRONG"))
        elif r["bench"] == "attention":
            lines.append(attention_line(r))
        elif r["bench"] == "moe":
            from moe import speedup_text
            lines.append(f"- moe {r['model']} {r['tokens']} tokens: " + (
                speedup_text(r) + (f", {r['hbm_share']:.0%} of HBM" if "hbm_share" in r else "")
                if "speedup" in r else "ERROR" if any(k.endswith("error") for k in r) else "WRONG"))
        elif r["bench"] == "fusion":
            from fusion import describe
            lines.append(f"- fusion {describe(r)}")
        elif r["bench"].startswith("gemm"):
            shape = f"{r['size']}^3 {r['config']}" if "size" in r else f"{r['m']}x{r['n']}x{r['k']}"
            if "split_k" in r:
                shape += f" {r['b_layout']} split {r['split_k']}"
            theirs = r.get("cublas_tflops") or r.get("scaled_mm_tflops")
            value = (f"{r['tessera_tflops']:.0f} TFLOP/s ({r['ratio']:.0%})" if "tessera_tflops" in r
                     else "ERROR" if "error" in r else "WRONG")
            graph = (f"; in a graph {r['tessera_graph_tflops']:.0f} ({r['graph_ratio']:.0%})"
                     if "graph_ratio" in r else "")
            lines.append(f"- {r['bench']} {shape}: {value}" + (f", reference {theirs:.0f}" if theirs else "") + graph)
    return "\n".join(lines)


def attention_line(r: dict) -> str:
    """A bench/attention.py row: tessera's TFLOP/s and its ratio to cuDNN's, or decode's latency and GB/s."""
    if r["part"] == "decode":
        head = f"- attention decode B={r['B']} context={r['context']}: "
        if "tessera_graph_us" not in r:
            return head + ("ERROR" if "error" in r or "tessera_error" in r else "WRONG")
        return head + (f"{r['tessera_graph_us']:.1f} µs, {r['tessera_gbps']:.0f} GB/s"
                       + (f" ({r['hbm_share']:.0%} of HBM)" if "hbm_share" in r else "")
                       + (f", {r['vs_sdpa']:.2f}x SDPA" if "vs_sdpa" in r else ""))
    head = f"- attention {r['part']} B={r['B']} S={r['S']} D={r['D']}{' causal' if r['causal'] else ''}: "
    if "tessera_tflops" not in r:
        return head + ("WRONG" if "tessera_wrong" in r else "ERROR")
    return (head + f"{r['tessera_tflops']:.0f} TFLOP/s" + (f" ({r['vs_cudnn']:.2f}x cuDNN)" if "vs_cudnn" in r else "")
            + (f"; warp-specialized {r['tessera_ws_tflops']:.0f} ({r['ws_vs_plain']:.2f}x)" if "ws_vs_plain" in r
               else "")
            + "".join(f"; overlapped {r[f'tessera_{plan}_overlap_tflops']:.0f} ({r[f'overlap_vs_{plan}']:.2f}x {plan})"
                      for plan in ("plain", "ws") if f"overlap_vs_{plan}" in r)
            + (f"; ping-pong {r['tessera_ws_pingpong_tflops']:.0f} ({r['pingpong_vs_overlap']:.2f}x)"
               if "pingpong_vs_overlap" in r else "")
            + (f"; persistent {r['tessera_ws_persistent_tflops']:.0f} ({r['persistent_vs_ws']:.2f}x ws)"
               if "persistent_vs_ws" in r else "")
            + (f"; persistent overlapped {r['tessera_ws_overlap_persistent_tflops']:.0f} "
               f"({r['persistent_vs_overlap']:.2f}x)" if "persistent_vs_overlap" in r else "")
            + (f"; overlapped backward {r['tessera_overlap_tflops']:.0f} ({r['bwd_overlap_vs_fa2']:.2f}x)"
               if "bwd_overlap_vs_fa2" in r else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", type=int, choices=(1, 2), default=1)
    parser.add_argument("--budget", type=float, help="seconds (default: 240 for tier 1, 480 for tier 2)")
    parser.add_argument("--out", type=Path, help="output folder (default: $OUT, else bench/results/session)")
    parser.add_argument("--steps", help="comma-separated step names to run instead of a tier "
                                         "(see `steps()`: pytest-gpu, moe, attention, fusion, ...)")
    parser.add_argument("--dry-run", action="store_true", help="everything that needs no GPU")
    parser.add_argument("--report", type=Path, metavar="DIR", help="print a finished session's summary and exit")
    args = parser.parse_args()
    if args.report:
        print(report_text(args.report))
        return
    out = args.out or Path(os.environ.get("OUT") or ROOT / "bench/results/session")
    budget = args.budget if args.budget is not None else 240.0 * args.tier
    only = tuple(name.strip() for name in args.steps.split(",") if name.strip()) if args.steps else ()
    unknown = sorted(set(only) - {step.name for step in steps(dry_run=True)})
    if unknown:
        parser.error(f"--steps: no step named {', '.join(unknown)}; the steps are "
                     f"{', '.join(step.name for step in steps(dry_run=True))}")
    run_session(args.tier, budget, out, args.dry_run, only)


if __name__ == "__main__":
    main()
