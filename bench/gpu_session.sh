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
# A carried wheel (or a wheel's files as NAME-VERSION.tar.xz, see gpu_prepare.sh) is installed into
# /tmp/site only where the machine's own version differs.
differs() {
  local have
  have=$(python3 -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || echo none)
  [ "$have" != "$2" ] && echo "installing $1 $2 (machine has $have)"
}
wheels=()
for wheel in .wheels/*.whl; do
  [ -e "$wheel" ] || continue
  IFS=- read -r name version _ <<<"$(basename "$wheel")"
  differs "$name" "$version" && wheels+=("$wheel")
done
site=0
if [ ${#wheels[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "${wheels[@]}" 2>&1 | tail -2
  site=1
fi
for archive in .wheels/*.tar.xz; do
  [ -e "$archive" ] || continue
  IFS=- read -r name version <<<"$(basename "$archive" .tar.xz)"
  differs "$name" "$version" && mkdir -p /tmp/site && tar -xJf "$archive" -C /tmp/site && site=1
done
[ "$site" = 0 ] || export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec python3 bench/gpu_session.py "$@"
