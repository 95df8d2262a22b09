"""Running LLVM (`optimize.py`: parse, link, O3, emit) in this process or in an isolated child.

    result = run_llvm(request, isolate=False, backend="NVPTX")
    result["assembly"], result["optimized_ir"], result["object"]  # object: bytes or None

LLVM runs in this process by default: each backend's validator admits only
targets, dtypes and ops whose LLVM patterns its test matrix compiles, so
nothing that reaches LLVM should abort. `isolate=True` runs LLVM in
a child process instead (`python -P optimize.py`, ~0.2 s more per kernel):
a crash there becomes a `BackendError` carrying LLVM's message. A child
started with `subprocess` rather than `multiprocessing`'s spawn does not
re-import the caller's `__main__`, and its stderr (where LLVM writes before
it aborts) is captured whole.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import llvmlite

from . import optimize
from .errors import BackendError

CHILD_TIMEOUT_S = 600


def run_llvm(request: dict, *, isolate: bool, backend: str) -> dict:
    """`optimize.compile_llvm(**request)`, here or in a child process; BackendError when LLVM fails."""
    return run_llvm_isolated(request, backend) if isolate else run_llvm_here(request, backend)


def run_llvm_here(request: dict, backend: str = "LLVM") -> dict:
    try:
        return optimize.compile_llvm(**request)
    except optimize.LLVMError as e:
        raise BackendError(_internal_error(request, str(e), backend)) from None


def run_llvm_isolated(request: dict, backend: str = "LLVM") -> dict:
    env = dict(os.environ)
    llvmlite_home = str(Path(llvmlite.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [llvmlite_home, env.get("PYTHONPATH")]))
    command = [sys.executable, "-P", optimize.__file__]
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
                           f"an isolated child process; this process is unharmed. This is a bug in the {backend} "
                           f"backend's validation: please report it with the thread IR. LLVM said:\n{said}")
    try:
        reply = json.loads(child.stdout)
    except json.JSONDecodeError:
        raise BackendError(f"the LLVM child process returned no result:\n{child.stdout[-2000:]}"
                           f"{child.stderr[-2000:]}") from None
    if not reply.pop("ok"):
        raise BackendError(_internal_error(request, reply["error"], backend))
    if reply.get("object") is not None:
        reply["object"] = base64.b64decode(reply["object"])
    return reply


def _internal_error(request: dict, message: str, backend: str) -> str:
    return (f"internal error compiling kernel '{request['kernel']}' for {request['cpu']}: {message}\n"
            f"(the {backend} backend generated LLVM IR that LLVM rejects; please report it with the thread IR)")
