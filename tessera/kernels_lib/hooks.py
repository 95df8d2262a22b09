"""User functions fused into library kernels: checking them and placing their operands in the kernels' slots.

A hook is a `@tessera.func` the library kernel inlines (a GEMM epilogue or
prologue, an attention score modifier). Its first parameter receives the
kernel's tile; each further parameter one of the caller's operands, in
order, except parameters named after an index tile the kernel offers
(`rows`, `cols`; attention's `b`, `h`, `q_idx`, `kv_idx`), which receive
it. The checks here run on the host before anything is traced, so a wrong
signature or operand is a `tessera.CompileError` that points at the user's
code (the hook's `def`, or the line that called the library op) and says
what to change; an error inside the hook's body is reported by the tracer
at the hook's own line.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

import tessera

LIBRARY_ROOT = os.path.dirname(os.path.abspath(tessera.__file__))


def caller_line() -> tuple[Optional[str], Optional[int]]:
    """(file, line) of the innermost frame outside the tessera package: the user's call of the library op."""
    frame = inspect.currentframe()
    while frame is not None:
        file = os.path.abspath(frame.f_code.co_filename)
        if not file.startswith(LIBRARY_ROOT + os.sep) and "torch" + os.sep not in file and not file.startswith("<"):
            return file, frame.f_lineno
        frame = frame.f_back
    return None, None


def outside_graphs(op: str, hooks: str):
    """`torch.compiler.disable` for a library op's path with fused functions: a Python function cannot be a
    torch op's argument, so torch.compile breaks the graph at the call and runs it eagerly (rather than
    tracing the hook machinery into an internal error); under fullgraph=True torch's error gives this reason.

    Applied lazily: `torch.compiler.disable` imports Dynamo (about 1.5 s of CPU), which `import
    tessera.kernels_lib` should not cost a process that never compiles. The returned function carries the
    marks Dynamo reads at a call site (the graph breaks there, with `reason`), and wraps the op in
    `torch.compiler.disable` on its first call in a process that has Dynamo loaded; until then there is no
    graph to keep it out of, and it calls the op directly."""
    reason = (f"{op} with fused functions ({hooks}) runs outside torch.compile's graph: a Python function cannot "
              f"be a torch op's argument. Without fullgraph=True the graph breaks here and the op runs eagerly; to "
              f"keep one graph, wrap the call, with its functions fixed, in your own @tessera.torch.op")

    def decorate(fn):
        disabled = []

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if not disabled:
                if "torch._dynamo" not in sys.modules:
                    return fn(*args, **kwargs)
                disabled.append(torch.compiler.disable(fn, reason=reason))
            return disabled[0](*args, **kwargs)

        call._torchdynamo_disable = True            # the marks torch.compiler.disable leaves, read at call sites
        call._torchdynamo_disable_msg = reason
        return call

    return decorate


def call_error(op: str, message: str) -> tessera.CompileError:
    """A CompileError at the line that called library op `op`."""
    file, line = caller_line()
    return tessera.CompileError(message, kernel=op, file=file, line=line)


def hook_error(op: str, role: str, fn: Any, message: str) -> tessera.CompileError:
    """A CompileError at the `def` of the user's hook `fn`."""
    source = fn.source
    return tessera.CompileError(f"{role} '{fn.__name__}' of {op}: {message}", kernel=op, file=source.file,
                                line=source.tree.lineno, column=source.tree.col_offset)


def is_device_function(fn: Any) -> bool:
    """Whether `fn` is a @tessera.func helper (it carries its parsed source and a compile-time identity)."""
    return hasattr(type(fn), "__tessera_key__") and hasattr(fn, "source") and hasattr(fn, "fn")


@dataclass(frozen=True)
class HookParams:
    """A hook's parameters after the tile: operand parameters in order, and which take index tiles."""

    names: tuple[str, ...]           # every parameter after the first
    operands: tuple[str, ...]        # those that take the caller's operands, in order


@functools.lru_cache(maxsize=256)
def _parameters(py_fn: Any) -> tuple[inspect.Parameter, ...]:
    """`py_fn`'s parameters, read once per function: `inspect.signature` costs ~40 µs, most of a fused call's
    host work before its launch (bench/fusion.py times that work with the kernel)."""
    return tuple(inspect.signature(py_fn).parameters.values())


def hook_params(op: str, role: str, fn: Any, index_names: Sequence[str], n_operands: int) -> HookParams:
    """Check `fn` is a @tessera.func taking the tile, then one parameter per operand (and index tiles by name)."""
    if not is_device_function(fn):
        raise call_error(op, f"{role} must be a @tessera.func helper (so it can be compiled into the kernel), got "
                             f"{type(fn).__name__} {fn!r}; decorate it with @tessera.func")
    params = _parameters(fn.fn)
    bad = [p.name for p in params if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if bad:
        raise hook_error(op, role, fn, f"parameters {bad} are not plain positional parameters; list each operand "
                                       f"as its own parameter")
    if not params:
        raise hook_error(op, role, fn, "it takes no parameters; its first parameter receives the kernel's tile")
    names = tuple(p.name for p in params[1:])
    operands = tuple(n for n in names if n not in index_names)
    if len(operands) != n_operands:
        offered = f" (parameters named {', '.join(index_names)} receive index tiles)" if index_names else ""
        raise hook_error(op, role, fn, f"it takes {len(operands)} operand parameter(s) after the tile "
                                       f"({', '.join(operands) or 'none'}) but {n_operands} operand(s) were passed"
                                       f"{offered}; pass one operand per parameter")
    return HookParams(names, operands)


@dataclass(frozen=True)
class TensorOperand:
    """A tensor operand broadcast against a rows x cols matrix: which dimensions it spans, and its strides."""

    tensor: torch.Tensor
    full_r: bool
    full_c: bool
    stride_r: int
    stride_c: int


def matrix_operand(op: str, role: str, name: str, x: torch.Tensor, rows: int, cols: int,
                   device: torch.device) -> TensorOperand:
    """`x` as an operand of a rows x cols tile grid, by numpy broadcasting: (), (cols,), (1, cols), (rows, 1),
    (rows, cols) and size-1 forms of these."""
    if x.device != device:
        raise call_error(op, f"{role} operand '{name}' is on {x.device} but the inputs are on {device}; move it")
    shape = tuple(x.shape)
    if x.dim() > 2 or any(s not in (1, want) for s, want in zip(shape[::-1], (cols, rows))):
        raise call_error(op, f"{role} operand '{name}' has shape {shape}, which does not broadcast against the "
                             f"{rows} x {cols} {'output' if role == 'epilogue' else 'operand'}; use (), ({cols},), "
                             f"({rows}, 1) or ({rows}, {cols})")
    x2 = x.reshape((1,) * (2 - x.dim()) + shape)
    full_r, full_c = x2.shape[0] == rows and rows > 1, x2.shape[1] == cols and cols > 1
    return TensorOperand(x2, full_r, full_c, x2.stride(0) if full_r else 0, x2.stride(1) if full_c else 0)


@contextmanager
def blamed_on(op: str, hooks: dict[str, Any]):
    """Re-raise a CompileError raised at a library line while hooks are traced as one at the user's hook: the
    library checks what a hook returned (shapes, tuple arity) and an error there is the hook's."""
    try:
        yield
    except tessera.CompileError as exc:
        file = os.path.abspath(exc.file) if exc.file else ""
        if not file.startswith(LIBRARY_ROOT + os.sep) or not hooks:
            raise
        role, fn = next(iter(hooks.items())) if len(hooks) == 1 else _hook_named_in(exc, hooks)
        raise hook_error(op, role, fn, f"{exc.message} (while compiling it into the kernel)") from None


def _hook_named_in(exc: tessera.CompileError, hooks: dict[str, Any]) -> tuple[str, Any]:
    """The hook whose role the failing library line names (the first hook when none is named)."""
    line = (exc.source_line or "").upper()
    for role, fn in hooks.items():
        if role.upper().replace(" ", "_") in line:
            return role, fn
    return next(iter(hooks.items()))
