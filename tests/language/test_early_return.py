"""`return` anywhere: under runtime conditions, inside runtime and unrolled loops, in kernels and helpers.

The compiler rewrites each `return` into structured control flow (a
`returned` flag, the rest of the code guarded by `if not returned`, loops
holding a return lowered as `while` loops that stop on it), so a kernel
behaves as the Python reads: what follows a taken return does not run, in
the interpreter, the SIMT simulator on every target, and compiled code.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera

from everywhere import run_everywhere


@tessera.kernel
def scale_real_blocks(x_ptr, out_ptr, n_blocks, BLOCK: tessera.constexpr):
    """MoE-style: the grid is padded to a fixed size; blocks past `n_blocks` leave at once."""
    pid = tessera.program_id(0)
    if pid >= n_blocks:
        return
    offs = pid * BLOCK + tessera.arange(0, BLOCK)
    tessera.store(out_ptr + offs, tessera.load(x_ptr + offs) * 2)


def test_padding_blocks_leave_early_and_write_nothing():
    x, out, n_blocks = run_everywhere(
        scale_real_blocks, lambda: [np.arange(256, dtype=np.float32), np.full(256, -1, np.float32), 3], (8,),
        BLOCK=32)
    assert out[:96].tolist() == (2 * x[:96]).tolist()
    assert (out[96:] == -1).all()


@tessera.kernel
def first_negative(x_ptr, out_ptr, rows, COLS: tessera.constexpr):
    """The index of the first negative element, scanning rows (runtime loop) and columns (unrolled)."""
    for i in range(rows):
        for j in tessera.static_range(COLS):
            if tessera.load(x_ptr + i * COLS + j) < 0:
                tessera.store(out_ptr, i * COLS + j)
                return
    tessera.store(out_ptr, -1)


@pytest.mark.parametrize("where", [None, 0, 5, 11])
def test_a_return_inside_nested_loops_leaves_them_all(where):
    def args():
        x = np.arange(1, 13, dtype=np.float32)
        if where is not None:
            x[where] = -x[where]
            x[-1] = -1.0          # a later negative must not overwrite the first
        return [x, np.zeros(1, np.int32), 4]

    _, out, _ = run_everywhere(first_negative, args, (1,), COLS=3)
    assert out[0] == (-1 if where is None else where)


@tessera.kernel
def countdown(out_ptr, start, stop_at):
    """A while loop whose body returns before writing the value it reached."""
    k = start
    while k > 0:
        if k == stop_at:
            return
        tessera.atomic_add(out_ptr, k)
        k -= 1
    tessera.atomic_add(out_ptr + 1, 1)


@pytest.mark.parametrize("stop_at, total, finished", [(3, 10 + 9 + 8 + 7 + 6 + 5 + 4, 0), (-1, 55, 1)])
def test_a_return_inside_a_while_loop(stop_at, total, finished):
    out, _, _ = run_everywhere(countdown, lambda: [np.zeros(2, np.int32), 10, stop_at], (1,), num_warps=1)
    assert out.tolist() == [total, finished]


@tessera.func
def sign(v):
    if v < 0:
        return -1
    if v > 0:
        return 1
    return 0


@tessera.func
def clipped(tile, limit):
    if tessera.max(tile, axis=0) <= limit:
        return tile                       # a tile from one branch,
    return tessera.minimum(tile, limit)   # another from the rest


@tessera.kernel
def helpers(x_ptr, signs_ptr, clip_ptr, limit, BLOCK: tessera.constexpr):
    for i in range(BLOCK):
        tessera.store(signs_ptr + i, sign(tessera.load(x_ptr + i)))
    offs = tessera.arange(0, BLOCK)
    tessera.store(clip_ptr + offs, clipped(tessera.load(x_ptr + offs), limit))


@pytest.mark.parametrize("limit", [2.5, 100.0])
def test_helpers_return_from_runtime_branches(limit):
    x = np.array([-3, 0, 5, -0.5, 2, 7, 1, 0], np.float32)
    _, signs, clip, _ = run_everywhere(helpers, lambda: [x.copy(), np.zeros(8, np.int32), np.zeros(8, np.float32),
                                                         limit], (1,), BLOCK=8)
    assert signs.tolist() == np.sign(x).astype(np.int32).tolist()
    assert clip.tolist() == np.minimum(x, limit).tolist()


@tessera.func
def returns_inside_a_loop(n):
    for i in range(n):
        if i > 3:
            return i
    return -1


@tessera.kernel
def calls_loop_return(out_ptr, n):
    tessera.store(out_ptr, returns_inside_a_loop(n))


@tessera.kernel
def pipelined_return(out_ptr, n):
    for k in tessera.pipeline(0, n, stages=2):
        if k == 3:
            return


@pytest.mark.parametrize("kernel, fragment", [
    (calls_loop_return, "`return` with a value inside a runtime loop of helper 'returns_inside_a_loop'"),
    (pipelined_return, "a tessera.pipeline loop cannot `break` or `return`"),
])
def test_returns_that_cannot_be_compiled_say_why(kernel, fragment):
    with pytest.raises(tessera.UnsupportedSyntaxError) as info:
        kernel.specialize(np.zeros(1, np.int32), 8)
    assert fragment in info.value.message
