#!/usr/bin/env bash
# Everything a lent GPU machine should do, in one command (GPU time is scarce):
# record the machine, run the GPU-marked tests, then every benchmark.
#
#     bash bench/gpu_session.sh            # on a machine with an NVIDIA GPU
#
# The device machine has no network: wheels it lacks (lark, hypothesis, ...)
# are installed from ./.wheels when that folder was carried along, e.g.
#     pip download lark hypothesis sortedcontainers attrs -d .wheels
# Logs and JSON go to bench/results/ and, when $OUT is set (the device tool's
# output folder), are copied there too.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS="${OUT:-bench/results}"
mkdir -p "$LOGS" bench/results

if [ -d .wheels ]; then
  python3 -m pip install -q --no-index --find-links .wheels lark hypothesis pytest 2>&1 | tail -2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

{
  nvidia-smi
  python3 -c 'import sys, torch, llvmlite; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda); print("llvmlite", llvmlite.__version__)'
  python3 -c 'import triton; print("triton", triton.__version__)' || true
} 2>&1 | tee "$LOGS/machine.txt"

python3 -m pytest -m gpu -q -rs -p no:cacheprovider 2>&1 | tee "$LOGS/pytest-gpu.txt"

for bench in launch_overhead bandwidth gemm compile_time; do
  echo "== bench/$bench.py"
  timeout 900 python3 "bench/$bench.py" 2>&1 | tee "$LOGS/bench-$bench.txt"
done

if [ -n "${OUT:-}" ]; then
  cp bench/results/*.json "$OUT"/ 2>/dev/null
  cp bench/results/*.png "$OUT"/ 2>/dev/null
fi
exit 0
