"""wgmma in the SIMT simulator: the hand-built warpgroup kernel (`tests/backends/wgmma_programs.py`) equals
numpy, and each rule of the asynchronous protocol is enforced with an error that says what to add."""

import sys
from pathlib import Path

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError

from tessera.backends.simt import run_threads
from tessera.ir import dtypes as dt
from tessera.ir.parser import parse_module
from tessera.ir.verifier import verify_module

sys.path.insert(0, str(Path(__file__).parents[1] / "backends"))
from wgmma_programs import wgmma_kernel  # noqa: E402


def operands(n, k, dtype, seed=0):
    rng = np.random.default_rng(seed)
    d = dt.dtype_from_name(dtype)
    a = d.quantize(rng.standard_normal((64, k)))
    bt = d.quantize(rng.standard_normal((n, k)))
    return a, bt


def simulate(text, n, k=64, dtype="bf16", num_threads=None):
    module = parse_module(text)
    verify_module(module)
    a, bt = operands(n, k, dtype)
    out = np.zeros((64, n), np.float32)
    d = dt.dtype_from_name(dtype)
    stored = [x.astype(d.storage_dtype) if d.storage_dtype.kind == "f" else d.encode(x) for x in (a, bt)]
    run_threads(module.functions[0], [*stored, out], grid=1, num_threads=num_threads)
    return a, bt, out


@pytest.mark.parametrize("n", [64, 128])
def test_wgmma_kernel_equals_numpy(n):
    a, bt, out = simulate(wgmma_kernel(n), n)
    expected = a.astype(np.float64) @ bt.astype(np.float64).T
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n, k, dtype", [(16, 64, "f16"), (256, 32, "bf16")])
def test_wgmma_kernel_other_shapes_and_f16(n, k, dtype):
    a, bt, out = simulate(wgmma_kernel(n, k, dtype=dtype), n, k, dtype)
    np.testing.assert_allclose(out, a.astype(np.float64) @ bt.astype(np.float64).T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("switch, message", [
    (dict(read_before_wait=True), "extract reads the result of the wgmma .* before a wgmma_wait retired it"),
    (dict(wait=False, store=False), "the kernel ends with wgmma results never waited for"),
    (dict(wgmma_fence=False), "wgmma without a wgmma_fence"),
    (dict(proxy_fence=False), "no fence_proxy_async has run"),
    (dict(barrier=False), r"shared-memory race: .* \(missing barrier\?\)"),
    (dict(overwrite_in_flight=True), "written while it was in flight"),
])
def test_protocol_violations_are_reported(switch, message):
    with pytest.raises(InterpreterError, match=message):
        simulate(wgmma_kernel(64, 16, **switch), 64, 16)


def test_writes_after_the_proxy_fence_are_invisible_to_wgmma():
    text = wgmma_kernel(64, 16).replace("  fence_proxy_async\n", "  fence_proxy_async\n  store %sp_a0, %x_b0 {vector = 8}\n")
    with pytest.raises(InterpreterError, match="written after the last fence_proxy_async"):
        simulate(text, 64, 16)


def test_wgmma_needs_whole_warpgroups():
    with pytest.raises(InterpreterError, match="warpgroups of 128 threads, but the block has 96"):
        simulate(wgmma_kernel(64, 16), 64, 16, num_threads=96)


def test_a_stack_of_fragments_keeps_each_wgmma_to_its_own():
    """Two chains on one stack (`offset` 0, then 32): the upper fragment, stored, is A @ B^T, so each wgmma
    updated its own registers (were `offset` ignored, the upper chain would add onto the lower fragment and
    leave the upper one 0); reading the stack before the wait is reported as for one fragment."""
    a, bt, out = simulate(wgmma_kernel(64, 32, stacked=True), 64, 32)
    np.testing.assert_allclose(out, a.astype(np.float64) @ bt.astype(np.float64).T, rtol=1e-5, atol=1e-5)
    with pytest.raises(InterpreterError, match="extract reads the result of the wgmma .* before a wgmma_wait"):
        simulate(wgmma_kernel(64, 32, stacked=True, read_before_wait=True), 64, 32)


def test_two_warpgroups_each_run_their_own_wgmma():
    a, bt, out = simulate(wgmma_kernel(64, 16, warpgroups=2), 64, 16)
    np.testing.assert_allclose(out, a.astype(np.float64) @ bt.astype(np.float64).T, rtol=1e-5, atol=1e-5)


def test_descriptors_must_be_aligned_and_uniform_across_the_warpgroup():
    text = wgmma_kernel(64, 16)
    with pytest.raises(InterpreterError, match="wgmma_desc of thread 1: shared byte 2 is not 16-byte aligned"):
        simulate(text.replace("%ap0 = addptr %sa, %c0", "%ap0 = addptr %sa, %tid"), 64, 16)
    split = ("  %half = div %tid, %c64 : i32\n  %hoff = mul %half, %c64 : i32\n"
             "  %ap0 = addptr %sa, %hoff")
    with pytest.raises(InterpreterError, match="the A descriptor differs between threads of a warpgroup .thread 64."):
        simulate(text.replace("  %ap0 = addptr %sa, %c0", split), 64, 16)
