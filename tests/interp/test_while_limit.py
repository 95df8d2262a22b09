"""A `while` loop that never ends is an InterpreterError in the tile interpreter, not a hang."""

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError, control_flow, run_function
from tessera.ir.parser import parse_module

SPIN = """\
func @spin(%out: ptr<i32>, %n: i32) {
  %zero = constant {value = 0} : i32
  %r = while %n : i32 {
  ^(%k: i32):
    %go = cmp %k, %zero {pred = "gt"} : bool
    condition %go, %k
  } {
  ^(%k_1: i32):
    yield %k_1
  }
  store %out, %r
  return
}
"""


def test_a_loop_that_makes_no_progress_is_reported(monkeypatch):
    monkeypatch.setattr(control_flow, "MAX_WHILE_ITERATIONS", 50)
    with pytest.raises(InterpreterError, match="the while loop ran 50 iterations without finishing; is it infinite"):
        run_function(parse_module(SPIN).functions[0], [np.zeros(1, np.int32), 3], grid=1)


def test_a_loop_that_ends_is_unaffected(monkeypatch):
    out = np.ones(1, np.int32)
    run_function(parse_module(SPIN).functions[0], [out, 0], grid=1)
    assert out[0] == 0
