"""Shared helpers for the GPU benchmarks: device facts, timing, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def results_dir() -> Path:
    """Where a benchmark writes its JSON and plot: $TESSERA_BENCH_RESULTS (set by bench/gpu_session.py) or
    bench/results."""
    return Path(os.environ.get("TESSERA_BENCH_RESULTS", RESULTS))


def record(bench: str, row: dict) -> None:
    """Append one finished result row to $TESSERA_RESULTS_JSONL at once (flushed), so that a session cut off
    at its time limit keeps every row measured before the cut. A no-op when the variable is unset."""
    path = os.environ.get("TESSERA_RESULTS_JSONL")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"bench": bench, **row}, default=str) + "\n")
        f.flush()


def require_gpu():
    """torch with a CUDA device, or exit 0 with a note (benchmarks measure GPUs only)."""
    try:
        import torch
    except ImportError:
        print("torch is not installed: GPU benchmarks need it (pip install -e '.[torch]')")
        sys.exit(0)
    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to measure")
        sys.exit(0)
    return torch


def environment(torch) -> dict:
    """GPU name, driver, versions and date, recorded with every result."""
    import llvmlite

    import tessera
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"gpu": torch.cuda.get_device_name(), "driver": driver, "cuda": torch.version.cuda,
            "torch": torch.__version__, "triton": triton_version, "tessera": tessera.__version__,
            "llvmlite": llvmlite.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d")}


def median_us(fn, torch, warmup: int = 100, iters: int = 2000) -> float:
    """Median wall time of one host-side call, in µs (launch overhead: the GPU work is tiny)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1e3)
    torch.cuda.synchronize()
    return statistics.median(samples)


def device_ms(fn, torch, warmup: int = 10, iters: int = 50) -> float:
    """Median GPU time of `fn` in ms, with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graph_ms(fn, torch, calls: int = 20, replays: int = 10) -> float:
    """Median GPU time of one call of `fn` with the host out of the way: `calls` calls captured in one CUDA
    graph, each replay timed with events, divided by `calls`. Where `fn` costs more host time than GPU time
    (a small GEMM behind Python), `device_ms` measures the host; this measures the kernels."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                  # warm-up off the capture: compiled, tuned and loaded
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def write(name: str, payload: dict) -> Path:
    """The benchmark's whole result as `<results_dir>/<name>.json`."""
    folder = results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")
    return path


def ratio_plot(path, labels: list[str], bars: dict[str, list[float]], ylabel: str) -> None:
    """Side-by-side bars of ratios per labelled row (one series per entry of `bars`) with a line at 1.0, to
    `path`; nothing without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(max(12, len(labels) * 0.25), 4))
    width = 0.8 / len(bars)
    for j, (name, values) in enumerate(bars.items()):
        ax.bar([i + (j - (len(bars) - 1) / 2) * width for i in range(len(labels))], values, width=width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.legend()
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
