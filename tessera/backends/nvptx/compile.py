"""Thread IR -> PTX -> cubin: the NVPTX backend's one entry point.

    artifacts = compile_thread_ir(fn, "sm_90a")
    artifacts.ptx, artifacts.cubin, artifacts.ptxas_info["registers"]

Steps: resolve the target and libdevice, validate the function
(`validate.py`), build the LLVM module (`llvm_codegen.py`), run LLVM
(`llvm_pipeline.py`: parse, link libdevice, verify, O3, emit PTX), and
assemble with ptxas when one is found (`ptxas.py`).

LLVM runs in this process by default: the validator admits only targets,
dtypes and ops whose LLVM patterns the test matrix compiles for every
supported dtype, so nothing that reaches LLVM should abort. `isolate=True`
(or `TESSERA_NVPTX_ISOLATE=1`) runs the LLVM step in a child process
instead (`python -P llvm_pipeline.py`, ~0.2 s more per kernel): a crash
there becomes a `BackendError` carrying LLVM's message. A child started
with `subprocess` rather than `multiprocessing`'s spawn does not re-import
the caller's `__main__`, and its stderr (where LLVM writes before it
aborts) is captured whole.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import llvmlite

from tessera.ir.core import Function
from tessera.ir.target import Target

from . import llvm_pipeline
from .errors import BackendError, LoweringError, PtxasError
from .llvm_codegen import lower_function
from .ptxas import assemble as run_ptxas
from .ptxas import find_ptxas
from .toolkit import find_libdevice
from .validate import resolve_target, validate_function

ISOLATE_ENV = "TESSERA_NVPTX_ISOLATE"
CHILD_TIMEOUT_S = 600


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

    isolate:   run LLVM in a child process (default: in-process unless $TESSERA_NVPTX_ISOLATE=1).
    assemble:  True needs ptxas, False skips it, None (default) assembles when ptxas is found.
    libdevice: path to libdevice.10.bc, False for hardware approximations, None to search (toolkit.py).
    fp_fusion: let LLVM fuse a*b+c into fma (faster; one rounding instead of the interpreter's two).
    """
    target = resolve_target(target if target is not None else fn.attrs.get("target"))
    libdevice_path = _resolve_libdevice(libdevice)
    validate_function(fn, target, has_libdevice=libdevice_path is not None)
    lowered = lower_function(fn, target, use_libdevice=libdevice_path is not None, fp_fusion=fp_fusion)
    llvm_ir = str(lowered.module)
    request = {
        "llvm_ir": llvm_ir, "kernel": lowered.kernel, "triple": target.llvm_triple, "cpu": target.llvm_cpu,
        "features": target.llvm_features, "opt_level": opt_level,
        "libdevice": str(libdevice_path) if lowered.libdevice_functions else None,
        "libdevice_functions": sorted(lowered.libdevice_functions),
    }
    if isolate is None:
        isolate = os.environ.get(ISOLATE_ENV, "") not in ("", "0")
    result = _run_llvm_isolated(request) if isolate else _run_llvm(request)
    cubin, info = _assemble(result["ptx"], target, assemble)
    return NvptxArtifacts(
        kernel=lowered.kernel, target=target.name, llvm_ir=llvm_ir, optimized_llvm_ir=result["optimized_ir"],
        ptx=result["ptx"], cubin=cubin, ptxas_info=info, num_threads=int(fn.attrs["num_threads"]),
        shared_bytes=int(fn.attrs.get("shared_bytes", 0)), libdevice_functions=tuple(request["libdevice_functions"]),
    )


def _resolve_libdevice(libdevice) -> Path | None:
    if libdevice is False:
        return None
    if libdevice is None or libdevice is True:
        found = find_libdevice()
        if found is None and libdevice is True:
            raise LoweringError("libdevice=True but no libdevice.10.bc was found; set TESSERA_LIBDEVICE or "
                                "install the CUDA toolkit / `pip install nvidia-nvvm`")
        return found
    path = Path(libdevice)
    if not path.is_file():
        raise LoweringError(f"libdevice {str(path)!r} is not a file")
    return path


def _run_llvm(request: dict) -> dict:
    try:
        return llvm_pipeline.compile_llvm(**request)
    except llvm_pipeline.LLVMError as e:
        raise BackendError(_internal_error(request, str(e))) from None


def _run_llvm_isolated(request: dict) -> dict:
    env = dict(os.environ)
    llvmlite_home = str(Path(llvmlite.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [llvmlite_home, env.get("PYTHONPATH")]))
    command = [sys.executable, "-P", llvm_pipeline.__file__]
    try:
        child = subprocess.run(command, input=json.dumps(request), capture_output=True, text=True,
                               timeout=CHILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise BackendError(f"LLVM did not finish compiling kernel '{request['kernel']}' for {request['cpu']} "
                           f"within {CHILD_TIMEOUT_S} s") from None
    if child.returncode != 0:
        how = (f"killed by {signal.Signals(-child.returncode).name}" if child.returncode < 0
               else f"exit status {child.returncode}")
        said = child.stderr.strip()[-4000:] or "(nothing)"
        raise BackendError(f"LLVM crashed ({how}) compiling kernel '{request['kernel']}' for {request['cpu']} in "
                           f"an isolated child process; this process is unharmed. This is a bug in the NVPTX "
                           f"backend's validation: please report it with the thread IR. LLVM said:\n{said}")
    try:
        reply = json.loads(child.stdout)
    except json.JSONDecodeError:
        raise BackendError(f"the LLVM child process returned no result:\n{child.stdout[-2000:]}"
                           f"{child.stderr[-2000:]}") from None
    if not reply.pop("ok"):
        raise BackendError(_internal_error(request, reply["error"]))
    return reply


def _internal_error(request: dict, message: str) -> str:
    return (f"internal error compiling kernel '{request['kernel']}' for {request['cpu']}: {message}\n"
            f"(the NVPTX backend generated LLVM IR that LLVM rejects; please report it with the thread IR)")


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
