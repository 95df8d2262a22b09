"""Properties over random kernels: generated well-typed programs compile and
match numpy; generated ill-typed or malformed programs fail with a
CompileError (never another exception)."""

import ast

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import tessera
from kernel_generator import BLOCK, NUMPY, Program, load_kernel, programs

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _inputs(dtype: str, seed: int):
    rng = np.random.default_rng(seed)
    if dtype == "i32":
        return rng.integers(-9, 10, BLOCK).astype(np.int32), rng.integers(-9, 10, BLOCK).astype(np.int32)
    return rng.uniform(-2, 2, BLOCK).astype(np.float32), rng.uniform(-2, 2, BLOCK).astype(np.float32)


@SETTINGS
@given(program=programs(), n=st.integers(1, BLOCK), seed=st.integers(0, 2**16))
def test_generated_kernel_matches_numpy(program: Program, n: int, seed: int):
    kernel = load_kernel(program.source("generated"), "generated")
    x, y = _inputs(program.dtype, seed)
    sentinel = NUMPY[program.dtype](77)
    out = np.full(BLOCK, sentinel)

    kernel[(1,)](x, y, out, n, BLOCK=BLOCK)

    expected = program.reference(x, y, n)
    if program.dtype == "f32":
        np.testing.assert_allclose(out[:n], expected, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(out[:n], expected)
    assert (out[n:] == sentinel).all(), "masked-off lanes must not be written"


# Each mutation turns a valid program's source into one that must not compile,
# and names the error class a kernel author should see.
MUTATIONS = {
    "unknown name": (lambda src: src.replace("tessera.store(out_ptr + offs, ", "tessera.store(out_ptr + offs, nope + "),
                     tessera.UnknownNameError),
    "shape mismatch": (lambda src: src.replace("    offs = tessera.arange(0, BLOCK)\n",
                                               "    offs = tessera.arange(0, BLOCK)\n"
                                               "    bad = offs + tessera.arange(0, 2 * BLOCK)\n"),
                       tessera.CompileError),
    "non-constexpr shape": (lambda src: src.replace("tessera.arange(0, BLOCK)", "tessera.arange(0, n)"),
                            tessera.ConstexprError),
    "lambda": (lambda src: src.replace("    mask = offs < n\n", "    mask = offs < n\n    f = lambda v: v\n"),
               tessera.UnsupportedSyntaxError),
    "item assignment": (lambda src: src.replace("    mask = offs < n\n", "    mask = offs < n\n    offs[0] = 1\n"),
                        tessera.UnsupportedSyntaxError),
    "loop-carried type change": (lambda src: src.replace("    mask = offs < n\n",
                                                         "    mask = offs < n\n    acc = offs\n"
                                                         "    for i in range(n):\n        acc = acc + 0.5\n"),
                                 tessera.LoopCarriedTypeError),
    "store through a scalar": (lambda src: src.replace("tessera.store(out_ptr + offs, ", "tessera.store(n, "),
                               tessera.CompileError),
    "missing builtin argument": (lambda src: src.replace("tessera.load(x_ptr + offs, mask=mask, other=0)",
                                                         "tessera.load()"),
                                 tessera.CompileError),
}


@SETTINGS
@given(program=programs(), mutation=st.sampled_from(sorted(MUTATIONS)))
def test_ill_typed_programs_raise_compile_error(program: Program, mutation: str):
    mutate, error = MUTATIONS[mutation]
    source = mutate(program.source("broken"))
    kernel = load_kernel(source, "broken")
    x, y = _inputs(program.dtype, 0)
    with pytest.raises(error) as info:
        kernel[(1,)](x, y, np.zeros(BLOCK, x.dtype), BLOCK, BLOCK=BLOCK)
    assert info.value.line is not None, "the error must point at a source line"


GARBAGE = st.text(alphabet="xyn0123456789+-*/%&|<>=()., ~", min_size=1, max_size=24)


@SETTINGS
@given(program=programs(), garbage=GARBAGE, which=st.integers(0, 10))
def test_malformed_source_never_escapes_as_another_exception(program: Program, garbage: str, which: int):
    """Splice a random Python expression into a random statement: it compiles and runs, or raises CompileError."""
    lines = program.source("garbled").splitlines()
    # Not a while loop's counter step (`j += 1`): `j += 0` is a well-formed kernel that never ends.
    body = [i for i, line in enumerate(lines) if line.startswith("    ") and "=" in line and "==" not in line
            and not line.strip().startswith("j +=")]
    index = body[which % len(body)]
    target = lines[index].split("=")[0]
    candidate = f"{target}= {garbage}"
    try:
        ast.parse(candidate.strip())
    except SyntaxError:
        assume(False)
    lines[index] = candidate
    kernel = load_kernel("\n".join(lines) + "\n", "garbled")
    x, y = _inputs(program.dtype, 1)
    try:
        kernel[(1,)](x, y, np.zeros(BLOCK, x.dtype), BLOCK, BLOCK=BLOCK)
    except tessera.CompileError:
        pass
    except tessera.InterpreterError:
        pass  # a well-typed kernel that divides by zero or leaves its memory: a runtime report, not a crash


# --- the same random programs through the GPU pipeline -------------------------

from tessera.backends.interp import run_function  # noqa: E402

from tessera.backends.simt import run_threads  # noqa: E402
from tessera.backends.nvptx import compile_thread_ir, find_ptxas  # noqa: E402
from tessera.ir.target import get_target  # noqa: E402
from tessera.passes.thread_passes import lower  # noqa: E402

HAVE_PTXAS = find_ptxas() is not None


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs(), n=st.integers(1, BLOCK), seed=st.integers(0, 2**16), num_warps=st.sampled_from([1, 2]))
def test_generated_kernel_lowered_to_threads_matches_the_tile_interpreter(program, n, seed, num_warps):
    """Lowering + SIMT simulator computes what the tile interpreter computes; the PTX assembles."""
    kernel = load_kernel(program.source("lowered"), "lowered")
    x, y = _inputs(program.dtype, seed)
    module = kernel.specialize(x, y, np.zeros_like(x), n, BLOCK=BLOCK).module
    tile_out, thread_out = np.full(BLOCK, 77, x.dtype), np.full(BLOCK, 77, x.dtype)

    run_function(module.functions[0], [x, y, tile_out, n], grid=(1,))
    threads = lower(module, get_target("sm_80"), num_warps=num_warps)
    run_threads(threads.functions[0], [x, y, thread_out, n], grid=(1,))

    if program.dtype == "f32":   # reductions may associate differently: documented tolerance
        np.testing.assert_allclose(thread_out, tile_out, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(thread_out, tile_out)
    for target in ("sm_80", "sm_90a"):
        lowered = threads if target == "sm_80" else lower(module, get_target(target), num_warps=num_warps)
        artifacts = compile_thread_ir(lowered.functions[0], target, assemble=HAVE_PTXAS)
        assert ".entry lowered" in artifacts.ptx
        if HAVE_PTXAS:
            assert artifacts.ptxas_info["spill_stores"] == 0
