"""The SIMT simulator on lowered tutorial kernels.

The tutorials lowered to thread IR compute what the tile interpreter
computes (tests/passes/test_lower_to_threads.py covers many more kernels
and warp counts; here: 8 warps of 32, and 4 waves of 64 on gfx942). And the simulator's checks catch what a
broken lowering or a mismatched launch would do on a GPU: a vector access
whose promise does not hold, a missing barrier, an unplaced buffer.
"""

import runpy
from pathlib import Path

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError, run_function

from tessera.backends.simt import run_threads
from tessera.ir.target import get_target

thread_passes = pytest.importorskip("tessera.passes.thread_passes")
lower_to_threads = pytest.importorskip("tessera.passes.lower_to_threads")
layout_assignment = pytest.importorskip("tessera.passes.layout_assignment")

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"


def tutorial_kernel(file: str, name: str):
    return runpy.run_path(str(TUTORIALS / file))[name]


def random_f32(*shape):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


def vector_add_args(n=1000):
    return [random_f32(n), random_f32(n) + 1, np.zeros(n, np.float32), n]


def softmax_args(rows=3, cols=100):
    return [random_f32(rows, cols), np.zeros((rows, cols), np.float32), rows, cols]


def matmul_args(m=40, n=24, k=48):
    a, b = random_f32(m, k).astype(np.float16), random_f32(k, n).astype(np.float16)
    return [a, b, np.zeros((m, n), np.float16), m, n, k]


TUTORIAL_CASES = {
    "vector_add": ("01-vector-add.py", "add", vector_add_args, {"BLOCK": 512}, (2,), None),
    "softmax": ("02-fused-softmax.py", "softmax", softmax_args, {"BLOCK": 128}, (3,), dict(rtol=1e-6, atol=1e-7)),
    "matmul": ("03-matmul.py", "matmul", matmul_args, {"BM": 32, "BN": 16, "BK": 16}, (2, 2),
               dict(rtol=1e-2, atol=1e-2)),
}


@pytest.mark.parametrize("target,num_warps", [("sm_80", 8), ("gfx90a", 4), ("gfx942", 4), ("gfx950", 4)])
@pytest.mark.parametrize("name", TUTORIAL_CASES)
def test_lowered_tutorial_matches_the_tile_interpreter(name, target, num_warps):
    """sm_80: 8 warps of 32 (the matmul on mma.sync); AMD: 4 waves of 64 (the matmul on MFMA 16x16x16)."""
    file, kernel_name, make_args, constexprs, grid, tolerance = TUTORIAL_CASES[name]
    kernel = tutorial_kernel(file, kernel_name)
    expected, actual = make_args(), make_args()
    module = kernel.specialize(*expected, **constexprs).module
    run_function(module.functions[0], expected, grid)
    fn = thread_passes.lower(module, target, num_warps=num_warps).functions[0]
    matrix_op = "mfma" if target.startswith("gfx") else "mma"
    assert any(op.name == matrix_op for op in fn.walk()) == (name == "matmul")
    run_threads(fn, actual, grid)
    for want, got in zip(expected, actual):
        if not isinstance(want, np.ndarray):
            continue
        if tolerance is None:
            assert got.tobytes() == want.tobytes()
        else:
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **tolerance)


def test_a_vector_promise_made_for_one_specialization_fails_on_other_arguments():
    kernel = tutorial_kernel("01-vector-add.py", "add")
    module = kernel.specialize(*vector_add_args(1024), BLOCK=256).module  # n % 16 == 0: whole groups masked
    fn = thread_passes.lower(module, "sm_80", num_warps=2).functions[0]
    assert sum(op.attrs.get("vector") == 4 for op in fn.walk()) == 3
    run_threads(fn, vector_add_args(1024), grid=4)
    with pytest.raises(InterpreterError, match=r"op 'load': vector = 4 promise broken: thread 58 has a mask that "
                                               r"differs within registers 0..3"):
        run_threads(fn, vector_add_args(1002), grid=4)  # element 1002 splits thread 58's group


def lowered_softmax(num_warps=4):
    kernel = tutorial_kernel("02-fused-softmax.py", "softmax")
    module = kernel.specialize(*softmax_args(), BLOCK=128).module
    return module, thread_passes.lower(module, "sm_80", num_warps).functions[0]


def drop_barriers(fn, which):
    """Remove the barriers of `fn` whose index (in program order) is in `which`; returns how many there were."""
    barriers = [op for op in fn.walk() if op.name == "barrier"]
    for i in which:
        barriers[i].parent.ops.remove(barriers[i])
    return len(barriers)


def test_softmax_across_warps_races_without_its_barriers():
    _, fn = lowered_softmax()
    run_threads(fn, softmax_args(), grid=3)
    assert drop_barriers(fn, [0]) == 4
    with pytest.raises(InterpreterError, match=r"op 'load': shared-memory race: thread \d+ reads shared byte \d+ "
                                               r".*which thread \d+ wrote since the last barrier"):
        run_threads(fn, softmax_args(), grid=3)


def test_reusing_shared_memory_needs_the_barrier_after_the_last_read():
    # Both reductions share bytes [0, 512); the second one's writes must wait for the first one's reads.
    _, fn = lowered_softmax()
    drop_barriers(fn, [1])
    with pytest.raises(InterpreterError, match=r"op 'store': shared-memory race: thread \d+ writes shared byte \d+ "
                                               r".*which thread \d+ read since the last barrier"):
        run_threads(fn, softmax_args(), grid=3)


def test_unplaced_shared_memory_is_an_error():
    module, _ = lowered_softmax()
    tile_fn, target = module.functions[0], get_target("sm_80")
    assignment = layout_assignment.assign_layouts(tile_fn, target, 4)
    fn = lower_to_threads.lower_to_threads(tile_fn, assignment, target).functions[0]  # not allocated yet
    with pytest.raises(InterpreterError, match=r"op 'shared_alloc': shared_alloc has no offset yet"):
        run_threads(fn, softmax_args(), grid=3)
