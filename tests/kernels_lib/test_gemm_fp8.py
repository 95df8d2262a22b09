"""tessera::gemm with fp8 inputs and dequantization scales, on the CPU interpreter, against torch in float32."""

import itertools

import pytest

torch = pytest.importorskip("torch")

from tessera.kernels_lib import gemm  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def fp8_operands(M, N, K, dtype_a, dtype_b, trans_a=False, trans_b=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn((K, M) if trans_a else (M, K), generator=g).to(dtype_a)
    b = torch.randn((N, K) if trans_b else (K, N), generator=g).to(dtype_b)
    return a, b


def scales(M, N, per_row, seed=1):
    g = torch.Generator().manual_seed(seed)
    if per_row:
        return torch.rand(M, generator=g) + 0.5, torch.rand(N, generator=g) + 0.5
    return torch.tensor(0.75), torch.tensor(1.5)


def reference(a, b, scale_a=None, scale_b=None, bias=None, activation=None, out_dtype=torch.bfloat16,
              trans_a=False, trans_b=False, alpha=1.0):
    a, b = a.float(), b.float()
    x = (a.t() if trans_a else a) @ (b.t() if trans_b else b)     # exact: fp8 products fit in f32
    if scale_a is not None:
        x = x * (scale_a[:, None] if scale_a.dim() else scale_a)
    if scale_b is not None:
        x = x * (scale_b[None, :] if scale_b.dim() else scale_b)
    x = alpha * x
    if bias is not None:
        x = x + bias.float()
    act = {None: lambda t: t, "relu": torch.relu, "silu": torch.nn.functional.silu,
           "gelu": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[activation]
    return act(x).to(out_dtype)


def check(out, expected):
    assert out.dtype == expected.dtype and out.shape == expected.shape
    tol = {torch.bfloat16: 3e-2, torch.float16: 1e-2, torch.float32: 1e-4}[out.dtype]
    torch.testing.assert_close(out.float(), expected.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype_a,dtype_b", [(E4M3, E4M3), (E5M2, E5M2), (E4M3, E5M2)], ids=str)
@pytest.mark.parametrize("per_row", [False, True], ids=["per_tensor", "per_row"])
def test_fp8_scaled(dtype_a, dtype_b, per_row):
    a, b = fp8_operands(5, 7, 19, dtype_a, dtype_b)
    scale_a, scale_b = scales(5, 7, per_row)
    out = gemm(a, b, scale_a=scale_a, scale_b=scale_b)
    assert out.dtype == torch.bfloat16                     # the fp8 default
    check(out, reference(a, b, scale_a, scale_b))


@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([False, True], repeat=2)))
def test_fp8_transposes_and_epilogue(trans_a, trans_b):
    a, b = fp8_operands(6, 5, 18, E4M3, E4M3, trans_a, trans_b, seed=2)
    scale_a, scale_b = torch.rand(6) + 0.5, torch.tensor(0.5)
    bias = torch.randn(5)
    out = gemm(a, b, bias, scale_a, scale_b, activation="gelu", out_dtype=torch.float32,
               trans_a=trans_a, trans_b=trans_b, alpha=-0.5)
    check(out, reference(a, b, scale_a, scale_b, bias, "gelu", torch.float32, trans_a, trans_b, -0.5))


def test_fp8_without_scales_and_one_scale():
    a, b = fp8_operands(4, 3, 8, E5M2, E5M2, seed=3)
    check(gemm(a, b), reference(a, b))
    scale_b = torch.rand(3) + 0.5
    check(gemm(a, b, scale_b=scale_b, out_dtype=torch.float16),
          reference(a, b, scale_b=scale_b, out_dtype=torch.float16))


@pytest.mark.parametrize("call,message", [
    (lambda: gemm(*fp8_operands(4, 3, 5, E4M3, E4M3), scale_a=torch.ones(3)), r"scale_a must have shape \(\) .*\(4,\)"),
    (lambda: gemm(*fp8_operands(4, 3, 5, E4M3, E4M3), scale_b=torch.ones(4)), r"scale_b must have shape \(\) .*\(3,\)"),
    (lambda: gemm(*fp8_operands(4, 3, 5, E4M3, E4M3), scale_a=torch.ones(4, 1)), "scale_a must have shape"),
    (lambda: gemm(*fp8_operands(4, 3, 5, E4M3, E4M3), scale_a=torch.ones(4).half()), "scale_a must be float32"),
    (lambda: gemm(torch.randn(4, 5), torch.randn(5, 3), scale_a=torch.tensor(2.0)), "only for fp8"),
    (lambda: gemm(*fp8_operands(4, 3, 5, E4M3, E4M3), out_dtype=E4M3), "out_dtype"),
])
def test_fp8_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_fp8_fake_tensor():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        a, b = torch.empty(100, 64, dtype=E4M3), torch.empty(32, 64, dtype=E5M2)
        out = gemm(a, b, scale_a=torch.empty(100), scale_b=torch.empty(()), trans_b=True)
        assert out.shape == (100, 32) and out.dtype == torch.bfloat16


def test_fp8_opcheck():
    # test_schema is left out: it perturbs the inputs with `mul`, which torch does not implement for fp8 on CPU
    # ("mul_cpu_reduced_float" not implemented for 'Float8_e4m3fn'); the other checks run.
    a, b = fp8_operands(5, 7, 6, E4M3, E5M2, seed=4)
    torch.library.opcheck(torch.ops.tessera.gemm.default, (a, b, torch.randn(7), torch.rand(5) + 0.5, torch.tensor(2.0)),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.skip(reason="torch.library.opcheck's test_schema multiplies inputs, unsupported for fp8 on CPU")
def test_fp8_opcheck_schema():
    a, b = fp8_operands(5, 7, 6, E4M3, E4M3, seed=4)
    torch.library.opcheck(torch.ops.tessera.gemm.default, (a, b), test_utils=("test_schema",))


def test_fp8_inputs_requiring_grad_raise():
    a, b = fp8_operands(3, 3, 4, E4M3, E4M3)
    a.requires_grad_(True)
    with pytest.raises(RuntimeError, match="fp8 inputs have no gradients"):
        gemm(a, b)


FP8_SIGNATURE = "*f8e4m3:16,*f8e4m3:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,{b}"


@pytest.mark.parametrize("b_strides", ["i32:16,i32:1", "i32:1,i32:16"], ids=["b-row-major", "b-transposed"])
def test_every_shipped_config_runs_fp8_tensor_cores_on_hopper_without_spills(b_strides):
    """On sm_90a (which has fp8 mma.sync) an e4m3 GEMM multiplies on m16n8k32 .e4m3 tensor cores, not FMA."""
    from tessera.backends.nvptx import find_ptxas
    from tessera.kernels_lib.gemm import CONFIGS, gemm_kernel
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    for config in CONFIGS:
        compiled = gemm_kernel.kernel.compile(
            signature=FP8_SIGNATURE.format(b=b_strides), target="sm_90a", num_warps=config.num_warps,
            HAS_BIAS=False, HAS_SCALE_A=False, HAS_SCALE_B=False, ACTIVATION="none", **config.kwargs)
        bm, bn, bk = (config.kwargs[key] for key in ("BM", "BN", "BK"))
        fragments = (bm // 16) * (bn // 8) * (bk // 32) // config.num_warps     # per warp, per K step
        assert compiled.stages["ptx"].count("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32") == fragments
        assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0, f"{config} spills"
