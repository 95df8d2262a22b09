"""The `tessera` command line.

    tessera ir FILE.py:KERNEL --signature '*f32,*f32,*f32,i32' --const BLOCK=1024
    tessera doctor

Bad arguments print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from pathlib import Path

from . import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tessera", description="Tessera tile-kernel compiler")
    parser.add_argument("--version", action="version", version=f"tessera {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    ir = commands.add_parser("ir", help="print a kernel's tile IR for a signature")
    ir.add_argument("target", help="FILE.py:KERNEL")
    ir.add_argument("--signature", "-s", default="", help="runtime parameters, e.g. '*f32:16,*f32,i32'")
    ir.add_argument("--const", "-c", action="append", default=[], metavar="NAME=VALUE", help="a constexpr value")

    commands.add_parser("doctor", help="show what this installation can do")

    args = parser.parse_args(argv)
    try:
        if args.command == "ir":
            return _print_ir(args)
        return _doctor()
    except _UsageError as exc:
        print(f"tessera: error: {exc}", file=sys.stderr)
        return 2


class _UsageError(Exception):
    pass


def load_kernel(target: str):
    """Import FILE.py and return its @tessera.kernel named KERNEL."""
    from .dsl.kernel import Kernel

    file, sep, name = target.rpartition(":")
    if not sep or not file or not name:
        raise _UsageError(f"expected FILE.py:KERNEL, got {target!r}")
    path = Path(file)
    if not path.is_file():
        raise _UsageError(f"no such file: {file}")
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    kernel = getattr(module, name, None)
    if not isinstance(kernel, Kernel):
        raise _UsageError(f"{file} has no @tessera.kernel named {name!r}")
    return kernel


def _print_ir(args) -> int:
    from .dsl.codegen import build_kernel_ir
    from .dsl.errors import CompileError
    from .dsl.signature import SignatureError, parse_constexpr, parse_signature
    from .ir.printer import print_module

    kernel = load_kernel(args.target)
    constexprs = {}
    for item in args.const:
        key, eq, value = item.partition("=")
        if not eq:
            raise _UsageError(f"--const takes NAME=VALUE, got {item!r}")
        constexprs[key] = value
    try:
        constexprs = {key: parse_constexpr(key, text) for key, text in constexprs.items()}
        params = parse_signature(kernel.source, args.signature, constexprs)
        print(print_module(build_kernel_ir(kernel.source, params)), end="")
    except SignatureError as exc:
        raise _UsageError(str(exc)) from None
    except CompileError as exc:
        print(exc.with_kernel(kernel.name), file=sys.stderr)
        return 1
    return 0


def _doctor() -> int:
    import llvmlite
    import numpy

    print(f"tessera {__version__} (python {sys.version.split()[0]}, numpy {numpy.__version__}, "
          f"llvmlite {llvmlite.__version__})")
    print(f"ptxas: {shutil.which('ptxas') or 'not found'}")
    print(f"ld.lld: {shutil.which('ld.lld') or 'not found'}")
    print("backends: CPU tile interpreter")
    return 0


if __name__ == "__main__":
    sys.exit(main())
