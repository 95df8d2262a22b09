"""The `tessera` command line.

    tessera ir FILE.py:KERNEL --signature '*f32,*f32,*f32,i32' --const BLOCK=1024
    tessera compile FILE.py:KERNEL -s '*f32:16,*f32:16,*f32:16,i32' -c BLOCK=1024 --target sm_90a -o out/
    tessera link out16/KERNEL.json out/KERNEL.json -o linked/
    tessera cache info | list | clear
    tessera doctor

Bad arguments print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import sys
from pathlib import Path

from .version import __version__


SIGNATURE_HELP = """\
signatures (--signature/-s) list the kernel's runtime parameters in order, comma-separated;
constexpr parameters are not listed, they come from --const NAME=VALUE:
  *DTYPE      a pointer to DTYPE elements (*f32, *bf16, *u4, ...)
  *DTYPE:16   ... whose address is a multiple of 16 bytes (allows 128-bit accesses, TMA)
  DTYPE       a scalar (i32, i64, f32, bool, ...)
  INT:16      an integer known to be a multiple of 16
  INT:1       an integer known to equal 1
example: tessera ir tutorials/01-vector-add.py:add -s '*f32:16,*f32:16,*f32:16,i32' -c BLOCK=1024"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tessera", description="Tessera tile-kernel compiler",
                                     epilog=SIGNATURE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"tessera {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    ir = commands.add_parser("ir", help="print a kernel's tile IR for a signature", epilog=SIGNATURE_HELP,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    ir.add_argument("target", help="FILE.py:KERNEL")
    ir.add_argument("--signature", "-s", default="", help="runtime parameters, e.g. '*f32:16,*f32,i32'")
    ir.add_argument("--const", "-c", action="append", default=[], metavar="NAME=VALUE", help="a constexpr value")

    compile_ = commands.add_parser("compile", help="compile a kernel ahead of time to PTX (and cubin with ptxas) "
                                       "or AMDGCN (and hsaco with ld.lld)", epilog=SIGNATURE_HELP,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    compile_.add_argument("target_kernel", metavar="FILE.py:KERNEL")
    compile_.add_argument("--signature", "-s", default="", help="runtime parameters, e.g. '*f32:16,*f32,i32'")
    compile_.add_argument("--const", "-c", action="append", default=[], metavar="NAME=VALUE", help="a constexpr value")
    compile_.add_argument("--target", "-t", default="sm_80", help="GPU target (sm_80, sm_89, sm_90, sm_90a, sm_100, gfx90a, gfx942, gfx950)")
    compile_.add_argument("--num-warps", "-w", type=int, default=4, help="warps per block (default 4)")
    compile_.add_argument("--output", "-o", default=".", help="directory to write into (default: .)")

    link = commands.add_parser("link", help="one C launch function over several compiled specializations of a "
                                            "kernel, picking the most specialized one the arguments allow")
    link.add_argument("manifests", nargs="+", metavar="KERNEL.json", help="manifests written by tessera compile")
    link.add_argument("--name", "-n", help="the C name of the dispatcher (default: the kernel's)")
    link.add_argument("--output", "-o", default=".", help="directory to write into (default: .)")

    cache = commands.add_parser("cache", help="inspect or empty the binary cache ($TESSERA_CACHE_DIR)")
    cache.add_argument("action", choices=["info", "list", "clear"])

    commands.add_parser("doctor", help="show what this installation can do")

    args = parser.parse_args(argv)
    try:
        if args.command == "ir":
            return _print_ir(args)
        if args.command == "compile":
            return _compile(args)
        if args.command == "cache":
            return _cache(args.action)
        if args.command == "link":
            return _link(args)
        return _doctor()
    except _UsageError as exc:
        print(f"tessera: error: {exc}", file=sys.stderr)
        return 2


class _UsageError(Exception):
    pass


def _import_file(path: Path):
    """Import FILE.py: as its package's module when it lives in a package (folders with __init__.py, so its
    relative imports work and a library file is the module already imported, not a second copy), else as a
    script, with its folder on sys.path for its own imports."""
    path = path.resolve()
    parts, folder = [path.stem], path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    if len(parts) > 1:
        sys.path.insert(0, str(folder))
        try:
            return importlib.import_module(".".join(parts))
        finally:
            sys.path.remove(str(folder))
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    return module


def load_kernel(target: str):
    """Import FILE.py and return its @tessera.kernel named KERNEL."""
    from .dsl.kernel import Kernel

    file, sep, name = target.rpartition(":")
    if not sep or not file or not name:
        raise _UsageError(f"expected FILE.py:KERNEL, got {target!r}")
    path = Path(file)
    if not path.is_file():
        raise _UsageError(f"no such file: {file}")
    module = _import_file(path)
    def as_kernel(value):
        """The @tessera.kernel itself, also under @tessera.autotune (compiled with the configs given here)."""
        inner = getattr(value, "kernel", None)
        return value if isinstance(value, Kernel) else inner if isinstance(inner, Kernel) else None

    kernel = as_kernel(getattr(module, name, None))
    if kernel is None:
        kernels = sorted(n for n, v in vars(module).items() if as_kernel(v) is not None)
        close = difflib.get_close_matches(name, kernels, n=1)
        hint = (f"; did you mean {close[0]!r}?" if close else
                f"; its kernels are: {', '.join(kernels)}" if kernels else "; it defines no kernels")
        raise _UsageError(f"{file} has no @tessera.kernel named {name!r}{hint}")
    return kernel


def _constexprs(items: list[str]) -> dict:
    from .dsl.signature import parse_constexpr

    constexprs = {}
    for item in items:
        key, eq, text = item.partition("=")
        if not eq or not key:
            raise _UsageError(f"--const takes NAME=VALUE, got {item!r}")
        constexprs[key] = parse_constexpr(key, text)
    return constexprs


def _print_ir(args) -> int:
    from .dsl.tracer import build_kernel_ir
    from .dsl.errors import CompileError
    from .dsl.signature import SignatureError, parse_signature
    from .ir.printer import print_module

    kernel = load_kernel(args.target)
    try:
        params = parse_signature(kernel.source, args.signature, _constexprs(args.const))
        print(print_module(build_kernel_ir(kernel.source, params)), end="")
    except SignatureError as exc:
        raise _UsageError(str(exc)) from None
    except CompileError as exc:
        print(exc.with_kernel(kernel.name), file=sys.stderr)
        return 1
    return 0


def _compile(args) -> int:
    import json

    from .dsl.errors import CompileError, KernelArgumentError
    from .ir.target import TARGETS

    if args.target not in TARGETS:
        raise _UsageError(f"unknown or unsupported target {args.target!r}; choose one of {', '.join(TARGETS)}")
    if args.num_warps not in (1, 2, 4, 8, 16):
        raise _UsageError(f"--num-warps must be 1, 2, 4, 8 or 16, got {args.num_warps}")
    kernel = load_kernel(args.target_kernel)
    constexprs = _constexprs(args.const)
    try:
        compiled = kernel.compile(signature=args.signature, target=args.target, num_warps=args.num_warps, **constexprs)
    except KernelArgumentError as exc:
        raise _UsageError(exc.message) from None
    except CompileError as exc:
        print(exc.with_kernel(kernel.name), file=sys.stderr)
        return 1
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    amd = TARGETS[args.target].vendor == "amd"
    assembly_stage, assembly_suffix = ("amdgcn", "s") if amd else ("ptx", "ptx")
    written = [out / f"{kernel.name}.{assembly_suffix}"]
    written[0].write_text(compiled.stages[assembly_stage])
    if compiled.binary is not None:
        written.append(out / f"{kernel.name}.{compiled.binary_extension}")
        written[-1].write_bytes(compiled.binary)
    binary_name = written[1].name if len(written) > 1 else None
    signature = [s.strip() for s in args.signature.split(",") if s.strip()]
    runtime_names = [n for n in kernel.source.param_names if n not in kernel.source.constexpr_params]
    manifest = {
        "kernel": kernel.name,
        "entry": compiled.name,
        "signature": signature,
        # what an AOT launcher passes, in order: name, type and the fact the specialization assumed
        "parameters": [{"name": n, "type": e.partition(":")[0], "hint": e.partition(":")[2]}
                       for n, e in zip(runtime_names, signature)],
        "constexprs": {k: getattr(v, "name", v) for k, v in constexprs.items()},
        "target": args.target,
        "num_warps": args.num_warps,
        "threads_per_block": compiled.metadata.get("num_threads"),
        "shared_memory_bytes": compiled.metadata.get("shared_bytes", 0),
        # what a launch passes as dynamic shared memory (AMD kernels use a static LDS: 0)
        "dynamic_shared_memory_bytes": compiled.metadata.get("dynamic_shared_bytes",
                                                             compiled.metadata.get("shared_bytes", 0)),
        "compiler_version": __version__,
    }
    if compiled.metadata.get("programs_per_block"):     # AMD's wave-group ping-pong: the launch divides grid_x
        manifest["programs_per_block"] = compiled.metadata["programs_per_block"]
    if amd:
        manifest.update({
            "sgprs": compiled.metadata.get("sgpr_count"),
            "vgprs": compiled.metadata.get("vgpr_count"),
            "wavefront_size": compiled.metadata.get("wavefront_size"),
            "kernarg_segment_size": compiled.metadata.get("kernarg_segment_size"),
            "assembly": written[0].name,
            "hsaco": binary_name,
        })
    else:
        manifest.update({
            "registers": compiled.metadata.get("registers"),
            "spill_bytes": compiled.metadata.get("spill_stores"),
            "ptx": written[0].name,
            "cubin": binary_name,
            # hidden by-value CUtensorMap parameters after the signature's (TMA loads): how to build each
            "tensor_maps": compiled.metadata.get("tensor_maps", []),
            # thread-block cluster shape (tessera.cluster_dims): the launch passes it (cuLaunchKernelEx)
            "cluster_dims": compiled.metadata.get("cluster_dims"),
        })
    written.append(out / f"{kernel.name}.json")
    written[-1].write_text(json.dumps(manifest, indent=2) + "\n")
    written += _write_c_launcher(out, written[-1])
    for path in written:
        print(f"wrote {path}")
    return 0


def _write_c_launcher(out: Path, manifest: Path) -> list[Path]:
    """KERNEL.h and KERNEL.c: the binary embedded, loaded and launched from C (tessera.aot)."""
    from .aot import AotError, Specialization, c_launcher

    spec = Specialization.load(manifest)
    try:
        sources = c_launcher(spec)
    except AotError as exc:
        print(f"tessera: no C launcher for {spec.kernel}: {exc}", file=sys.stderr)
        return []
    header, source = out / f"{spec.symbol}.h", out / f"{spec.symbol}.c"
    header.write_text(sources.header)
    source.write_text(sources.source)
    return [header, source]


def _link(args) -> int:
    from .aot import AotError, Specialization, c_dispatcher

    try:
        specs = [Specialization.load(m) for m in args.manifests]
        sources = c_dispatcher(specs, args.name)
    except AotError as exc:
        raise _UsageError(str(exc)) from None
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or specs[0].symbol
    for path, text in ((out / f"{name}.h", sources.header), (out / f"{name}.c", sources.source)):
        path.write_text(text)
        print(f"wrote {path}")
    return 0


def _cache(action: str) -> int:
    import datetime

    from .runtime.cache import BinaryCache

    cache = BinaryCache()
    if action == "clear":
        print(f"removed {cache.clear()} entries from {cache.directory}")
    elif action == "list":
        entries = list(cache.entries())
        if not entries:
            print(f"the cache at {cache.directory} is empty")
        for entry in entries:
            when = datetime.datetime.fromtimestamp(entry.mtime).strftime("%Y-%m-%d %H:%M")
            state = "" if entry.valid else "  (damaged: will be recompiled)"
            print(f"{entry.key[:16]}  {entry.kernel or '?':<24} {entry.target or '?':<8} {entry.size:>9} B  {when}{state}")
    else:
        info = cache.info()
        print(f"directory: {info['directory']}{'' if info['enabled'] else ' (disabled: TESSERA_CACHE_DIR is empty)'}")
        print(f"entries: {info['entries']}, {info['total_bytes']} bytes")
    return 0


def _doctor() -> int:
    """What this installation can do: versions, tools, GPUs and their drivers, the cache."""
    import llvmlite
    import numpy

    print(f"tessera {__version__} (python {sys.version.split()[0]}, numpy {numpy.__version__}, "
          f"llvmlite {llvmlite.__version__})")
    print(f"torch: {_torch_version() or 'not installed (pip install torch: needed by tessera.kernels_lib)'}")
    from .backends.nvptx import find_ptxas

    print(f"ptxas: {find_ptxas() or 'not found (pip install nvidia-cuda-nvcc-cu12 for cubins)'}")
    from .backends.amdgpu import find_linker

    print(f"ld.lld: {find_linker() or 'not found (pip install ziglang for hsaco code objects)'}")
    for line in _gpu_lines():
        print(line)
    print("backends: CPU tile interpreter, SIMT simulator, NVPTX (PTX; cubin with ptxas), "
          "AMDGPU (AMDGCN; hsaco with ld.lld)")
    from .runtime.cache import BinaryCache

    info = BinaryCache().info()
    print(f"binary cache: {info['directory']} ({info['entries']} entries, {info['total_bytes']} bytes"
          f"{'' if info['enabled'] else '; disabled: TESSERA_CACHE_DIR is empty'})")
    return 0


def _torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return f"{torch.__version__} (CUDA {torch.version.cuda}, HIP {torch.version.hip})"


def _gpu_lines() -> list[str]:
    """One line per GPU runtime: its driver and devices, or why there are none (never initializes a GPU
    that is not there)."""
    from .runtime import cuda, hip
    from .runtime.errors import LaunchError

    lines = []
    for name, runtime in (("NVIDIA", cuda), ("AMD", hip)):
        if not runtime.driver_available():
            lines.append(f"{name} GPUs: no driver found")
            continue
        try:
            devices = [runtime.get_device(i) for i in range(runtime.device_count())]
            described = ", ".join(f"{i}: {d.name} ({d.target})" for i, d in enumerate(devices)) or "none"
            driver = f" (driver for CUDA {cuda.driver_version()})" if runtime is cuda else ""
            lines.append(f"{name} GPUs{driver}: {described}")
        except LaunchError as exc:
            lines.append(f"{name} GPUs: the driver is there but failed: {str(exc).splitlines()[0]}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
