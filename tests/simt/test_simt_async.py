"""Asynchronous copies (async_copy / async_commit / async_wait, cp.async) in the SIMT simulator,
with hand-written thread IR: the bytes land only when a wait retires their group, and touching
them earlier is an error, which is what proves a pipelined kernel right on the CPU."""

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError

from tessera.backends.simt import run_threads
from tessera.ir.parser import parse_module
from tessera.ir.verifier import verify_module

# 32 threads; thread t copies x[4t..4t+4) (16 bytes of f32) into shared, then writes what it reads back to out.
HEAD = """\
func @k(%x: ptr<f32>, %out: ptr<f32>) attributes {num_threads = 32, shared_bytes = 1024} {
  %tid = thread_id : i32
  %c4 = constant {value = 4} : i32
  %c128 = constant {value = 128} : i32
  %o = mul %tid, %c4 : i32
  %o2 = add %o, %c128 : i32
  %smem = shared_alloc {bytes = 1024, offset = 0} : ptr<f32, shared>
  %s = addptr %smem, %o : ptr<f32, shared>
  %s2 = addptr %smem, %o2 : ptr<f32, shared>
  %g = addptr %x, %o : ptr<f32>
  %g2 = addptr %x, %o2 : ptr<f32>
  %on = constant {value = true} : bool
  %off = constant {value = false} : bool
  %dst = addptr %out, %o : ptr<f32>
  %dst2 = addptr %out, %o2 : ptr<f32>
"""
TAIL = """\
  return
}
"""
READ_FIRST = """\
  %v = load %s : f32
  store %dst, %v
"""
READ_SECOND = """\
  %w = load %s2 : f32
  store %dst2, %w
"""


def run(body: str):
    module = parse_module(HEAD + body + TAIL)
    verify_module(module)
    x = np.arange(256, dtype=np.float32) + 1
    out = np.zeros(256, np.float32)
    run_threads(module.functions[0], [x, out], grid=1)
    return x, out


def test_copy_then_wait_then_read_gives_the_data():
    x, out = run("  async_copy %s, %g, %on {bytes = 16}\n  async_commit\n  async_wait {pending = 0}\n" + READ_FIRST)
    np.testing.assert_array_equal(out[:128:4], x[:128:4])


def test_read_before_wait_raises():
    with pytest.raises(InterpreterError, match="before cp.async.wait_group: add async_wait"):
        run("  async_copy %s, %g, %on {bytes = 16}\n  async_commit\n" + READ_FIRST
            + "  async_wait {pending = 0}\n")


def test_write_before_wait_raises():
    with pytest.raises(InterpreterError, match="before cp.async.wait_group"):
        run("  async_copy %s, %g, %on {bytes = 16}\n  %z = constant {value = 0.0} : f32\n  store %s, %z\n"
            "  async_commit\n  async_wait {pending = 0}\n")


TWO_GROUPS = ("  async_copy %s, %g, %on {bytes = 16}\n  async_commit\n"
              "  async_copy %s2, %g2, %on {bytes = 16}\n  async_commit\n  async_wait {pending = 1}\n")


def test_wait_pending_one_retires_only_the_first_group():
    x, out = run(TWO_GROUPS + READ_FIRST + "  async_wait {pending = 0}\n" + READ_SECOND)
    np.testing.assert_array_equal(out[:128:4], x[:128:4])
    np.testing.assert_array_equal(out[128::4], x[128::4])
    with pytest.raises(InterpreterError, match="before cp.async.wait_group"):
        run(TWO_GROUPS + READ_SECOND + "  async_wait {pending = 0}\n")


def test_predicated_off_copy_zero_fills():
    x, out = run("  async_copy %s, %g, %off {bytes = 16}\n  async_commit\n  async_wait {pending = 0}\n"
                 + READ_FIRST)
    np.testing.assert_array_equal(out, 0)


def test_copies_never_waited_for_are_an_error():
    with pytest.raises(InterpreterError, match="async copies never waited for"):
        run("  async_copy %s, %g, %on {bytes = 16}\n  async_commit\n")


def test_misaligned_copy_is_an_error():
    with pytest.raises(InterpreterError, match="not aligned"):
        run("  %c1 = constant {value = 1} : i32\n  %m = addptr %s, %c1 : ptr<f32, shared>\n"
            "  async_copy %m, %g, %on {bytes = 16}\n  async_commit\n  async_wait {pending = 0}\n")


def test_other_threads_see_the_copy_after_wait_and_barrier_only():
    neighbour = ("  %c1 = constant {value = 1} : i32\n  %n = add %tid, %c1 : i32\n  %c31 = constant {value = 31} : i32\n"
                 "  %nn = and %n, %c31 : i32\n  %on4 = mul %nn, %c4 : i32\n  %sn = addptr %smem, %on4 : ptr<f32, shared>\n"
                 "  %v = load %sn : f32\n  store %dst, %v\n")
    copy = "  async_copy %s, %g, %on {bytes = 16}\n  async_commit\n  async_wait {pending = 0}\n"
    x, out = run(copy + "  barrier\n" + neighbour)
    np.testing.assert_array_equal(out[:128:4], np.roll(x[:128:4], -1))
    with pytest.raises(InterpreterError, match="race"):
        run(copy + neighbour)


def test_masked_off_threads_issue_nothing():
    # Only threads 0..15 copy; the others' bytes keep shared memory's poison, and no copy is left in flight.
    x, out = run("  %c16 = constant {value = 16} : i32\n  %low = cmp %tid, %c16 {pred = \"lt\"} : bool\n"
                 "  if %low {\n    async_copy %s, %g, %on {bytes = 16}\n    async_commit\n"
                 "    async_wait {pending = 0}\n    yield\n  } {\n    yield\n  }\n" + READ_FIRST)
    np.testing.assert_array_equal(out[:64:4], x[:64:4])
    assert np.isnan(out[64:128:4]).all()
