"""Every op of the IR has interpreter semantics, and a missing one is a clear error."""

import numpy as np
import pytest

from tessera.backends.interp import SEMANTICS, InterpreterError, run_function
from tessera.ir import dtypes as dt
from tessera.ir.ops import OPS

from interp_kernels import new_kernel, scalar


TILE_OPS = {name for name, opdef in OPS.items() if opdef.level == "tile"}


def test_every_tile_op_has_semantics():
    assert sorted(TILE_OPS - set(SEMANTICS)) == []


def test_semantics_exist_only_for_tile_ops():
    # thread-level ops run in the SIMT simulator, not the tile interpreter
    assert sorted(set(SEMANTICS) - TILE_OPS) == []


def test_an_op_without_semantics_is_an_error_naming_it(monkeypatch):
    b, fn = new_kernel(("x", scalar(dt.f32)))
    b.create("neg", [fn.args[0]])
    b.create("return")
    monkeypatch.delitem(SEMANTICS, "neg")
    with pytest.raises(InterpreterError, match=r"kernel.py:7:5: .*no semantics for op 'neg'"):
        run_function(fn, [np.float32(1.0)], grid=(1,))
