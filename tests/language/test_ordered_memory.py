"""Ordered accesses between programs and polite polling: `load(..., sem="acquire")`, `store(..., sem="release")`
and `nanosleep(ns)` (tessera/dsl/language/memory.py).

A program publishes rows with a release store and another polls with acquire loads, backing off with nanosleep:
on the interpreter (whose cooperative scheduler parks the poll), on the SIMT simulator, through ptxas for sm_80
and sm_90a and through ld.lld for gfx942 (`run_everywhere`); the generated code holds the ordered instructions,
and the release follows a barrier so that one thread's release covers every thread's writes.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tessera
from tessera.backends.interp import InterpreterError
from tessera.ir.parser import parse_module

from cooperative_kernels import gather_when_all_ready, handoff, polite_handoff  # noqa: E402  (tests/interp)
from everywhere import run_everywhere

N = 64


def _handoff_args():
    return [np.zeros(1, np.int32), np.zeros(N, np.int32), np.zeros(N, np.int32)]


def test_a_release_store_hands_a_row_to_a_program_polling_with_acquire_loads():
    flag, data, out = run_everywhere(polite_handoff, _handoff_args, (2,), N=N)
    np.testing.assert_array_equal(data, np.arange(N) * 3)
    np.testing.assert_array_equal(out, np.arange(N) * 3 + 1)      # program 0 read the row after the flag
    assert flag[0] == 1


def test_a_tile_of_acquire_loads_waits_for_every_programs_flag():
    programs = 4
    flags, data, out = run_everywhere(gather_when_all_ready, lambda: [np.zeros(8, np.int32),
                                                                      np.zeros(programs * N, np.int32),
                                                                      np.zeros(N, np.int32)], (programs,), N=N)
    np.testing.assert_array_equal(flags, [0, 1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(out, sum(np.arange(N) + p for p in range(1, programs)))


def test_a_backing_off_poll_still_parks_and_a_hopeless_one_is_a_deadlock_naming_its_loop():
    """The poll's carried pause doubles until it stops changing; from then an iteration changes nothing, so the
    cooperative scheduler parks it like any spin loop (and names it when nobody can wake it)."""
    line = polite_handoff.fn.__code__.co_firstlineno + 7          # the `while` line
    with pytest.raises(InterpreterError, match=rf"deadlock(.|\n)*program \(0, 0, 0\) spins in the while loop at "
                                               rf"\S*cooperative_kernels.py:{line}"):
        polite_handoff.interpret(*_handoff_args(), grid=(2,), resident=1, N=N)


def _compiled(kernel, target, **constexprs):
    return kernel.compile(signature="*i32:16,*i32:16,*i32:16", target=target, **constexprs)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_nvptx_polls_with_ld_acquire_gpu_and_sleeps_with_nanosleep(target):
    ptx = _compiled(polite_handoff, target, N=N).stages["ptx"]
    assert re.search(r"ld\.acquire\.gpu(\.global)?\.b32", ptx)
    assert re.search(r"st\.release\.gpu(\.global)?\.b32", ptx)
    assert re.search(r"nanosleep\.u32\s+%r\d+;", ptx)           # the doubling pause: a register
    assert "atom." not in ptx and "fence.acq_rel" not in ptx    # no read-modify-write, no full fences


def test_a_constant_pause_is_an_immediate_on_nvidia_and_units_of_64_clocks_on_amd():
    @tessera.kernel
    def sleepy(flag, data, out):
        while tessera.load(flag, sem="acquire") == 0:
            tessera.nanosleep(100)
        tessera.store(out, tessera.load(data))

    ptx = _compiled(sleepy, "sm_80").stages["ptx"]
    assert "nanosleep.u32 \t100;" in ptx
    # flag is read-only here, but another program writes it: no non-coherent load for it (LLVM aborted selecting
    # one for the acquire), while data keeps its read-only path
    assert re.search(r"ld\.acquire\.gpu(\.global)?\.b32", ptx) and "ld.global.nc.b32" in ptx
    header = next(line for line in _compiled(sleepy, "sm_80").stages["llvm_ir"].splitlines()
                  if line.startswith("define"))
    assert "noalias %\"flag\"" not in header and "noalias %\"data\"" in header
    assert re.search(r"s_sleep 4\b", _compiled(sleepy, "gfx942").stages["amdgcn"])   # ceil(100 / 30)


def test_gfx942_orders_with_agent_scope_cache_maintenance_and_sleeps_with_s_sleep():
    asm = _compiled(polite_handoff, "gfx942", N=N).stages["amdgcn"]
    assert re.search(r"global_load_dword v\d+, v\d+, s\[\d+:\d+\] sc1\n\s+s_waitcnt vmcnt\(0\)\n\s+buffer_inv sc1",
                     asm)
    assert re.search(r"buffer_wbl2 sc1\n(\s+s_waitcnt.*\n)?\s+global_store_dword v\d+, v\d+, s\[\d+:\d+\] sc1", asm)
    assert "s_sleep 1" in asm                                  # a run-time pause: a loop of one-unit sleeps


def _thread_ir(kernel, *args, **constexprs) -> str:
    return _compiled(kernel, "sm_80", **constexprs).stages["thread_ir"]


@pytest.mark.parametrize("kernel, publish", [(polite_handoff, "store_release"), (handoff, "atomic_rmw")])
def test_one_threads_release_follows_a_barrier_so_it_covers_every_threads_writes(kernel, publish):
    """Thread 0 alone performs a scalar release store or atomic; without a barrier first, another warp's stores
    of the published row could still be in flight when the flag is seen."""
    text = _thread_ir(kernel, **({"N": N} if kernel is polite_handoff else {}))
    ops = [m.group(1) for m in re.finditer(r"^\s*(?:%\S+ = )?(\w+)", text, re.M)]
    release = max(i for i, name in enumerate(ops) if name == publish)
    row_store = max(i for i, name in enumerate(ops[:release]) if name == "store")
    assert "barrier" in ops[row_store:release], ops[row_store:release + 1]


def test_the_thread_ir_round_trips_with_the_ordered_ops():
    text = _thread_ir(polite_handoff, N=N)
    names = {op.name for op in parse_module(text).functions[0].walk()}
    assert {"load_acquire", "store_release", "nanosleep"} <= names


# -- mistakes ------------------------------------------------------------------------------------------------


def _error(kernel, *args, **kwargs) -> str:
    with pytest.raises(tessera.CompileError) as e:
        kernel.interpret(*args, grid=(1,), **kwargs)
    return str(e.value)


def test_an_unknown_sem_names_the_kernel_the_line_and_the_choices():
    @tessera.kernel
    def bogus_sem(flag, data, out):
        tessera.store(out, tessera.load(flag, sem="bogus"))

    message = _error(bogus_sem, *_handoff_args())
    assert re.search(r"kernel 'bogus_sem' at \S+test_ordered_memory.py:\d+", message)
    assert 'tessera.load(flag, sem="bogus")' in message
    assert "load's sem must be 'acquire' (GPU scope) or None for a plain load, got str 'bogus'" in message


def test_a_release_load_or_an_acquire_store_is_refused():
    @tessera.kernel
    def acquire_store(flag, data, out):
        tessera.store(flag, 1, sem="acquire")

    assert "store's sem must be 'release'" in _error(acquire_store, *_handoff_args())


def test_sem_must_be_known_at_compile_time():
    @tessera.kernel
    def traced_sem(flag, data, out):
        tessera.store(out, tessera.load(flag, sem=tessera.load(data)))

    assert "load's sem must be known at compile time" in _error(traced_sem, *_handoff_args())


@tessera.kernel
def nap_float(flag, data, out):
    tessera.nanosleep(1.5)


@tessera.kernel
def nap_tile(flag, data, out):
    tessera.nanosleep(tessera.arange(0, 4))


@tessera.kernel
def nap_negative(flag, data, out):
    tessera.nanosleep(-1)


@pytest.mark.parametrize("kernel, call, fix", [
    (nap_float, "tessera.nanosleep(1.5)", "nanosleep needs an integer number of nanoseconds"),
    (nap_tile, "tessera.nanosleep(tessera.arange(0, 4))", "nanosleep needs an integer number of nanoseconds"),
    (nap_negative, "tessera.nanosleep(-1)", "nanosleep's ns must be in [0, 2**31), got -1")])
def test_nanosleep_needs_a_non_negative_integer_scalar(kernel, call, fix):
    message = _error(kernel, *_handoff_args())
    assert f"kernel '{kernel.fn.__name__}'" in message and call in message and fix in message


def test_a_float_scalar_pause_is_a_type_error():
    @tessera.kernel
    def float_nap(flag, data, out):
        tessera.nanosleep(tessera.load(flag).to(tessera.f32))

    assert "nanosleep needs an integer number of nanoseconds" in _error(float_nap, *_handoff_args())


def test_an_ordered_access_of_packed_elements_is_refused():
    @tessera.kernel
    def packed_flag(flags, out):
        tessera.store(out, tessera.load(flags, sem="acquire").to(tessera.i32))

    with pytest.raises(tessera.CompileError, match=r"sem='acquire' accesses whole elements.*packed i4"):
        packed_flag.compile(signature="*i4:16,*i32:16", target="sm_80")
