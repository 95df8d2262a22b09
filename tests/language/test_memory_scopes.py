"""`scope=` of ordered accesses and atomics: "cta", "cluster", "gpu" (the default) and "sys"
(tessera/dsl/language/memory.py; the IR attribute `scope` in tessera/ir/ops.py).

Each scope reaches the instruction (PTX `ld.acquire.<scope>`, `st.release.<scope>`, `atom.*.<scope>`,
`fence.acq_rel.<scope>`; AMDGPU's syncscopes) and ptxas / ld.lld accept what is emitted; the default
leaves the code exactly as before scopes existed; the SIMT simulator reports a release/acquire pair of
two blocks whose scopes do not hold each other; bad scopes are errors at the user's line.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tessera
from tessera.backends.amdgpu.linker import find_linker
from tessera.backends.interp import InterpreterError
from tessera.backends.nvptx.ptxas import find_ptxas
from tessera.backends.simt import run_threads
from tessera.ir.errors import VerifyError
from tessera.ir.parser import parse_module
from tessera.ir.verifier import verify_function
from tessera.passes.thread_passes import lower

N = 64
SIGNATURE = "*i32:16,*i32:16,*i32:16"
PTX_SCOPE = {"cta": "cta", "cluster": "cluster", "gpu": "gpu", "sys": "sys"}


@tessera.kernel
def scoped_handoff(flag, data, out, SCOPE: tessera.constexpr):
    """Program 1 writes a row and publishes it with a release store at SCOPE; program 0 waits for it with
    acquire loads at SCOPE and copies the row (N = 64)."""
    offs = tessera.arange(0, 64)
    if tessera.program_id(0) == 0:
        while tessera.load(flag, sem="acquire", scope=SCOPE) < 1:
            tessera.nanosleep(32)
        tessera.store(out + offs, tessera.load(data + offs) + 1)
    else:
        tessera.store(data + offs, offs * 3)
        tessera.store(flag, 1, sem="release", scope=SCOPE)


@tessera.kernel
def scoped_atomics(flag, data, out, SCOPE: tessera.constexpr):
    """Every atomic at SCOPE on a counter of this program's own (out[program]), and one compare-and-swap."""
    mine = out + tessera.program_id(0)
    old = tessera.atomic_add(mine, 1, scope=SCOPE)
    tessera.atomic_max(mine, old + 5, scope=SCOPE)
    tessera.atomic_cas(mine, 5, 7, scope=SCOPE)
    tessera.store(data + tessera.program_id(0), tessera.load(flag, sem="acquire", scope=SCOPE))


def _compile(kernel, target, scope, signature=SIGNATURE):
    return kernel.compile(signature=signature, target=target, SCOPE=scope)


def _ordered_lines(ptx: str) -> list[str]:
    return [line.strip() for line in ptx.splitlines()
            if re.match(r"\s*(atom|fence|ld\.acquire|st\.release|red)\b", line)]


# -- NVPTX ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target, scope", [("sm_80", "cta"), ("sm_80", "sys"), ("sm_90a", "cta"),
                                           ("sm_90a", "cluster"), ("sm_90a", "sys")])
def test_each_scope_reaches_every_ordered_instruction_and_ptxas_accepts_it(target, scope):
    for kernel in (scoped_handoff, scoped_atomics):
        compiled = _compile(kernel, target, scope)
        lines = _ordered_lines(compiled.stages["ptx"])
        assert lines and all(f".{PTX_SCOPE[scope]}" in line for line in lines), lines
        assert (compiled.binary is not None) == (find_ptxas() is not None)
    handoff = _compile(scoped_handoff, target, scope).stages["ptx"]
    assert re.search(rf"ld\.acquire\.{scope}\.global\.b32", handoff)
    assert re.search(rf"st\.release\.{scope}\.global\.b32", handoff)
    atomics = _compile(scoped_atomics, target, scope).stages["ptx"]
    # the native atomics are written with their scope (LLVM 22 would print a bare, GPU-scope `atom.global.add`)
    assert re.search(rf"atom\.relaxed\.{scope}\.global\.add\.u32", atomics)
    assert re.search(rf"atom\.relaxed\.{scope}\.global\.max\.s32", atomics)
    assert re.search(rf"atom\.acq_rel\.{scope}\.global\.cas\.b32", atomics)
    assert re.search(rf"fence\.acq_rel\.{scope};", atomics)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_the_default_scope_is_the_gpu_and_leaves_the_code_as_it_was(target):
    """No `scope` attribute in the IR for the default, and scope='gpu' compiles to the same PTX: atomics keep
    LLVM's bare `atom.global.<op>` between GPU-scope fences."""
    explicit = _compile(scoped_atomics, target, "gpu")
    implicit = tessera.kernel(_without_scope()).compile(signature=SIGNATURE, target=target)
    assert "scope =" not in explicit.stages["tile_ir"] and "scope =" not in explicit.stages["thread_ir"]
    assert explicit.stages["ptx"] == implicit.stages["ptx"].replace("without_scope", "scoped_atomics")
    ptx = explicit.stages["ptx"]
    assert re.search(r"atom\.global\.add\.u32", ptx) and "atom.relaxed" not in ptx
    assert re.search(r"atom\.acq_rel\.gpu\.global\.cas\.b32", ptx) and "fence.acq_rel.gpu;" in ptx


def _without_scope():
    """`scoped_atomics` as written before scopes existed."""
    def without_scope(flag, data, out):
        mine = out + tessera.program_id(0)
        old = tessera.atomic_add(mine, 1)
        tessera.atomic_max(mine, old + 5)
        tessera.atomic_cas(mine, 5, 7)
        tessera.store(data + tessera.program_id(0), tessera.load(flag, sem="acquire"))
    return without_scope


ATOMIC_DTYPES = ["i8", "i16", "i32", "i64", "u32", "u64", "f16", "bf16", "f32", "f64"]


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype", ATOMIC_DTYPES)
def test_no_atomic_of_any_kind_or_dtype_falls_back_to_gpu_scope(target, dtype):
    """A "sys" atomic must be atomic at system scope: every `atom` of every kind carries `.sys` (the native
    ones written by Tessera, the rest in LLVM's compare-and-swap loop), whatever the dtype and target."""
    @tessera.kernel
    def every_atomic(p, v):
        x = tessera.load(v)
        tessera.atomic_add(p, x, scope="sys")
        tessera.atomic_max(p + 1, x, scope="sys")
        tessera.atomic_min(p + 2, x, scope="sys")
        tessera.atomic_xchg(p + 3, x, scope="sys")
        tessera.atomic_cas(p + 4, x, x, scope="sys")

    @tessera.kernel
    def every_bitwise_atomic(p, v):
        x = tessera.load(v)
        tessera.atomic_and(p, x, scope="sys")
        tessera.atomic_or(p + 1, x, scope="sys")
        tessera.atomic_xor(p + 2, x, scope="sys")

    kernels = [every_atomic] + ([every_bitwise_atomic] if dtype[0] in "iu" else [])
    for kernel in kernels:
        compiled = kernel.compile(signature=f"*{dtype}:16,*{dtype}:16", target=target)
        atoms = [line for line in _ordered_lines(compiled.stages["ptx"]) if line.startswith("atom")]
        assert atoms and all(".sys." in line for line in atoms), atoms
        assert (compiled.binary is not None) == (find_ptxas() is not None)


# -- AMDGPU --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scope, syncscope", [("cta", 'syncscope("workgroup") '), ("gpu", 'syncscope("agent") '),
                                              ("sys", "")], ids=["cta", "gpu_scope", "sys"])
def test_amdgpu_uses_the_scopes_llvm_syncscope(scope, syncscope):
    for kernel in (scoped_handoff, scoped_atomics):
        compiled = _compile(kernel, "gfx942", scope)
        ordered = [line for line in compiled.stages["llvm_ir"].splitlines()
                   if re.search(r"load atomic|store atomic|atomicrmw|cmpxchg", line)]
        assert ordered and all(re.search(rf" {re.escape(syncscope)}(acquire|release|monotonic|acq_rel)\b", line)
                               for line in ordered), ordered
        assert (compiled.binary is not None) == (find_linker() is not None)
    text = _compile(scoped_atomics, "gfx942", scope).stages["llvm_ir"]
    assert re.search(rf"fence {re.escape(syncscope)}release", text)


# -- the SIMT simulator --------------------------------------------------------------------------------------


def _handoff_args():
    return [np.zeros(1, np.int32), np.zeros(N, np.int32), np.zeros(N, np.int32)]


def _threads(kernel, target="sm_90a", **constexprs):
    """The kernel's thread IR as lowered (with source locations, which the simulator's reports name)."""
    return lower(kernel.specialize(*_handoff_args(), **constexprs).module, target, 4).functions[0]


def _simulate(kernel, scope, grid, target="sm_90a"):
    args = _handoff_args()
    run_threads(_threads(kernel, target, SCOPE=scope), args, grid)
    return args


@pytest.mark.parametrize("scope", ["gpu", "sys"], ids=["gpu_scope", "sys_scope"])   # (a `gpu` id marks a GPU test)
def test_a_gpu_or_system_scope_handoff_between_programs_synchronizes(scope):
    flag, data, out = _simulate(scoped_handoff, scope, (2,))
    np.testing.assert_array_equal(out, np.arange(N) * 3 + 1)


@pytest.mark.parametrize("scope", ["cta", "cluster"])
def test_a_cta_or_cluster_scope_handoff_between_programs_is_a_scope_race(scope):
    """Program 1 releases at a scope that does not hold program 0 (no clusters: a cluster is one block), so on a
    GPU program 0 could see the flag and still read a stale row; the interpreter runs it (one program at a time,
    every access is ordered) but the simulator names both ops and the fix."""
    flag, data, out = _handoff_args()
    scoped_handoff[(2,)](flag, data, out, SCOPE=scope)         # the interpreter accepts the argument
    np.testing.assert_array_equal(out, np.arange(N) * 3 + 1)
    release_line = scoped_handoff.fn.__code__.co_firstlineno + 11     # (the decorator's line is the first)
    with pytest.raises(InterpreterError, match=rf"scope race: this load_acquire \(scope '{scope}'\) in block "
                                               rf"\(0, 0, 0\) reads 'flag' that block \(1, 0, 0\) wrote with "
                                               rf"store_release \(scope '{scope}'\) at \S+:{release_line}(.|\n)*"
                                               rf"Use scope='gpu' \(the default\) on both sides"):
        _simulate(scoped_handoff, scope, (2,))


def test_cta_scope_synchronizes_the_threads_of_one_block():
    """One program: its scalar atomics and acquire (one thread each, after a barrier) are all the block's."""
    flag, data, out = _simulate(scoped_atomics, "cta", (1,))
    assert out[0] == 7


def test_cta_scope_atomics_of_two_programs_on_one_counter_race():
    @tessera.kernel
    def shared_counter(flag, data, out):
        tessera.atomic_add(out, 1, scope="cta")

    fn = _threads(shared_counter, "sm_80")
    with pytest.raises(InterpreterError, match=r"scope race: this atomic_rmw \(scope 'cta'\) in block \(1, 0, 0\) "
                                               r"reads 'out' that block \(0, 0, 0\) wrote with atomic_rmw"):
        run_threads(fn, _handoff_args(), (2,))
    run_threads(fn, _handoff_args(), (1,))         # one block: nothing to race with


@tessera.kernel
def cluster_counters(flag, data, out, SHARED: tessera.constexpr):
    """Clusters of 2 programs; each adds 1 at cluster scope to its cluster's counter, or (SHARED) to one counter
    every cluster shares."""
    tessera.cluster_dims(2)
    counter = out if SHARED else out + tessera.cluster_id(0)
    tessera.atomic_add(counter, 1, scope="cluster")


def test_cluster_scope_synchronizes_a_cluster_and_races_between_clusters():
    def simulate(shared):
        args = _handoff_args()
        run_threads(_threads(cluster_counters, SHARED=shared), args, (4,))
        return args[2]

    np.testing.assert_array_equal(simulate(False)[:2], [2, 2])
    with pytest.raises(InterpreterError, match=r"scope race: this atomic_rmw \(scope 'cluster'\) in block "
                                               r"\(2, 0, 0\) reads 'out' that block \(1, 0, 0\) wrote(.|\n)*"
                                               r"'cluster' holds the blocks of its own cluster"):
        simulate(True)


# -- mistakes ------------------------------------------------------------------------------------------------


def _error(kernel, target="sm_80", **constexprs) -> str:
    with pytest.raises(tessera.CompileError) as e:
        kernel.compile(signature=SIGNATURE, target=target, **constexprs)
    return str(e.value)


def test_an_unknown_scope_names_the_kernel_the_line_and_the_choices():
    @tessera.kernel
    def block_scope(flag, data, out):
        tessera.store(out, tessera.load(flag, sem="acquire", scope="block"))

    message = _error(block_scope)
    assert re.search(r"kernel 'block_scope' at \S+test_memory_scopes.py:\d+", message)
    assert 'tessera.load(flag, sem="acquire", scope="block")' in message
    assert "load's scope must be one of 'cta', 'cluster', 'gpu', 'sys', got str 'block'" in message


def test_a_scope_on_a_plain_load_or_store_is_refused_with_the_fix():
    @tessera.kernel
    def plain_scoped(flag, data, out):
        tessera.store(out, tessera.load(flag), scope="cta")

    message = _error(plain_scoped)
    assert "tessera.store(out, tessera.load(flag), scope=\"cta\")" in message
    assert "store's scope='cta' says whom an ordered store synchronizes with, but this store has no sem" in message
    assert "add sem='release'" in message


def test_an_atomics_scope_must_be_known_at_compile_time():
    @tessera.kernel
    def traced_scope(flag, data, out):
        tessera.atomic_add(out, 1, scope=tessera.load(flag))

    assert "atomic_add's scope must be known at compile time" in _error(traced_scope)


@pytest.mark.parametrize("target, fix", [
    ("sm_80", "scope='cluster' needs thread-block clusters (sm_90+), which sm_80 lacks; use scope='gpu'"),
    ("gfx942", "scope='cluster' has no meaning on gfx942: AMD GPUs of this generation have no thread-block "
               "clusters")])
def test_cluster_scope_on_a_target_without_clusters_is_refused_at_the_line(target, fix):
    message = _error(scoped_handoff, target, SCOPE="cluster")
    assert "kernel 'scoped_handoff'" in message and fix in message
    assert re.search(r"test_memory_scopes.py:\d+", message) and 'scope=SCOPE' in message


def test_the_ir_carries_the_scope_and_the_verifier_refuses_an_unknown_one():
    text = _compile(scoped_handoff, "sm_90a", "cta").stages["thread_ir"]
    assert re.search(r'load_acquire .*\{scope = "cta"\}', text) and re.search(r'store_release .*\{scope = "cta"\}',
                                                                              text)
    fn = parse_module(text.replace('scope = "cta"', 'scope = "warp"')).functions[0]
    with pytest.raises(VerifyError, match=r"scope must be one of \('cta', 'cluster', 'gpu', 'sys'\), got 'warp'"):
        verify_function(fn)


# -- the SIMT simulator's happens-before check (run_threads(..., global_races=True)) --------------------------


@tessera.kernel
def handoff(flag, data, out, RELEASE: tessera.constexpr, ACQUIRE: tessera.constexpr):
    """`scoped_handoff` at GPU scope, with the release (RELEASE) or the acquire (ACQUIRE) made a plain access."""
    offs = tessera.arange(0, 64)
    if tessera.program_id(0) == 0:
        if ACQUIRE:
            while tessera.load(flag, sem="acquire") < 1:
                tessera.nanosleep(32)
        else:
            while tessera.load(flag) < 1:
                tessera.nanosleep(32)
        tessera.store(out + offs, tessera.load(data + offs) + 1)
    else:
        tessera.store(data + offs, offs * 3)
        if RELEASE:
            tessera.store(flag, 1, sem="release")
        else:
            tessera.store(flag, 1)


@pytest.mark.parametrize("release, acquire, race", [
    (True, True, None),
    (False, True, r"this load_acquire in block \(0, 0, 0\) touches 'flag' that block \(1, 0, 0\) wrote with store"),
    (True, False, r"this load in block \(0, 0, 0\) touches 'flag' that block \(1, 0, 0\) wrote with store_release")])
def test_the_happens_before_check_wants_a_release_and_an_acquire(release, acquire, race):
    """Without `global_races` every variant runs (blocks run one at a time); with it, the data moves only with
    a release read by an acquire, and a plain flag on either side is reported."""
    args = _handoff_args()
    run_threads(_threads(handoff, RELEASE=release, ACQUIRE=acquire), args, (2,))
    np.testing.assert_array_equal(args[2], np.arange(N) * 3 + 1)
    args = _handoff_args()
    fn = _threads(handoff, RELEASE=release, ACQUIRE=acquire)
    if race is None:
        run_threads(fn, args, (2,), global_races=True)
        np.testing.assert_array_equal(args[2], np.arange(N) * 3 + 1)
    else:
        with pytest.raises(InterpreterError, match="global-memory race: " + race):
            run_threads(fn, args, (2,), global_races=True)


def test_the_happens_before_check_ignores_shared_memory_whose_bytes_a_later_block_reuses():
    """A block's shared memory dies with the block, and numpy may give a later block the same bytes, so the check
    follows global memory only (it once reported the stream-K kernel's shared ring as a race between blocks)."""
    from tessera.backends.interp.values import Pointers
    from tessera.backends.simt.scopes import global_addresses
    from tessera.backends.simt.shared import SharedMemory
    from tessera.ir import dtypes

    region = SharedMemory(256).region(0, 256, dtypes.f32)
    assert global_addresses(Pointers(region, np.arange(4, dtype=np.int64)), None) is None
