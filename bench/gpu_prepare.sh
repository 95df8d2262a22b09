#!/usr/bin/env bash
# Run on the CPU before a GPU session: put into ./.wheels (git-ignored; carry it
# with the device tool) the wheels the GPU machine lacks for its Python 3.12:
# lark always, llvmlite at the version installed here (the one the project
# was tested with) unless --no-llvmlite says the machine's own matches.
#
#     bash bench/gpu_prepare.sh [--no-llvmlite]
#
# Everything that travels (tree + .wheels) must stay under 64 MiB. The
# llvmlite wheel alone is about 57 MiB (deflate), so it travels as an xz
# tarball of its files instead (about 38 MiB; compressing takes ~2 minutes,
# once per version), which gpu_session.sh unpacks where pip would install
# it; the size is checked here.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .wheels
rm -f .wheels/*.whl
want() { python3 -c "import importlib.metadata as m; print(m.version('$1'))"; }
packages=("lark==$(want lark)")
llvmlite_archive=".wheels/llvmlite-$(want llvmlite).tar.xz"
find .wheels -name '*.tar.xz' ! -path "$llvmlite_archive" -delete      # other versions
if [ "${1:-}" = "--no-llvmlite" ]; then rm -f "$llvmlite_archive"
elif [ ! -e "$llvmlite_archive" ]; then packages+=("llvmlite==$(want llvmlite)"); fi
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .wheels "${packages[@]}"
# A wheel with no scripts and no .data folder installs by unpacking it into the target folder.
for wheel in .wheels/llvmlite-*.whl; do
  [ -e "$wheel" ] || continue
  files=$(mktemp -d)
  python3 -m zipfile -e "$wheel" "$files"
  if ls -d "$files"/*.data >/dev/null 2>&1; then echo "$wheel has a .data folder: it travels as a wheel"
  else
    chmod -R u+rwX,go+rX "$files"
    tar -C "$files" -cf - . | xz -9 -T0 >"$llvmlite_archive.part" && mv "$llvmlite_archive.part" "$llvmlite_archive"
    rm -f "$wheel"
  fi
  rm -rf "$files"
done
ls -l .wheels
tree_kib=$(git ls-files -z --cached --others --exclude-standard | du -ck --files0-from=- | tail -1 | cut -f1)
wheels_kib=$(du -sk .wheels | cut -f1)
total_mib=$(( (tree_kib + wheels_kib) / 1024 ))
echo "travels: tree ${tree_kib} KiB + wheels ${wheels_kib} KiB = ${total_mib} MiB (limit 64)"
results_kib=$(git ls-files -z bench/results | du -ck --files0-from=- | tail -1 | cut -f1)
[ "$total_mib" -lt 64 ] || { echo "over the 64 MiB limit: try --no-llvmlite if the machine's llvmlite matches, or move" \
  "the committed session folders aside for the device call (${results_kib} KiB; the session does not read them):" \
  "mkdir -p /tmp/parked && mv bench/results/20*/ /tmp/parked/, and back with mv /tmp/parked/* bench/results/"; exit 1; }
python3 bench/gpu_session.py --dry-run --out "${TMPDIR:-/tmp}/tessera-dry-run" --tier 2 >/dev/null \
  && echo "dry run of both tiers: ok (${TMPDIR:-/tmp}/tessera-dry-run)"
