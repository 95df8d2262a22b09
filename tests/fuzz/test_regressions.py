"""Every defect the fuzzer found, as the smallest kernel that showed it (the fuzz case is named in each test)."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.passes.thread_passes import lower


@pytest.fixture(autouse=True)
def bounded_compiles(monkeypatch):
    """A regression to a hang fails in 20 s instead of waiting out the default limit."""
    monkeypatch.setenv("TESSERA_COMPILE_TIMEOUT", "20")


def simulated_like_interpreted(kernel, args: list, target: str, num_warps: int = 4, **constexprs) -> list:
    """Run `kernel` lowered for `target` on the SIMT simulator and on the tile interpreter; assert the same
    bytes come out, and return the simulator's arguments."""
    expected, actual = [np.copy(a) for a in args], [np.copy(a) for a in args]
    module = kernel.specialize(*expected, **constexprs).module
    run_function(module.functions[0], expected, (1,))
    run_threads(lower(module, target, num_warps=num_warps).functions[0], actual, (1,))
    for want, got in zip(expected, actual):
        assert got.tobytes() == want.tobytes()
    return actual


@tessera.kernel
def dot_into_bool(a_ptr, b_ptr, c_ptr, M: tessera.constexpr):
    r = tessera.arange(0, M)
    a = tessera.load(a_ptr + r[:, None] * M + r[None, :])
    b = tessera.load(b_ptr + r[:, None] * M + r[None, :])
    acc = tessera.dot(a, b, tessera.zeros((M, M), tessera.bool_))
    tessera.store(c_ptr + r[:, None] * M + r[None, :], acc)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "gfx942"])
def test_mutant_2_373_a_dot_into_a_bool_accumulator_is_a_type_error_at_its_line(target):
    """Was a TypeRuleError from the lowering (FMA arithmetic on bool registers)."""
    with pytest.raises(tessera.TypeMismatchError, match=r"must be a number, got tile<16x16xbool>; start it from "
                                                         r"tessera.zeros\(\(16, 16\), tessera.f32\)") as info:
        dot_into_bool.compile(signature="*f16:16,*f16:16,*f32:16", M=16, target=target)
    assert "acc = tessera.dot(a, b, tessera.zeros((M, M), tessera.bool_))" in str(info.value)


@tessera.kernel
def scalar_pointer_widened(x_ptr, out_ptr, M: tessera.constexpr, N: tessera.constexpr):
    rows = tessera.arange(0, M)
    cols = tessera.arange(0, N)
    x = tessera.load(tessera.expand_dims(x_ptr, 0) + rows[:, None] * N + cols[None, :])
    tessera.store(out_ptr + rows, tessera.max(x, axis=1))


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "gfx942"])
def test_mutant_2_842_a_pointer_tile_made_from_a_scalar_pointer_compiles_in_any_layout(target):
    """Was an AttributeError on gfx942: rebuilding `expand_dims(x_ptr, 0)` in another layout read the scalar
    pointer's type as a tile's."""
    assert scalar_pointer_widened.compile(signature="*f32:16,*f32:16", M=4, N=32, target=target).stages["llvm_ir"]
    x = np.arange(128, dtype=np.float32)
    _, out = simulated_like_interpreted(scalar_pointer_widened, [x, np.zeros(4, np.float32)], target, M=4, N=32)
    np.testing.assert_array_equal(out, x.reshape(4, 32).max(axis=1))


@tessera.kernel
def narrowed_to_f64(x_ptr, out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs)
    tessera.store(out_ptr + offs, (x + offs % 3).to(tessera.f64))


def test_mutant_2_1530_a_one_register_cast_of_a_narrowed_value_compiles_for_amd():
    """Was a hang in LLVM's AMDGPU code generation (a `<1 x i64>` zero_extend of `offs % 3`, narrowed to i8 by
    the optimizer); one-register casts are now done on the scalar."""
    compiled = narrowed_to_f64.compile(signature="*u32:16,*f64:16", BLOCK=128, num_warps=4, target="gfx942")
    assert "zext <1 x i32>" not in compiled.stages["llvm_ir"] and "v_cvt_f64_u32" in compiled.stages["amdgcn"]


@tessera.kernel
def argmax_down(x_ptr, out_ptr, R: tessera.constexpr):
    offs = tessera.arange(0, R)[:, None] + tessera.arange(0, 1)[None, :]
    r = tessera.argmax(tessera.load(x_ptr + offs), axis=0, keep_dims=True)
    tessera.store(out_ptr + tessera.arange(0, 1), tessera.reshape(r, (1,)))


def test_unusual_2_500_an_argmax_down_a_tall_tile_folds_registers_before_lanes():
    """Was ptxas past 30 s: folded in index order, an argmax over (4096, 1) at one warp shuffled all 128
    registers of each lane (1,280 shuffles). Ties now break on the index, so registers fold first."""
    compiled = argmax_down.compile(signature="*bf16:16,*i32:16", R=4096, num_warps=1, target="sm_80")
    assert compiled.stages["thread_ir"].count(" shuffle ") <= 2 * 5
    x = np.zeros(4096, np.float32)
    x[[300, 7, 4000]] = 5.0         # a tie across registers and lanes: the smallest index wins
    x[[9, 4001]] = np.nan           # NaNs lose to numbers
    for target in ("sm_80", "gfx942"):
        _, out = simulated_like_interpreted(argmax_down, [x, np.zeros(1, np.int32)], target, num_warps=1, R=4096)
        assert out[0] == 7


@tessera.kernel
def scalar_widened(x_ptr, out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs)
    w = tessera.broadcast_to(tessera.expand_dims(tessera.sum(x), 0), (8, BLOCK // 8))
    tessera.store(out_ptr + tessera.arange(0, 8)[:, None] * (BLOCK // 8) + tessera.arange(0, BLOCK // 8)[None, :], w)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "gfx942"])
def test_mutant_3_176_a_tile_widened_from_a_scalar_compiles(target):
    """Was an AttributeError in the lowering: expand_dims of a scalar (a full reduction) read the scalar's type
    as a tile's shape; the scalar is now splat into the result's layout."""
    assert scalar_widened.compile(signature="*f32:16,*f32:16", BLOCK=64, target=target).stages["llvm_ir"]
    x = np.arange(64, dtype=np.float32)
    _, out = simulated_like_interpreted(scalar_widened, [x, np.zeros(64, np.float32)], target, BLOCK=64)
    np.testing.assert_array_equal(out, np.full(64, x.sum(), np.float32))


@tessera.kernel
def block_with_a_stray_keyword(x_ptr, out_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    x = tessera.view(x_ptr, (M, N)).block((BM, BN), (0, 0), mask=True).load()
    tessera.view(out_ptr, (M, N)).block((BM, BN), (0, 0)).store(x)


@tessera.kernel
def method_with_a_stray_keyword(x_ptr, out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    tessera.store(out_ptr, tessera.load(x_ptr + offs).sum(axis=0, reverse=True))


def test_mutant_3_8648_a_stray_keyword_to_a_method_names_the_method_and_its_parameters():
    """Was "internal compiler error ... view_block() got an unexpected keyword argument": methods were
    lambdas that bound any arguments, so the check of the argument list never saw them."""
    with pytest.raises(tessera.CompileError, match=r"bad arguments for \.block\(shape, index, offsets\): got an "
                                                   r"unexpected keyword argument 'mask'") as info:
        block_with_a_stray_keyword.compile(signature="*f32:16,*f32:16,i32,i32", BM=16, BN=16)
    assert "internal compiler error" not in str(info.value) and ".block((BM, BN), (0, 0), mask=True)" in str(info.value)
    with pytest.raises(tessera.CompileError, match=r"bad arguments for \.sum\(.*\): got an unexpected keyword "
                                                   r"argument 'reverse'"):
        method_with_a_stray_keyword.compile(signature="*f32:16,*f32:16", BLOCK=64)


@tessera.kernel
def shared_buffer_as_offsets(x_ptr, out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    buf = tessera.shared((BLOCK,), tessera.f32)
    buf.store(tessera.load(x_ptr + offs))
    tessera.store(out_ptr + buf, offs)


@tessera.kernel
def shared_buffer_negated(x_ptr, out_ptr, BLOCK: tessera.constexpr):
    buf = tessera.shared((BLOCK,), tessera.f32)
    tessera.store(out_ptr + tessera.arange(0, BLOCK), -buf)


@pytest.mark.parametrize("kernel", [shared_buffer_as_offsets, shared_buffer_negated])
def test_mutant_3_5043_arithmetic_on_a_shared_buffer_says_to_load_it_first(kernel):
    """Was "internal compiler error ... 'NoneType' object has no attribute 'is_int'" (a buffer has no dtype of
    a tile)."""
    with pytest.raises(tessera.TypeMismatchError, match=r"smem<64xf32>.*a shared buffer has no elementwise "
                                                        r"operators .* read it first: buf.load\(\)"):
        kernel.compile(signature="*f32:16,*f32:16", BLOCK=64)
