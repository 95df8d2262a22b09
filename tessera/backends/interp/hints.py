"""Hints (`multiple_of`, `max_contiguous`, `assume`): the identity, but every promise is checked.

The compiler trusts a hint (it may vectorize accesses or pipeline copies
because of it), so the interpreter, where a kernel is debugged, refuses a
broken one: the error names the first lane that breaks it and its value.
"""

from __future__ import annotations

import numpy as np

from tessera.ir.hint_ops import hint_groups

from .registry import semantics


@semantics("multiple_of")
def _multiple_of(ctx, op, x):
    values = op.attrs["values"]
    for dim, (group, n) in enumerate(zip(hint_groups(values, op.result.type), values)):
        starts = np.moveaxis(x, dim, 0)[::group] if x.ndim else x
        bad = np.asarray(starts % n != 0)
        if bad.any():
            value = np.asarray(starts)[bad].flat[0]
            where = f" at the lanes whose index along dim {dim} is a multiple of {group}" if x.ndim else ""
            raise ctx.error(op, f"tessera.multiple_of promised multiples of {n}{where}, but {value} is not one; "
                                f"fix the hint or the value")
    return x


@semantics("max_contiguous")
def _max_contiguous(ctx, op, x):
    for dim, group in enumerate(hint_groups(op.attrs["values"], op.result.type)):
        if not x.ndim or group == 1:
            continue
        along = np.moveaxis(x, dim, -1)
        runs = along.reshape(*along.shape[:-1], -1, group).astype(np.int64)
        bad = np.diff(runs, axis=-1) != 1
        if bad.any():
            raise ctx.error(op, f"tessera.max_contiguous promised runs of {group} consecutive integers along dim "
                                f"{dim}, but a run holds {runs[np.nonzero(bad.any(axis=-1))][0].tolist()}; fix "
                                f"the hint or the value")
    return x


@semantics("assume")
def _assume(ctx, op, cond):
    if not bool(cond):
        raise ctx.error(op, "tessera.assume: the condition is false here; the compiler relies on it, so fix the "
                            "condition or the values")
