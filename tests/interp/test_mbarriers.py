"""mbarriers with phases (`tessera.mbarriers`, `async_copy(..., barrier=)`, `bars[s].wait(p)`) in the tile interpreter.

Specification:

* a copy issued onto bars[s] lands when bars[s].wait(p) completes its phase
  (not at an async_wait: groups and phases are separate);
  the phase then advances and its parity flips, so a slot reused every
  other iteration waits on (k // 2) % 2;
* the mbarrier-based double-buffered matmul matches numpy;
* reading a copy's bytes before the wait of its phase, overwriting them
  (reusing the slot) before it, waiting on a phase with no copies (a
  deadlock), waiting with the previous phase's parity and ending the kernel
  with copies pending are InterpreterErrors at the op's line with the fix;
* misuse in the language (the whole array as barrier=, a parity of 2, .load
  on an mbarrier) is a compile-time error.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.backends.interp import InterpreterError, run_function
from tessera.dsl.errors import CompileError

from shared_kernels import F16_RESULT, MatmulCase, mbarrier_matmul


@tessera.kernel
def phases(x_ptr, out_ptr, MODE: tessera.constexpr):
    offs = tessera.arange(0, 16)
    buf = tessera.shared((16,), tessera.f32)
    bars = tessera.mbarriers(2)
    tessera.async_copy(buf, x_ptr + offs, barrier=bars[1])
    if MODE == "early-read":
        tessera.store(out_ptr + offs, buf.load())
    if MODE == "reuse":
        buf.store(offs.to(tessera.f32))
    if MODE == "deadlock":
        bars[0].wait(0)
    if MODE == "wrong-phase":
        bars[1].wait(1)
    if MODE != "pending":
        bars[1].wait(0)                                           # phase 0 of bars[1] completes
        tessera.store(out_ptr + offs, buf.load())
        tessera.async_copy(buf, x_ptr + 16 + offs, barrier=bars[1])
        if MODE == "stale-phase":
            bars[1].wait(0)
        bars[1].wait(1)                                           # phase 1: parity 1
        tessera.store(out_ptr + 16 + offs, buf.load())


def run_phases(mode: str) -> np.ndarray:
    x = np.arange(32, dtype=np.float32) + 1
    out = np.zeros(32, np.float32)
    phases.interpret(x, out, grid=(1,), MODE=mode)
    return out


def test_each_wait_lands_its_phase_and_the_parity_flips():
    np.testing.assert_array_equal(run_phases("ok"), np.arange(32, dtype=np.float32) + 1)


@pytest.mark.parametrize("mode,line_text,message", [
    ("early-read", "buf.load())", r"still writing .* add bars\[1\]\.wait\(0\) \(its phase 0\)"),
    ("reuse", "buf.store(", r"overwrites shared memory .* add bars\[1\]\.wait\(0\)"),
    ("deadlock", "bars[0].wait(0)", r"deadlock: waits for phase 0 of bars\[0\], but no copy .* would hang"),
    ("wrong-phase", "bars[1].wait(1)", r"wrong phase: no phase of parity 1 precedes phase 0 .*bars\[1\]\.wait\(0\)"),
    ("stale-phase", "bars[1].wait(0)", r"wrong phase: phase 0 \(parity 0\) of bars\[1\] already completed .*"
                                       r"bars\[1\]\.wait\(1\)"),
    ("pending", "barrier=bars[1])", r"ends with 1 async copies in flight.*add bars\[1\]\.wait\(0\)"),
])
def test_misuse_is_reported_at_its_line_with_the_fix(mode, line_text, message):
    with pytest.raises(InterpreterError, match=message) as info:
        run_phases(mode)
    lines = [i for i, text in enumerate(open(__file__).read().splitlines(), 1) if line_text in text]
    assert any(f":{line}" in str(info.value) for line in lines), str(info.value)


@tessera.kernel
def groups_and_phases(x_ptr, out_ptr, WAIT_PHASE: tessera.constexpr):
    offs = tessera.arange(0, 16)
    buf = tessera.shared((2, 16), tessera.f32)
    bars = tessera.mbarriers(1)
    tessera.async_copy(buf[0], x_ptr + offs)                     # a group copy
    tessera.async_copy(buf[1], x_ptr + 16 + offs, barrier=bars[0])
    tessera.async_commit()
    tessera.async_wait(0)                                        # lands the group, not the phase
    if WAIT_PHASE:
        bars[0].wait(0)
    tessera.store(out_ptr + offs, buf[0].load() + buf[1].load())


def test_a_group_wait_does_not_land_a_phase_and_the_phase_wait_does():
    x = np.arange(32, dtype=np.float32)
    out = np.zeros(16, np.float32)
    groups_and_phases.interpret(x, out, grid=(1,), WAIT_PHASE=True)
    np.testing.assert_array_equal(out, x[:16] + x[16:])
    with pytest.raises(InterpreterError, match=r"add bars\[0\]\.wait\(0\)"):
        groups_and_phases.interpret(x, out, grid=(1,), WAIT_PHASE=False)


@pytest.mark.parametrize("M,N,K", [(128, 64, 96), (61, 37, 80), (100, 130, 47), (64, 64, 32)], ids=str)
def test_the_mbarrier_matmul_matches_numpy(M, N, K):
    case = MatmulCase(M, N, K)
    args = case.args()
    run_function(case.module(mbarrier_matmul).functions[0], args, case.grid)
    np.testing.assert_allclose(args[2].astype(np.float32), case.expected(), **F16_RESULT)


@tessera.kernel
def misuse(x_ptr, MODE: tessera.constexpr):
    offs = tessera.arange(0, 16)
    buf = tessera.shared((16,), tessera.f32)
    bars = tessera.mbarriers(2)
    if MODE == "array":
        tessera.async_copy(buf, x_ptr + offs, barrier=bars)
    if MODE == "parity":
        bars[0].wait(2)
    if MODE == "load":
        bars[0].load()
    if MODE == "destination":
        tessera.async_copy(bars[0], x_ptr + offs)


@pytest.mark.parametrize("mode,message", [
    ("array", "barrier= is one mbarrier .*the whole array; index it"),
    ("parity", r"parity of the phase \(0 or 1\), got 2"),
    ("load", "an mbarrier has no attribute 'load'"),
    ("destination", "destination must be a shared buffer .* got mbarriers"),
])
def test_language_misuse_is_a_compile_time_error(mode, message):
    with pytest.raises(CompileError, match=message):
        misuse.specialize(np.zeros(16, np.float32), MODE=mode)
