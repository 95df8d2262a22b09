"""Thread IR -> PTX -> cubin: the NVPTX backend's one entry point.

    artifacts = compile_thread_ir(fn, "sm_90a")
    artifacts.ptx, artifacts.cubin, artifacts.ptxas_info["registers"]

Steps: resolve the target and libdevice, validate the function
(`validate.py` and the LLVM core's checks with `NvptxDialect`), build the
LLVM module (`tessera.backends.llvm.codegen`), run LLVM (the core's
`optimize.py`: parse, link libdevice, verify, O3, emit PTX), and assemble
with ptxas when one is found (`ptxas.py`).

LLVM runs in the compile worker process (`tessera.backends.llvm.run`),
where a crash becomes a `BackendError` carrying LLVM's message and a hang
a `CompileTimeoutError`; `isolate=False` (or `TESSERA_ISOLATE=0`) runs it
in this process.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

from tessera.ir.core import Function
from tessera.ir.target import Target

from ..llvm.codegen import codegen_function
from ..llvm.run import prepare as prepare_llvm
from ..llvm.run import run_llvm, run_llvm_isolated
from .dialect import NvptxDialect
from .errors import CodegenError, PtxasError
from .ptxas import assemble as run_ptxas
from .ptxas import find_ptxas
from .toolkit import find_libdevice
from .validate import resolve_target, validate_function

_run_llvm_isolated = functools.partial(run_llvm_isolated, backend="NVPTX")


@dataclass(frozen=True)
class NvptxArtifacts:
    """What compiling one kernel produced."""

    kernel: str                 # the .entry name in the PTX / cubin
    target: str                 # sm_80, sm_90a, ...
    llvm_ir: str                # the module as generated, before optimization
    optimized_llvm_ir: str      # after O3 (and libdevice linking)
    ptx: str
    cubin: bytes | None         # None when no ptxas was found (or assemble=False)
    ptxas_info: dict = field(default_factory=dict)  # see ptxas.parse_info; {} without a cubin
    num_threads: int = 0        # block size the kernel was lowered for (its .maxntid)
    shared_bytes: int = 0       # dynamic shared memory to pass at launch
    libdevice_functions: tuple[str, ...] = ()


def compile_thread_ir(fn: Function, target: Target | str | None = None, *, isolate: bool | None = None,
                      assemble: bool | None = None, libdevice: str | os.PathLike | bool | None = None,
                      fp_fusion: bool = False, opt_level: int = 3) -> NvptxArtifacts:
    """Compile thread-IR kernel `fn` for NVIDIA `target` (a Target or its name; default: fn's `target` attr).

    isolate:   run LLVM in the compile worker process (default: yes, unless $TESSERA_ISOLATE=0).
    assemble:  True needs ptxas, False skips it, None (default) assembles when ptxas is found.
    libdevice: path to libdevice.10.bc, False for hardware approximations, None to search (toolkit.py).
    fp_fusion: let LLVM fuse a*b+c into fma (faster; one rounding instead of the interpreter's two).
    """
    target = resolve_target(target if target is not None else fn.attrs.get("target"))
    prepare_llvm(isolate)
    libdevice_path = _resolve_libdevice(libdevice)
    dialect = NvptxDialect(target, use_libdevice=libdevice_path is not None)
    validate_function(fn, dialect)
    lowered = codegen_function(fn, dialect, fp_fusion=fp_fusion)
    llvm_ir = str(lowered.module)
    request = {
        "llvm_ir": llvm_ir, "kernel": lowered.kernel, "triple": target.llvm_triple, "cpu": target.llvm_cpu,
        "features": target.llvm_features, "opt_level": opt_level,
        "bitcode_library": str(libdevice_path) if lowered.library_functions else None,
        "library_functions": sorted(lowered.library_functions),
    }
    result = run_llvm(request, isolate=isolate, backend="NVPTX")
    cubin, info = _assemble(result["assembly"], target, assemble)
    return NvptxArtifacts(
        kernel=lowered.kernel, target=target.name, llvm_ir=llvm_ir, optimized_llvm_ir=result["optimized_ir"],
        ptx=result["assembly"], cubin=cubin, ptxas_info=info, num_threads=int(fn.attrs["num_threads"]),
        shared_bytes=int(fn.attrs.get("shared_bytes", 0)), libdevice_functions=tuple(request["library_functions"]),
    )


def _resolve_libdevice(libdevice) -> Path | None:
    if libdevice is False:
        return None
    if libdevice is None or libdevice is True:
        found = find_libdevice()
        if found is None and libdevice is True:
            raise CodegenError("libdevice=True but no libdevice.10.bc was found; set TESSERA_LIBDEVICE or "
                                "install the CUDA toolkit / `pip install nvidia-nvvm`")
        return found
    path = Path(libdevice)
    if not path.is_file():
        raise CodegenError(f"libdevice {str(path)!r} is not a file")
    return path


def _assemble(ptx: str, target: Target, assemble: bool | None) -> tuple[bytes | None, dict]:
    if assemble is False:
        return None, {}
    tool = find_ptxas()
    if tool is None:
        if assemble:
            raise PtxasError("assemble=True but no ptxas was found: put it on PATH, set CUDA_HOME or "
                             "TESSERA_PTXAS, or `pip install nvidia-cuda-nvcc`")
        return None, {}
    return run_ptxas(ptx, target.llvm_cpu, tool)
