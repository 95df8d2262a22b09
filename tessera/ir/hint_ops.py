"""Hints: facts a kernel author states about integer values (`tessera.multiple_of`, `max_contiguous`, `assume`).

    %y = multiple_of %x {values = [16]}       y is x; along dim d, the lanes whose index is a multiple of
                                               g_d = min(values[d], size_d) hold multiples of values[d]
                                               (a scalar: x itself is a multiple of values[0])
    %y = max_contiguous %x {values = [64]}    y is x; along dim d, each aligned group of min(values[d], size_d)
                                               lanes holds consecutive integers (v, v + 1, ...)
    assume %c                                 the bool scalar c holds where the op runs

The alignment analysis takes them as facts (`passes/alignment_hints.py`),
which is how a stride or a size loaded from memory can still give 16-byte
vector accesses and cp.async copies. They are promises: the tile
interpreter checks every one and reports a broken promise at its line (a
GPU would compute with misaligned accesses instead); the lowering drops
them, having used them.
"""

from __future__ import annotations

from . import dtypes as dt
from .ops import define, require
from .types import ScalarType, TileType, scalar_dtype, shape_of


def _infer_hint(ts, a):
    t, values = ts[0], a["values"]
    dtype = scalar_dtype(t)
    require(dtype is not None and dtype.is_int, f"hints apply to integers (or tiles of them), got {t}")
    rank = len(shape_of(t))
    require(len(values) == max(rank, 1), f"a hint on {t} needs {max(rank, 1)} value(s), one per dim, got {len(values)}")
    require(all(v >= 1 and v & (v - 1) == 0 for v in values), f"hint values must be powers of two, got {list(values)}")
    return [t]


def _infer_assume(ts, a):
    require(ts[0] == ScalarType(dt.bool_), f"assume takes a bool scalar, got {ts[0]}")
    return []


define("multiple_of", "The operand, stated to hold multiples of `values` (see ir/hint_ops.py).", 1,
       attrs={"values": "ints"}, infer=_infer_hint)
define("max_contiguous", "The operand, stated to run in aligned groups of consecutive integers (ir/hint_ops.py).",
       1, attrs={"values": "ints"}, infer=_infer_hint)
define("assume", "State that the bool scalar operand holds here (the interpreter checks it).", 1,
       infer=_infer_assume, pure=False)

HINT_OPS = frozenset(("multiple_of", "max_contiguous", "assume"))   # tile level only: the lowering drops them


def hint_groups(op_values: tuple[int, ...], t) -> tuple[int, ...]:
    """The group size along each dim a hint speaks of: min(value, size) (the value itself for a scalar)."""
    if not isinstance(t, TileType):
        return tuple(op_values)
    return tuple(min(v, s) for v, s in zip(op_values, t.shape))
