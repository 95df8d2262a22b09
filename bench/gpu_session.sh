#!/usr/bin/env bash
# A GPU session in one command, in tiers that fit a short GPU window (see bench/gpu_session.py):
#
#     bash bench/gpu_session.sh                     # tier 1, 240 s budget
#     bash bench/gpu_session.sh --tier 2            # tiers 1 and 2, 480 s
#     bash bench/gpu_session.sh --dry-run           # on the CPU: everything but the GPU work
#
# The GPU machine has no network: the wheels it lacks are installed from
# ./.wheels when bench/gpu_prepare.sh put them there (carry `.wheels` along),
# into /tmp/site, ahead of the machine's own packages. Results go to $OUT when
# set (the device tool's output folder), else bench/results/session.
set -uo pipefail
cd "$(dirname "$0")/.."
# A carried wheel is installed only where the machine's own version differs.
wheels=()
for wheel in .wheels/*.whl; do
  [ -e "$wheel" ] || continue
  IFS=- read -r name version _ <<<"$(basename "$wheel")"
  have=$(python3 -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || echo none)
  [ "$have" = "$version" ] || { echo "installing $name $version (machine has $have)"; wheels+=("$wheel"); }
done
if [ ${#wheels[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "${wheels[@]}" 2>&1 | tail -2
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec python3 bench/gpu_session.py "$@"
