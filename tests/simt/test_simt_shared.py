"""Explicit shared memory lowered to threads, on the SIMT simulator: what the tile interpreter computes.

Specification:

* the double-buffered matmul (`shared_kernels.py`) lowered for sm_80 (cp.async
  chunks where rows are aligned, else synchronous copies; ldmatrix reads of the swizzled slots, mma.sync), for gfx942
  (direct-to-LDS loads of 4 bytes a lane where rows are 4-byte aligned, else synchronous copies; MFMA) and gfx950
  (16 bytes a lane) computes what the tile interpreter computes, for
  M, N, K that are and are not multiples of the blocks, with the simulator's
  race, wait and bounds checks on all along;
* copies from masked pointers and tiles smaller than the block (threads that
  replicate a chunk skip it) agree too;
* taking the wait out of the lowered sm_80 or gfx942 kernel, or waiting for one group too few on gfx942, is
  caught by the simulator; so is a gfx942 copy whose lanes do not fill consecutive LDS chunks (the M0 rule of
  `global_load_lds`), which would write elsewhere on the GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.backends.interp import InterpreterError, run_function
from tessera.backends.simt import run_threads
from tessera.ir.parser import parse_module
from tessera.passes.thread_passes import lower

from shared_kernels import F16_RESULT, MatmulCase


def interpret_and_simulate(module, make_args, grid, target, num_warps=4):
    expected, actual = make_args(), make_args()
    run_function(module.functions[0], expected, grid)
    fn = lower(module, target, num_warps).functions[0]
    run_threads(fn, actual, grid)
    return expected, actual, fn


@pytest.mark.parametrize("target", ["sm_80", "gfx942", "gfx950"])
@pytest.mark.parametrize("M,N,K", [(128, 64, 96), (61, 37, 80), (100, 130, 47)], ids=str)
def test_the_double_buffered_matmul_lowered_matches_the_interpreter(target, M, N, K):
    case = MatmulCase(M, N, K)
    expected, actual, fn = interpret_and_simulate(case.module(), case.args, case.grid, target)
    np.testing.assert_allclose(actual[2].astype(np.float32), expected[2].astype(np.float32), **F16_RESULT)
    np.testing.assert_allclose(actual[2].astype(np.float32), case.expected(), **F16_RESULT)
    names = {op.name for op in fn.walk()}
    if target == "sm_80":
        assert {"async_commit", "async_wait", "ldmatrix", "mma"} <= names
        # cp.async where the rows are 16-byte aligned (the specialization knows K or N % 16 == 0); else the
        # copies of that operand are plain loads and shared stores (cp.async needs 4-byte aligned chunks)
        assert ("async_copy" in names) == (K % 16 == 0 or N % 16 == 0)
    else:   # direct-to-LDS where the specialization knows the rows aligned, 16 bytes a lane on gfx950
        assert {"mfma", "async_commit", "async_wait"} <= names
        assert ("async_copy" in names) == (K % 16 == 0 or N % 16 == 0)
        widths = {op.attrs["bytes"] for op in fn.walk() if op.name == "async_copy"}
        assert widths <= ({16, 4} if target == "gfx950" else {4})
        assert (16 in widths) == (target == "gfx950" and (K % 16 == 0 or N % 16 == 0))
    buffers = [op for op in fn.walk() if op.name == "shared_alloc" and op.attrs.get("whole_kernel")]
    assert sorted(op.attrs["bytes"] for op in buffers) == [2 * 64 * 32 * 2] * 2
    assert fn.attrs["shared_bytes"] >= sum(op.attrs["bytes"] for op in buffers)


def test_aligned_k_rows_are_copied_in_16_byte_chunks():
    case = MatmulCase(128, 128, 128)
    fn = lower(case.module(), "sm_80", 4).functions[0]
    assert {op.attrs["bytes"] for op in fn.walk() if op.name == "async_copy"} == {16}


@pytest.mark.parametrize("target", ["sm_80", "gfx942"])
def test_without_the_wait_the_simulator_reads_before_the_copy_lands(target):
    case = MatmulCase(64, 64, 96)
    fn = lower(case.module(), target, 4).functions[0]
    loop = next(op for op in fn.body.ops if op.name == "for")
    body = loop.regions[0]
    body.ops.remove(next(op for op in body.ops if op.name == "async_wait"))
    with pytest.raises(InterpreterError, match="before cp.async.wait_group"):
        run_threads(fn, case.args(), case.grid)


def test_waiting_for_one_group_too_few_on_gfx942_is_a_race():
    case = MatmulCase(64, 64, 96)
    fn = lower(case.module(), "gfx942", 4).functions[0]
    loop = next(op for op in fn.body.ops if op.name == "for")
    wait = next(op for op in loop.regions[0].ops if op.name == "async_wait")
    wait.attrs["pending"] = 2
    with pytest.raises(InterpreterError, match="before cp.async.wait_group"):
        run_threads(fn, case.args(), case.grid)


LANES_KERNEL = """\
func @k(%x: ptr<f32>, %out: ptr<f32>) attributes {{num_threads = 128, warp_size = 64, shared_bytes = 512, target = "{target}"}} {{
  %tid = thread_id : i32
  %last = constant {{value = 127}} : i32
  %one = constant {{value = 1}} : i32
  %yes = constant {{value = true}} : bool
  %smem = shared_alloc {{bytes = 512, offset = 0}} : ptr<f32, shared>
  %slot = {slot} : i32
  %s = addptr %smem, %slot : ptr<f32, shared>
  %g = addptr %x, %tid : ptr<f32>
  async_copy %s, %g, %yes {{bytes = 4}}
  async_commit
  async_wait {{pending = 0}}
  barrier
  %v = load %s : f32
  %o = addptr %out, %slot : ptr<f32>
  store %o, %v
  return
}}
"""


@pytest.mark.parametrize("target", ["gfx942", "sm_80"])
@pytest.mark.parametrize("slot", ["mul %tid, %one", "sub %last, %tid"], ids=["consecutive", "reversed"])
def test_an_amd_copy_whose_lanes_are_not_consecutive_is_refused(target, slot):
    fn = parse_module(LANES_KERNEL.format(target=target, slot=slot)).functions[0]
    x = np.arange(128, dtype=np.float32) + 1
    out = np.zeros(128, np.float32)
    if slot.startswith("mul") or target == "sm_80":     # cp.async has a per-lane address: any order is fine
        run_threads(fn, [x, out], (1,))
        np.testing.assert_array_equal(out, x if slot.startswith("mul") else x[::-1])
        return
    with pytest.raises(InterpreterError, match="lane 0 of wave 0 writes LDS byte 508, so lane 1 must write byte 512"):
        run_threads(fn, [x, out], (1,))


@tessera.kernel
def masked_pointer_copy(x_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    rows = offs[:, None] * BLOCK + offs[None, :]
    buf = tessera.shared((BLOCK, BLOCK), tessera.f32)
    tessera.async_copy(buf, x_ptr + rows, mask=rows < n)
    tessera.async_commit()
    tessera.async_wait(0)
    tessera.barrier()
    tessera.store(out_ptr + rows, buf.load().T)


@pytest.mark.parametrize("target", ["sm_80", "gfx942"])
@pytest.mark.parametrize("block", [8, 32], ids=["fewer-chunks-than-threads", "many-chunks"])
def test_a_masked_pointer_copy_read_back_transposed(target, block):
    x = np.arange(block * block, dtype=np.float32) + 1
    n = block * block - 5
    make = lambda: [x.copy(), np.zeros(block * block, np.float32), n]     # noqa: E731
    module = masked_pointer_copy.specialize(*make(), BLOCK=block).module
    expected, actual, _ = interpret_and_simulate(module, make, (1,), target)
    np.testing.assert_array_equal(actual[1], expected[1])
    np.testing.assert_array_equal(expected[1].reshape(block, block), np.where(x < n + 1, x, 0).reshape(block, block).T)
