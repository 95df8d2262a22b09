"""Compile time of the tutorial kernels, stage by stage, cold and warm; Triton beside them when installed.

    python bench/compile_time.py [--target sm_90a] [--repeat 5] [--json bench/results/compile_time.json]

* cold: the first compile in a fresh process (imports excluded; LLVM's own
  first-use setup included), measured in a child process per kernel;
* warm: the median of later compiles in the same process (tracing
  included: the in-memory specialization cache is cleared each time).

Compiling for a GPU target needs no GPU. With Triton installed, the same
three kernels written in Triton are compiled for the same target with
`triton.compile` (a fresh cache directory for cold, the warm cache for warm).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# kernel file, kernel name, signature, constexprs
KERNELS = {
    "vector_add": ("tutorials/01-vector-add.py", "add", "*f32:16,*f32:16,*f32:16,i32:16", {"BLOCK": 1024}),
    "softmax": ("tutorials/02-fused-softmax.py", "softmax", "*f32:16,*f32:16,i32,i32", {"BLOCK": 1024}),
    "matmul": ("tutorials/03-matmul.py", "matmul", "*f16:16,*f16:16,*f16:16,i32,i32,i32",
               {"BM": 64, "BN": 64, "BK": 32}),
}


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem.replace("-", "_"), ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def compile_once(key: str, target: str) -> dict:
    """Trace and compile one kernel; returns seconds per stage."""
    path, name, signature, constexprs = KERNELS[key]
    kernel = load(path, name)
    kernel.specializations.clear()
    start = time.perf_counter()
    compiled = kernel.compile(signature=signature, target=target, **constexprs)
    total = time.perf_counter() - start
    stages = dict(compiled.metadata["stage_seconds"])
    stages["trace"] = total - sum(stages.values())
    stages["total"] = total
    return stages


def cold(key: str, target: str) -> dict:
    """One compile in a fresh interpreter (the package imported first, outside the timing)."""
    code = (f"import sys, json; sys.path.insert(0, {str(ROOT / 'bench')!r}); import tessera, compile_time; "
            f"print(json.dumps(compile_time.compile_once({key!r}, {target!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def warm(key: str, target: str, repeat: int) -> dict:
    compile_once(key, target)
    runs = [compile_once(key, target) for _ in range(repeat)]
    return {stage: statistics.median(r[stage] for r in runs) for stage in runs[0]}


def triton_times(target: str, repeat: int) -> dict | None:
    try:
        import triton  # noqa: F401
    except ImportError:
        return None
    code = (f"import sys, json; sys.path.insert(0, {str(ROOT / 'bench')!r}); import triton_kernels; "
            f"print(json.dumps(triton_kernels.compile_times({target!r}, {repeat})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="sm_90a")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="where to write the results (default: compile_time.json in "
                                         "$TESSERA_BENCH_RESULTS, else bench/results)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = parser.parse_args()
    if args.dry_run:
        print(f"compile_time: {', '.join(KERNELS)} for {args.target}, cold and warm (x{args.repeat}), Triton beside")
        return
    folder = os.environ.get("TESSERA_BENCH_RESULTS", str(ROOT / "bench" / "results"))
    args.json = args.json or str(Path(folder) / "compile_time.json")

    import llvmlite
    import tessera

    results = {"target": args.target, "tessera": tessera.__version__, "llvmlite": llvmlite.__version__,
               "python": platform.python_version(), "machine": platform.machine(),
               "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "kernels": {}}
    print(f"{'kernel':<12} {'cold s':>8} {'warm s':>8}   warm stages (ms)")
    for key in KERNELS:
        c, w = cold(key, args.target), warm(key, args.target, args.repeat)
        results["kernels"][key] = {"cold": c, "warm": w}
        stages = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in w.items() if k != "total")
        print(f"{key:<12} {c['total']:8.3f} {w['total']:8.3f}   {stages}")
    triton = triton_times(args.target, args.repeat)
    results["triton"] = triton
    if triton is None:
        print("triton: not installed (pip install triton to compare)")
    else:
        for key, t in triton.items():
            print(f"triton {key:<5} {t}" if not isinstance(t, dict) else
                  f"triton {key:<12} cold {t['cold']:.3f} s, warm {t['warm']:.4f} s")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
