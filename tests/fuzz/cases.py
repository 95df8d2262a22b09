"""A fuzz case (a kernel's source, how to specialize it, where to run it) and how one is run and classed.

A case is plain data (JSON round-trips it), so a failing one is saved as a file and rerun alone:
`python3 -m tests.fuzz.run --replay FILE`. `run_case` runs one in this process and classes the outcome:

* ok: it compiled (or ran in the interpreter);
* tessera error: one of tessera's own exceptions (CompileError, InterpreterError, LaunchError, CacheError, a
  BackendError that is not one of the two below), the documented way to refuse a kernel;
* other exception: anything else (a KeyError from a pass, numpy's MemoryError), or a CompileError that
  wraps one ("internal compiler error while tracing"): a defect;
* crash: LLVM died in the compile worker (or, under `run.py`, the process running the case died);
* hang: past the compile time limit (CompileTimeoutError, or ptxas / ld.lld stopped at it), or past the
  case's time cap.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

OK, TESSERA_ERROR, OTHER_EXCEPTION, CRASH, HANG = "ok", "tessera error", "other exception", "crash", "hang"
CLASSES = (OK, TESSERA_ERROR, OTHER_EXCEPTION, CRASH, HANG)
TARGETS = ("sm_80", "sm_90a", "gfx942")
INTERPRETER = "interpreter"
DEFECTS = (OTHER_EXCEPTION, CRASH, HANG)


@dataclass
class Case:
    """One kernel specialization and where it runs: a GPU target (compiled) or the interpreter (launched on
    numpy arrays of `array_elements` elements each, one per pointer parameter, scalars from `scalars`)."""

    name: str
    source: str                 # a Python module that defines the kernel (imports tessera itself)
    kernel: str                 # the kernel's name in `source`
    signature: str              # "*f32:16,*f32:16,i32": one entry per non-constexpr parameter
    constexprs: dict = field(default_factory=dict)
    target: str = "sm_80"       # one of TARGETS, or INTERPRETER
    num_warps: int = 4
    grid: tuple = (1,)
    array_elements: int = 4096
    scalars: dict = field(default_factory=dict)    # parameter index -> value (default: 16, or 1.0 for floats)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> "Case":
        data = json.loads(text)
        data["grid"] = tuple(data["grid"])
        data["scalars"] = {int(k): v for k, v in data.get("scalars", {}).items()}
        return Case(**data)


@dataclass
class Outcome:
    """A case's class and what happened (the exception's type and first line)."""

    cls: str
    detail: str = ""
    seconds: float = 0.0


class CaseTimeout(BaseException):
    """Raised by the alarm in `run_case` when a case runs past its time cap (a hang in this process)."""


def classify(exc: BaseException | None) -> Outcome:
    """The class of a case that raised `exc` (None: it finished)."""
    from tessera import CompileError, InterpreterError, LaunchError
    from tessera.backends.llvm.errors import BackendError, CompileTimeoutError
    from tessera.runtime.cache import CacheError

    if exc is None:
        return Outcome(OK)
    text = str(exc).strip().splitlines()
    detail = f"{type(exc).__name__}: {text[-1][:300] if text else ''}"
    if isinstance(exc, (CompileTimeoutError, CaseTimeout)) or (
            isinstance(exc, BackendError) and "did not finish within" in str(exc)):     # ptxas, ld.lld past the limit
        return Outcome(HANG, detail)
    if isinstance(exc, BackendError) and "this process is unharmed" in str(exc):
        return Outcome(CRASH, detail)       # LLVM died in the compile worker
    if isinstance(exc, CompileError) and "internal compiler error" in str(exc):
        return Outcome(OTHER_EXCEPTION, detail)     # a stray exception inside tracing, wrapped: a defect
    if isinstance(exc, (CompileError, InterpreterError, LaunchError, CacheError, BackendError)):
        return Outcome(TESSERA_ERROR, detail)
    return Outcome(OTHER_EXCEPTION, detail)


def run_case(case: Case, time_cap: float | None = None) -> Outcome:
    """Run `case` in this process and class the outcome; with `time_cap`, an alarm ends a run that takes longer
    (Python-level loops: the interpreter, the passes; LLVM is bounded by TESSERA_COMPILE_TIMEOUT)."""
    import time

    start = time.perf_counter()
    previous = None
    if time_cap:
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, time_cap)
    try:
        _execute(case)
        outcome = classify(None)
    except CaseTimeout as exc:
        outcome = classify(exc)
    except Exception as exc:    # noqa: BLE001 - classing every exception is the point
        outcome = classify(exc)
    finally:
        if time_cap:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    outcome.seconds = time.perf_counter() - start
    return outcome


def _alarm(signum, frame):
    raise CaseTimeout("the case ran past its time cap")


def _execute(case: Case) -> None:
    """Import the case's source from a file (tessera reads a kernel's source) and compile or launch it."""
    with tempfile.TemporaryDirectory(prefix="tessera-fuzz-") as folder:
        path = Path(folder) / f"{case.name.replace('-', '_')}.py"
        path.write_text(case.source)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        try:
            spec.loader.exec_module(module)
            kernel = getattr(module, case.kernel)
            if case.target == INTERPRETER:
                kernel[case.grid](*arguments(case), **case.constexprs)
            else:
                kernel.compile(signature=case.signature, target=case.target, num_warps=case.num_warps,
                               **case.constexprs)
        finally:
            sys.modules.pop(path.stem, None)


def arguments(case: Case) -> list:
    """The interpreter's arguments for `case`'s signature: a small-valued array per pointer, scalars as given."""
    import tessera
    from tessera.ir import dtypes as dt

    rng = np.random.default_rng(0)
    out = []
    for index, entry in enumerate(case.signature.split(",")):
        entry = entry.strip()
        name = entry.split(":")[0].lstrip("*")
        dtype = dt.dtype_from_name(name)
        if entry.startswith("*"):
            out.append(_array(dtype, case.array_elements, rng, tessera))
        else:
            out.append(case.scalars.get(index, 1.0 if dtype.is_float else 16))
    return out


def _array(dtype, elements: int, rng, tessera):
    """`elements` elements of `dtype`: native numpy types directly, others as raw bytes reinterpreted."""
    native = {"bool": np.bool_, "f16": np.float16, "f32": np.float32, "f64": np.float64}
    if dtype.name in native:
        return (rng.random(elements) * 4 - 2).astype(native[dtype.name])
    if dtype.kind in ("int", "uint") and dtype.bits in (8, 16, 32, 64):
        numpy_type = np.dtype(f"{'u' if dtype.kind == 'uint' else ''}int{dtype.bits}")
        return rng.integers(0, 8, elements).astype(numpy_type)
    if dtype.is_subbyte:
        return tessera.reinterpret(rng.integers(0, 256, (elements * dtype.bits + 7) // 8).astype(np.uint8), dtype)
    raw = rng.integers(0, 2 ** min(dtype.bits, 16) // 2, elements).astype(np.dtype(f"uint{dtype.bits}"))
    return tessera.reinterpret(raw, dtype)
