"""Running LLVM (`optimize.py`: parse, link, O3, emit) in the compile worker or in this process.

    result = run_llvm(request, backend="NVPTX")
    result["assembly"], result["optimized_ir"], result["object"]  # object: bytes or None

By default LLVM runs in the compile worker (`worker.py`), a child process
reused across compiles, so that an LLVM abort or a compile that never ends
is an exception here rather than the end of this process: a crash is a
`BackendError` carrying LLVM's message, a compile past the time limit a
`CompileTimeoutError`. The cost is the transfer of the module and the
result through a pipe (about a millisecond for a GEMM), and the worker's
start-up once per process, overlapped with code generation.

    TESSERA_ISOLATE=0              LLVM runs in this process (no time limit; an abort ends the process)
    TESSERA_COMPILE_TIMEOUT=180    seconds one compile step (LLVM, ptxas, ld.lld) may take
"""

from __future__ import annotations

import os

from . import worker
from .errors import BackendError

ISOLATE_ENV = "TESSERA_ISOLATE"
TIMEOUT_ENV = "TESSERA_COMPILE_TIMEOUT"
DEFAULT_TIMEOUT_S = 180.0


def run_llvm(request: dict, *, isolate: bool | None = None, backend: str = "LLVM") -> dict:
    """`optimize.compile_llvm(**request)` in the worker (default: unless $TESSERA_ISOLATE=0) or here; a
    BackendError when LLVM fails, a CompileTimeoutError when it runs past `compile_timeout()`."""
    if isolate is None:
        isolate = isolation_enabled()
    return run_llvm_isolated(request, backend) if isolate else run_llvm_here(request, backend)


def run_llvm_here(request: dict, backend: str = "LLVM") -> dict:
    from . import optimize   # loads LLVM into this process: only on this path

    try:
        return optimize.compile_llvm(**request)
    except optimize.LLVMError as e:
        raise BackendError(_internal_error(request, str(e), backend)) from None


def run_llvm_isolated(request: dict, backend: str = "LLVM", timeout_s: float | None = None) -> dict:
    """`request` compiled in the worker process, within `timeout_s` (default: `compile_timeout()`)."""
    limit = compile_timeout() if timeout_s is None else timeout_s
    reply = worker.compile_in_worker(request, timeout_s=limit, backend=backend)
    if not reply.pop("ok"):
        raise BackendError(_internal_error(request, reply["error"], backend))
    return reply


def prepare(isolate: bool | None = None) -> None:
    """Start the worker early (when LLVM will run there), so its start-up overlaps with code generation."""
    if isolate if isolate is not None else isolation_enabled():
        worker.prepare()


def isolation_enabled() -> bool:
    """Whether LLVM runs in the worker: yes unless $TESSERA_ISOLATE is "0", "false" or "no"."""
    return os.environ.get(ISOLATE_ENV, "").strip().lower() not in ("0", "false", "no")


def compile_timeout() -> float:
    """Seconds one compile step may take: $TESSERA_COMPILE_TIMEOUT, else DEFAULT_TIMEOUT_S."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise BackendError(f"{TIMEOUT_ENV}={text!r} is not a time limit: give a positive number of seconds "
                           f"(the default is {DEFAULT_TIMEOUT_S:g})")
    return seconds


def _internal_error(request: dict, message: str, backend: str) -> str:
    return (f"internal error compiling kernel '{request['kernel']}' for {request['cpu']}: {message}\n"
            f"(the {backend} backend generated LLVM IR that LLVM rejects; please report it with the thread IR)")
