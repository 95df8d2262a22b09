"""Inline assembly on the CPU: it cannot run, so the kernel author's numpy emulation runs instead.

`tessera.inline_asm_elementwise(..., emulate=fn)` registers `fn` here under
a key the IR op names (`emulate` attribute); the interpreter and the SIMT
simulator call it on the operands' arrays, lane by lane as the asm works.
Without one, the run stops at the op saying how to give one.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tessera.ir.types import scalar_dtype

from .registry import semantics

EMULATIONS: dict[str, Callable] = {}


def register_emulation(fn: Callable) -> str:
    """File `fn` and return the key an inline_asm op names it by."""
    key = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', 'emulation')}@{id(fn):x}"
    EMULATIONS[key] = fn
    return key


@semantics("inline_asm")
def _inline_asm(ctx, op, *operands):
    fn = EMULATIONS.get(op.attrs.get("emulate", ""))
    if fn is None:
        raise ctx.error(op, "inline assembly runs only on GPUs; to run this kernel on the CPU, give "
                            "tessera.inline_asm_elementwise an emulate= function computing the same from numpy arrays")
    dtype = scalar_dtype(op.result.type)
    result = np.asarray(fn(*operands))
    shape = np.broadcast_shapes(*(np.shape(x) for x in operands))
    return np.asarray(dtype.quantize(np.broadcast_to(result, shape)))
