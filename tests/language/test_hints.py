"""Hints and honesty: `multiple_of`, `max_contiguous` and `assume` feed the alignment analysis, and a
`tessera.pipeline` that gets less than it asked for says so.

The specification: a hint is a promise the interpreter checks (a broken one
is an InterpreterError at its line) and the analysis takes as a fact, so a
GEMM whose sizes are loaded from memory pipelines its K loop once they are
stated to be multiples of 16. Whenever a pipeline falls short (no async
copies, fewer stages, cp.async instead of TMA, no warp specialization), the
compile warns at the loop's line with the reason; in strict mode
(`TESSERA_STRICT=1` or `strict=True`) that is a CompileError.
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

import tessera
from tessera.passes.alignment import analyze

from everywhere import run_everywhere


def line_of(kernel, text: str) -> int:
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@tessera.kernel
def sized_by_memory(a_ptr, b_ptr, c_ptr, sizes_ptr, HINT: tessera.constexpr, BM: tessera.constexpr,
                    BN: tessera.constexpr, BK: tessera.constexpr, STAGES: tessera.constexpr = 3):
    """A GEMM whose M, N, K come from a device array (as in a grouped GEMM): the analysis cannot see them."""
    M = tessera.load(sizes_ptr)
    N = tessera.load(sizes_ptr + 1)
    K = tessera.load(sizes_ptr + 2)
    if HINT == "multiple_of":
        N = tessera.multiple_of(N, 16)
        K = tessera.multiple_of(K, 16)
    if HINT == "assume":
        tessera.assume((N % 16 == 0) and (K % 16 == 0))
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES):
        acc = tessera.dot(a.block((BM, BK), (0, k)).load(), b.block((BK, BN), (k, 0)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (0, 0)).store(acc)


def gemm_args(k: int = 64):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((32, k)).astype(np.float16)
    b = rng.standard_normal((k, 32)).astype(np.float16)
    return [a, b, np.zeros((32, 32), np.float32), np.array([32, 32, k], np.int32)]


BLOCKS = dict(BM=32, BN=32, BK=16)


def test_without_a_hint_the_pipeline_warns_at_its_line_why_it_runs_plain():
    with pytest.warns(tessera.PipelineWarning) as record:
        compiled = sized_by_memory.compile(*gemm_args(), HINT="none", target="sm_80", **BLOCKS)
    (warning,) = record.list
    assert warning.filename == inspect.getsourcefile(sized_by_memory.fn)
    assert warning.lineno == line_of(sized_by_memory, "tessera.pipeline(")
    message = str(warning.message)
    assert "kernel 'sized_by_memory': tessera.pipeline(stages=3) runs as a plain loop on sm_80" in message
    assert "alignment analysis proves runs of only 1 aligned element" in message
    assert "tessera.multiple_of or tessera.assume" in message
    assert "cp.async" not in compiled.stages["ptx"]


@pytest.mark.parametrize("hint", ["multiple_of", "assume"])
def test_a_stated_alignment_pipelines_the_loop_and_computes_the_same(hint):
    with warnings.catch_warnings():
        warnings.simplefilter("error", tessera.PipelineWarning)       # sm_80: the pipeline gets all it asked for
        compiled = sized_by_memory.compile(*gemm_args(), HINT=hint, target="sm_80", strict=True, **BLOCKS)
    assert compiled.stages["ptx"].count("cp.async.c") > 0          # .ca / .cg: copies into the ring
    _, _, c, _ = run_everywhere(sized_by_memory, gemm_args, (1,), targets=("sm_80",),
                                tolerance=dict(rtol=1e-5, atol=1e-5), HINT=hint, **BLOCKS)
    a, b, _, _ = gemm_args()
    np.testing.assert_allclose(c, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-3, atol=1e-3)


def test_cp_async_where_tma_was_possible_is_said_on_sm_90():
    """On sm_90 the host builds TMA tensor maps from kernel arguments; sizes loaded from memory rule it out."""
    with pytest.warns(tessera.PipelineWarning, match="cp.async instead of TMA for the block load at line "
                                                     f"{line_of(sized_by_memory, 'acc = tessera.dot')}.*sizes and "
                                                     "row stride are not constants or kernel arguments"):
        sized_by_memory.compile(*gemm_args(), HINT="multiple_of", target="sm_90", **BLOCKS)


def test_strict_mode_makes_a_shortfall_a_compile_error_at_the_loop(monkeypatch):
    monkeypatch.setenv("TESSERA_STRICT", "1")
    with pytest.raises(tessera.CompileError) as info:
        sized_by_memory.compile(*gemm_args(), HINT="none", target="sm_80", **BLOCKS)
    assert info.value.line == line_of(sized_by_memory, "tessera.pipeline(")
    assert "runs as a plain loop" in info.value.message and "strict mode" in info.value.message
    monkeypatch.setenv("TESSERA_STRICT", "0")
    with pytest.warns(tessera.PipelineWarning):
        sized_by_memory.compile(*gemm_args(), HINT="none", target="sm_80", **BLOCKS)


# The same kernel, its TMA shortfall on sm_90 accepted by its author (as decode's, in kernels_lib, is).
sized_by_memory_accepting_cp_async = tessera.kernel(tolerate=("sizes and row stride are not constants",))(
    sized_by_memory.fn)


def test_a_tolerated_shortfall_stays_a_warning_in_strict_mode_and_no_other_does():
    """`tessera.kernel(tolerate=...)`: the shortfall named stays a PipelineWarning under strict mode; the same
    kernel's other shortfalls (a plain loop where HINT="none" hides the alignment) still raise, and a kernel
    that tolerates nothing raises on both."""
    with pytest.warns(tessera.PipelineWarning, match="cp.async instead of TMA"):
        sized_by_memory_accepting_cp_async.compile(*gemm_args(), HINT="multiple_of", target="sm_90", strict=True,
                                                   **BLOCKS)
    with pytest.raises(tessera.CompileError, match="cp.async instead of TMA"):
        sized_by_memory.compile(*gemm_args(), HINT="multiple_of", target="sm_90", strict=True, **BLOCKS)
    with pytest.raises(tessera.CompileError, match="runs as a plain loop"):
        sized_by_memory_accepting_cp_async.compile(*gemm_args(), HINT="none", target="sm_80", strict=True,
                                                   **BLOCKS)


def test_tolerate_takes_parts_of_messages():
    with pytest.raises(tessera.KernelArgumentError, match="tolerate takes non-empty strings"):
        tessera.kernel(tolerate=("",))(sized_by_memory.fn)


def test_fewer_stages_than_asked_is_said():
    with pytest.warns(tessera.PipelineWarning, match=r"\d+ of the 64 stages fit in sm_80's shared memory"):
        sized_by_memory.compile(*gemm_args(), HINT="multiple_of", target="sm_80", BM=128, BN=128, BK=64, STAGES=64)


def test_no_async_copies_on_amd_is_said():
    with pytest.warns(tessera.PipelineWarning, match="runs as a plain loop on gfx90a .*no asynchronous copies"):
        sized_by_memory.compile(*gemm_args(), HINT="multiple_of", target="gfx90a", num_warps=2, **BLOCKS)


# -- promises the interpreter checks ---------------------------------------------------------------------------


def test_a_broken_multiple_of_is_an_error_at_its_line():
    with pytest.raises(tessera.InterpreterError, match="promised multiples of 16, but 40 is not one") as info:
        sized_by_memory[(1,)](*gemm_args(k=40), HINT="multiple_of", **BLOCKS)
    assert info.value.loc.line == line_of(sized_by_memory, "K = tessera.multiple_of(K, 16)")


def test_a_false_assumption_is_an_error_at_its_line():
    with pytest.raises(tessera.InterpreterError, match="tessera.assume: the condition is false") as info:
        sized_by_memory[(1,)](*gemm_args(k=40), HINT="assume", **BLOCKS)
    assert info.value.loc.line == line_of(sized_by_memory, "tessera.assume(")


@tessera.kernel
def wrapped_copy(x_ptr, out_ptr, n_ptr, PROMISE: tessera.constexpr, BLOCK: tessera.constexpr):
    """Offsets taken modulo a size from memory: the analysis loses their runs; the author knows the size is a
    multiple of BLOCK."""
    offs = (tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)) % tessera.load(n_ptr)
    if PROMISE:
        offs = tessera.max_contiguous(tessera.multiple_of(offs, BLOCK), BLOCK)
    tessera.store(out_ptr + offs, tessera.load(x_ptr + offs))


def copy_args(n: int = 256):
    return [np.arange(n, dtype=np.float32), np.zeros(n, np.float32), np.array([n], np.int32)]


def test_max_contiguous_and_multiple_of_restore_vector_accesses():
    def thread_ir(promise):
        return wrapped_copy.compile(*copy_args(), PROMISE=promise, BLOCK=128, target="sm_80", num_warps=1)

    assert "vector = 4" not in thread_ir(False).stages["thread_ir"]
    assert "vector = 4" in thread_ir(True).stages["thread_ir"]
    _, out, _ = run_everywhere(wrapped_copy, copy_args, (4,), num_warps=1, PROMISE=True, BLOCK=128)
    assert out.tolist() == list(range(256))


def test_a_broken_max_contiguous_is_an_error():
    with pytest.raises(tessera.InterpreterError, match="promised runs of 128 consecutive integers"):
        wrapped_copy[(2,)](*copy_args(200), PROMISE=True, BLOCK=128)


def test_the_analysis_takes_the_hints_as_facts():
    fn = wrapped_copy.specialize(*copy_args(), PROMISE=True, BLOCK=128).module.functions[0]
    facts = analyze(fn)
    hinted = next(op for op in fn.walk() if op.name == "max_contiguous").result
    assert facts[hinted].contiguity == (128,) and facts[hinted].divisibility == (128,)
    module = sized_by_memory.specialize(*gemm_args(), HINT="assume", **BLOCKS).module.functions[0]
    facts = analyze(module)
    view = next(op for op in module.walk() if op.name == "make_view").result
    assert facts[view].stride_divisibility[0] == 16        # the row stride K, after assume(K % 16 == 0)


@tessera.kernel
def hint_on_a_pointer(x_ptr):
    tessera.multiple_of(x_ptr, 16)


@tessera.kernel
def contiguous_scalar(n):
    tessera.max_contiguous(n, 16)


@tessera.kernel
def odd_hint(n):
    tessera.multiple_of(n, 12)


@pytest.mark.parametrize("kernel, args, fragment", [
    (hint_on_a_pointer, (np.zeros(4, np.float32),), "state it of the integer offsets"),
    (contiguous_scalar, (3,), "this is a scalar"),
    (odd_hint, (3,), "powers of two"),
])
def test_hints_that_say_nothing_sensible_are_compile_errors(kernel, args, fragment):
    with pytest.raises(tessera.CompileError, match=fragment):
        kernel.specialize(*args)
