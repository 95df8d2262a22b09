"""`python3 -m tests.goldens [--update] [--target T ...]`: check the goldens, or rewrite them on purpose."""

from __future__ import annotations

import argparse
import sys

from . import store
from .cases import TARGETS, generate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.goldens", description=__doc__)
    parser.add_argument("--update", action="store_true", help="rewrite the golden files with what this tree emits")
    parser.add_argument("--target", action="append", choices=TARGETS, help="only these targets (default: all)")
    args = parser.parse_args(argv)
    failed = False
    for target in args.target or TARGETS:
        generated = generate(target)
        if args.update:
            path = store.save(target, generated)
            print(f"{target}: {len(generated.kernels)} kernels -> {path} ({path.stat().st_size} bytes)")
            continue
        recorded = store.load(target)
        if recorded is None:
            print(f"{target}: no goldens recorded; run with --update")
            failed = True
            continue
        report = store.compare(target, recorded, generated)
        if report.not_compared:
            print(f"{target}: {report.not_compared}")
        print(f"{target}: {len(generated.kernels)} kernels, " + ("identical" if report.ok else report.summary()))
        failed |= not report.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
