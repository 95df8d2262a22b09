"""setmaxnreg, elect_sync and named_barrier in the SIMT simulator (`backends/simt/warp_specialization.py`)."""

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError

from tessera.backends.simt import run_threads
from tessera.ir.parser import parse_module
from tessera.ir.verifier import verify_module


def run(body: str, threads=384, out_size=None):
    text = (f"func @k(%out: ptr<i32>) attributes {{num_threads = {threads}}} {{\n"
            "  %tid = thread_id : i32\n  %c0 = constant {value = 0} : i32\n  %c1 = constant {value = 1} : i32\n"
            "  %c128 = constant {value = 128} : i32\n  %wg = div %tid, %c128 : i32\n"
            "  %first = cmp %wg, %c0 {pred = \"eq\"} : bool\n" + body + "  return\n}\n")
    module = parse_module(text)
    verify_module(module)
    out = np.zeros(out_size or threads, np.int32)
    run_threads(module.functions[0], [out], grid=1)
    return out


def branch(then: str, other: str) -> str:
    return f"  if %first {{\n{then}    yield\n  }} {{\n{other}    yield\n  }}\n"


def test_setmaxnreg_by_whole_warpgroups_within_the_register_file_runs():
    run(branch('    setmaxnreg {action = "dec", count = 40}\n', '    setmaxnreg {action = "inc", count = 232}\n'))


def test_setmaxnreg_by_part_of_a_warpgroup_is_an_error():
    body = ("  %c64 = constant {value = 64} : i32\n  %half = cmp %tid, %c64 {pred = \"lt\"} : bool\n"
            "  if %half {\n    setmaxnreg {action = \"dec\", count = 40}\n    yield\n  } {\n    yield\n  }\n")
    with pytest.raises(InterpreterError, match=r"setmaxnreg in divergent code: only 64 of the 128 threads of "
                                               r"warpgroup 0 execute it; all 128 threads of a warpgroup"):
        run(body)


def test_setmaxnreg_asking_for_more_than_the_register_file_is_an_error():
    body = branch('    setmaxnreg {action = "dec", count = 40}\n', '    setmaxnreg {action = "inc", count = 256}\n')
    with pytest.raises(InterpreterError, match=r"setmaxnreg inc to 256 registers cannot be granted: .* 70656 "
                                               r"registers in all \(warpgroup 0: 40, warpgroup 1: 256, warpgroup 2: "
                                               r"256; x 128 threads\), more than the 65536"):
        run(body)


def test_elect_sync_is_true_in_the_lowest_lane_of_each_warp_that_runs_it():
    body = ("  %c32 = constant {value = 32} : i32\n  %p = addptr %out, %tid : ptr<i32>\n"
            "  %late = cmp %tid, %c32 {pred = \"ge\"} : bool\n"
            "  if %late {\n    %e = elect_sync : bool\n    %v = cast %e : i32\n    store %p, %v\n    yield\n"
            "  } {\n    yield\n  }\n")
    out = run(body, threads=96)
    np.testing.assert_array_equal(np.flatnonzero(out), [32, 64])


def test_elect_sync_by_part_of_a_warp_is_an_error():
    body = ("  %c5 = constant {value = 5} : i32\n  %late = cmp %tid, %c5 {pred = \"ge\"} : bool\n"
            "  if %late {\n    %e = elect_sync : bool\n    yield\n  } {\n    yield\n  }\n")
    with pytest.raises(InterpreterError, match=r"elect_sync in divergent code: only 27 of the 32 threads of warp 0 "
                                               r"execute it; elect.sync is lowered with the full-warp member mask"):
        run(body, threads=64)


def handover(sync: bool) -> str:
    """Warp 0 writes shared memory, warp 1 reads it, in two paths; `sync`: both meet at named_barrier 1 between."""
    meet = "    named_barrier {count = 64, id = 1}\n" if sync else ""
    return ("func @k(%out: ptr<i32>) attributes {num_threads = 64, shared_bytes = 128} {\n"
            "  %tid = thread_id : i32\n  %c32 = constant {value = 32} : i32\n"
            "  %lane = rem %tid, %c32 : i32\n"
            "  %smem = shared_alloc {bytes = 128, offset = 0} : ptr<i32, shared>\n"
            "  %slot = addptr %smem, %lane : ptr<i32, shared>\n"
            "  %writer = cmp %tid, %c32 {pred = \"lt\"} : bool\n"
            "  if %writer {\n    store %slot, %tid\n" + meet + "    yield\n  } {\n" + meet +
            "    %v = load %slot : i32\n    %p = addptr %out, %lane : ptr<i32>\n    store %p, %v\n    yield\n  }\n"
            "  return\n}\n")


def test_named_barrier_orders_one_paths_writes_before_the_others_reads():
    module = parse_module(handover(sync=True))
    verify_module(module)
    out = np.zeros(32, np.int32)
    run_threads(module.functions[0], [out], grid=1)
    np.testing.assert_array_equal(out, np.arange(32))


def test_without_the_named_barrier_the_read_is_a_race():
    module = parse_module(handover(sync=False))
    with pytest.raises(InterpreterError, match="thread 32 reads shared byte 0 .*which thread 0 wrote.*named_barrier"):
        run_threads(module.functions[0], [np.zeros(32, np.int32)], grid=1)


@pytest.mark.parametrize("action, count, why", [("inc", 160, "inc can only raise"), ("dec", 176, "dec can only lower")])
def test_setmaxnreg_in_the_wrong_direction_is_an_error(action, count, why):
    body = branch(f'    setmaxnreg {{action = "{action}", count = {count}}}\n', "")
    with pytest.raises(InterpreterError, match=f"setmaxnreg {action} to {count} registers, but warpgroup 0 has 168 "
                                               f"per thread now: {why}"):
        run(body)
