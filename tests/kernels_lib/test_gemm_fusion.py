"""User functions fused into tessera::gemm (kernels_lib/gemm_fusion.py): epilogues over the float32 accumulator
with row, column, matrix and scalar operands and a second output, prologues on the operand blocks, gathered rows;
on the CPU interpreter against torch, their mistakes as CompileErrors at the user's lines, and the fused kernels
as GPU code without spills."""

import inspect

import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera.kernels_lib import gemm  # noqa: E402

import fusion_hooks as hooks  # noqa: E402


def operands(M, N, K, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, K, generator=g).to(dtype), torch.randn(K, N, generator=g).to(dtype)


def close(out, expected, tol=2e-3):
    torch.testing.assert_close(out.float(), expected.float(), rtol=tol, atol=tol)


def test_bias_gelu_residual_epilogue_matches_torch():
    a, b = operands(37, 20, 24)
    bias, residual = torch.randn(20), torch.randn(37, 20)
    out = gemm(a, b, epilogue=hooks.bias_gelu_residual, epilogue_args=(bias, residual), out_dtype=torch.float32)
    x = a.float() @ b.float() + bias
    close(out, torch.nn.functional.gelu(x) + residual)


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True)])
def test_row_column_and_scalar_operands_broadcast_like_numpy(trans_a, trans_b):
    a, b = operands(19, 33, 16, torch.bfloat16, seed=1)
    a_in, b_in = (a.t().contiguous() if trans_a else a), (b.t().contiguous() if trans_b else b)
    row_scale, column_scale = torch.rand(19, 1), torch.rand(1, 33).to(torch.bfloat16)
    out = gemm(a_in, b_in, trans_a=trans_a, trans_b=trans_b, epilogue=hooks.scaled_rows_plus_scalar,
               epilogue_args=(row_scale, -0.75, column_scale))
    assert out.dtype == torch.bfloat16
    close(out, (a.float() @ b.float()) * row_scale * column_scale.float() - 0.75, tol=3e-2)


def test_a_second_output_stores_the_pre_activation():
    a, b = operands(17, 18, 32, seed=2)
    bias, pre = torch.randn(18), torch.empty(17, 18)
    out = gemm(a, b, epilogue=hooks.relu_and_pre, epilogue_args=(bias,), epilogue_outputs=(pre,))
    expected_pre = a.float() @ b.float() + bias
    close(pre, expected_pre)
    close(out, torch.relu(expected_pre), tol=1e-2)


def test_dropout_epilogue_uses_the_global_indices_of_its_tile():
    a, b = operands(40, 24, 16, seed=3)
    out = gemm(a, b, epilogue=hooks.dropout, epilogue_args=(1234, 0.25, 24), out_dtype=torch.float32)
    full = a.float() @ b.float()
    dropped = out == 0
    assert 0.1 < dropped.float().mean() < 0.4
    close(out[~dropped], (full / 0.75)[~dropped])
    again = gemm(a, b, epilogue=hooks.dropout, epilogue_args=(1234, 0.25, 24), out_dtype=torch.float32)
    assert torch.equal(out, again)      # the same seed drops the same elements: it depends on (row, col) only


def test_prologue_dequantizes_int8_weights_before_the_tensor_cores():
    a = torch.randn(21, 48).half()
    codes = torch.randint(-127, 128, (48, 26), dtype=torch.int8)
    scale = torch.rand(26) / 64
    out = gemm(a, codes, prologue_b=hooks.dequantize_int8, prologue_b_args=(scale,), out_dtype=torch.float32)
    close(out, a.float() @ (codes.float() * scale).half().float(), tol=1e-2)


def test_prologue_on_a_and_gathered_rows():
    a, b = operands(30, 20, 40, seed=4)
    idx = torch.tensor([5, 0, 29, 7, 7, 13, 2, 21, 1, 9, 0, 3, 28, 4, 11, 6, 8, 19, 25], dtype=torch.int32)
    scale = torch.rand(19, 1)
    out = gemm(a, b, gather_a=idx, prologue_a=hooks.scale_a_rows, prologue_a_args=(scale,),
               out_dtype=torch.float32)
    close(out, (a.float()[idx.long()] * scale).half().float() @ b.float(), tol=1e-2)


# ---------------------------------------------------------------------------
# Mistakes: CompileErrors at the user's lines


def test_an_operand_too_many_is_an_error_at_the_functions_def():
    a, b = operands(8, 8, 8)
    with pytest.raises(tessera.CompileError) as info:
        gemm(a, b, epilogue=hooks.one_too_many, epilogue_args=(torch.randn(8),))
    err = info.value
    assert err.file == inspect.getsourcefile(hooks) and err.line == inspect.getsourcelines(hooks.one_too_many.fn)[1] + 1
    assert "takes 2 operand parameter(s)" in err.message and "1 operand(s) were passed" in err.message


def test_an_operand_that_does_not_broadcast_is_an_error_at_the_call():
    a, b = operands(8, 16, 8)
    with pytest.raises(tessera.CompileError) as info:
        gemm(a, b, epilogue=hooks.relu_and_pre, epilogue_args=(torch.randn(8),))   # (M,) is not (N,)
    line = inspect.currentframe().f_lineno - 1
    assert info.value.file == __file__ and info.value.line == line
    assert "shape (8,)" in info.value.message and "(16,)" in info.value.message


def test_a_shape_error_inside_the_epilogue_is_reported_at_its_line():
    a, b = operands(16, 16, 16)
    with pytest.raises(tessera.CompileError) as info:
        gemm(a, b, epilogue=hooks.wrong_shape_inside, epilogue_args=(torch.randn(16),))
    lines, first = inspect.getsourcelines(hooks.wrong_shape_inside.fn)
    assert info.value.file == inspect.getsourcefile(hooks) and info.value.line == first + 2


def test_a_wrongly_shaped_result_is_blamed_on_the_epilogue():
    a, b = operands(16, 16, 16)
    with pytest.raises(tessera.CompileError) as info:
        gemm(a, b, epilogue=hooks.returns_a_row)
    assert info.value.file == inspect.getsourcefile(hooks)
    assert "epilogue 'returns_a_row'" in info.value.message


def test_plain_python_functions_and_fixed_epilogue_arguments_are_refused():
    a, b = operands(8, 8, 8)
    with pytest.raises(tessera.CompileError, match="must be a @tessera.func"):
        gemm(a, b, epilogue=lambda acc: acc)
    with pytest.raises(ValueError, match="apply it in the epilogue"):
        gemm(a, b, torch.randn(8), epilogue=hooks.relu_and_pre, epilogue_args=(torch.randn(8),))
    with pytest.raises(TypeError, match="fusion hooks are"):
        gemm(a, b, epilog=hooks.relu_and_pre)


# ---------------------------------------------------------------------------
# GPU code

def fused_signature(dtype, a_dtype=None, b_dtype=None):
    """gemm_fused_kernel's runtime parameters: a, b, c, M, N, K, 6 strides, 6 operand slots and their strides,
    4 scalars, 2 outputs and their strides, the gather index."""
    a_dtype, b_dtype = a_dtype or dtype, b_dtype or dtype
    params = [f"*{a_dtype}:16", f"*{b_dtype}:16", f"*{dtype}:16"] + ["i32:16"] * 3 + ["i32:16", "i32:1"] * 3
    params += ["*f32:16"] * 6 + ["i32:16", "i32:1"] * 6 + ["f32", "f32", "i32", "i32"]
    params += [f"*{dtype}:16"] * 2 + ["i32:16", "i32:1"] * 2 + ["*i32:16"]
    return ",".join(params)


EPILOGUE = dict(EPILOGUE=hooks.bias_gelu_residual, EP_ORDER=(0, 1), PROLOGUE_A=None, PA_ORDER=(), PROLOGUE_B=None,
                PB_ORDER=(), SPECS=(("epilogue", False, True), ("epilogue", True, True), None, None, None, None),
                N_OUT=0, GATHER_A=False)
DEQUANT_AND_DROPOUT = dict(EPILOGUE=hooks.dropout, EP_ORDER=(6, 7, 8, 10, 11), PROLOGUE_A=None, PA_ORDER=(),
                           PROLOGUE_B=hooks.dequantize_int8, PB_ORDER=(0,),
                           SPECS=(("prologue_b", False, True), None, None, None, None, None), N_OUT=0, GATHER_A=False)


def compile_fused(target, config, constexprs, signature):
    """Strict on NVIDIA (the K loop gets its async copies); AMD has none yet, so its pipeline is a plain loop."""
    from tessera.kernels_lib.gemm_fused import gemm_fused_kernel
    return gemm_fused_kernel.kernel.compile(signature=signature, target=target, num_warps=config.num_warps,
                                            strict=not target.startswith("gfx"), **constexprs, **config.kwargs)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_fused_epilogue_compiles_on_tensor_cores_without_spills(target):
    from tessera.backends.nvptx import find_ptxas
    from tessera.kernels_lib.gemm import CONFIGS
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    compiled = compile_fused(target, CONFIGS[0], EPILOGUE, fused_signature("bf16"))
    assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0
    ptx = compiled.stages["ptx"]
    assert ("wgmma.mma_async" in ptx) if target == "sm_90a" else ("mma.sync.aligned.m16n8k16" in ptx)


def test_dequantizing_prologue_and_dropout_compile_for_sm_80_without_spills():
    from tessera.backends.nvptx import find_ptxas
    from tessera.kernels_lib.gemm import CONFIGS
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    compiled = compile_fused("sm_80", CONFIGS[3], DEQUANT_AND_DROPOUT,
                             fused_signature("f16", b_dtype="i8").replace("f32,f32,i32,i32", "i32,f32,i32,i32"))
    assert compiled.metadata["spill_stores"] == 0 and "mma.sync" in compiled.stages["ptx"]


def test_fused_epilogue_compiles_for_gfx942_on_mfma():
    from tessera.kernels_lib.gemm import CONFIGS
    compiled = compile_fused("gfx942", CONFIGS[3], EPILOGUE, fused_signature("bf16"))     # pipelined: no warning
    assert "v_mfma" in compiled.stages["amdgcn"] and compiled.metadata["vgpr_spill_count"] == 0
    assert "global_load_lds_dword" in compiled.stages["amdgcn"]
