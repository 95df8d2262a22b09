"""Device-side debugging ops: `print` always prints, `assert` checks every lane,
`breakpoint` stops in Python's debugger with the kernel's values at hand."""

from __future__ import annotations

import keyword

import numpy as np

from .registry import semantics


@semantics("print")
def _print(ctx, op, *values):
    """Print like Python's print: "pid (x, y, z) <prefix> <values...>"."""
    prefix = op.attrs["prefix"]
    head = [f"pid {ctx.program_id}"] + ([prefix] if prefix else [])
    print(*head, *values, flush=True)


@semantics("assert")
def _assert(ctx, op, cond):
    failed = ~np.asarray(cond, dtype=bool)
    if failed.any():
        lane = tuple(int(i) for i in np.unravel_index(int(np.argmax(failed)), failed.shape))
        where = f" (lane {lane}, {int(failed.sum())} of {failed.size} lanes false)" if failed.ndim else ""
        raise ctx.error(op, f"assertion failed: {op.attrs['message']}{where}")


@semantics("breakpoint")
def _breakpoint(ctx, op, *values):
    """Enter Python's debugger (`breakpoint()`, so PYTHONBREAKPOINT applies) in a
    frame whose locals are the named operands plus `program_id`."""
    names = tuple(op.attrs["names"])
    _stopper(names)(*values, program_id=ctx.program_id)


_STOPPERS: dict[tuple[str, ...], object] = {}


def _stopper(names: tuple[str, ...]):
    """A function taking the operands under their source names, which calls breakpoint()."""
    stop = _STOPPERS.get(names)
    if stop is None:
        usable = all(n.isidentifier() and not keyword.iskeyword(n) and n != "program_id" for n in names)
        if usable and len(set(names)) == len(names):
            params = ", ".join([*names, "*", "program_id"])
        else:
            params = "*values, program_id"
        source = (f"def stop({params}):\n"
                  f"    breakpoint()  # the kernel's values are this frame's locals\n")
        scope: dict = {}
        exec(source, scope)
        stop = _STOPPERS[names] = scope["stop"]
    return stop
