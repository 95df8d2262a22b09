"""tessera::gemm with fp8 inputs and dequantization scales, on the CPU interpreter, against torch in float32."""

import itertools

import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
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


def compile_fp8(config, b_strides: str, target: str, strict: bool = True):
    """The e4m3 GEMM of `config`: strict when B is K-contiguous (unless `strict` is False); on NVIDIA a B
    contiguous along N cannot be pipelined (8-bit operands are read from shared memory K-contiguous only), which
    the compile says in a PipelineWarning."""
    from tessera.kernels_lib.gemm import gemm_kernel

    def compile_it(strict):
        return gemm_kernel.kernel.compile(
            signature=FP8_SIGNATURE.format(b=b_strides), target=target, num_warps=config.num_warps, strict=strict,
            HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none", **config.kwargs)
    if b_strides == "i32:1,i32:16":
        return compile_it(strict)
    with pytest.warns(tessera.PipelineWarning, match="not every block load is pipelined: .* the dot cannot read "
                                                     "f8e4m3 from shared memory"):
        return compile_it(False)


@pytest.mark.parametrize("b_strides", ["i32:16,i32:1", "i32:1,i32:16"], ids=["b-row-major", "b-transposed"])
def test_every_shipped_config_runs_fp8_mma_sync_on_sm89_without_spills(b_strides):
    """On sm_89 (fp8 mma.sync, no wgmma) an e4m3 GEMM multiplies on m16n8k32 .e4m3 tensor cores, not FMA."""
    from tessera.backends.nvptx import find_ptxas
    from tessera.kernels_lib.gemm import CONFIGS
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    for config in CONFIGS:
        compiled = compile_fp8(config, b_strides, "sm_89")
        bm, bn, bk = (config.kwargs[key] for key in ("BM", "BN", "BK"))
        fragments = (bm // 16) * (bn // 8) * (bk // 32) // config.num_warps     # per warp, per K step
        assert compiled.stages["ptx"].count("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32") == fragments
        assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0, f"{config} spills"


@pytest.mark.parametrize("b_strides", ["i32:16,i32:1", "i32:1,i32:16"], ids=["b-row-major", "b-transposed"])
def test_every_shipped_config_runs_fp8_on_wgmma_on_sm90a_without_spills(b_strides):
    """On sm_90a an e4m3 GEMM's main loop runs on wgmma m64nNk32 (N = BN: one instruction spans the block's
    columns), BK / 32 per warpgroup slab and K step, A pipelined through TMA-filled rings (and B too when it
    is K-contiguous, the torch._scaled_mm layout); no mma.sync is left."""
    from tessera.backends.nvptx import find_ptxas
    from tessera.kernels_lib.gemm import CONFIGS
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    for config in CONFIGS:
        compiled = compile_fp8(config, b_strides, "sm_90a")
        bm, bn, bk = (config.kwargs[key] for key in ("BM", "BN", "BK"))
        ptx = compiled.stages["ptx"]
        slabs = bm // 64 // max(1, config.num_warps // 4)             # 64-row slabs per warpgroup
        assert ptx.count(f"wgmma.mma_async.sync.aligned.m64n{bn}k32.f32.e4m3.e4m3") == slabs * (bk // 32), config
        assert "mma.sync" not in ptx
        tma_filled = [m["pointer"] for m in compiled.metadata["tensor_maps"]]
        # the loads' maps, then C's: the epilogue's TMA store (`passes/schedule/tma_store.py`)
        assert tma_filled == (["a_ptr", "b_ptr"] if b_strides == "i32:1,i32:16" else ["a_ptr"]) + ["c_ptr"], config
        assert "st.global" not in ptx and "cp.async.bulk.tensor.2d.global.shared::cta" in ptx
        assert "cp.async.bulk.tensor" in ptx
        assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0, f"{config} spills"


def test_every_gfx950_config_runs_fp8_on_mfma_pipelined_without_spills():
    """On gfx950 (OCP fp8 MFMA) an e4m3 GEMM with torch._scaled_mm's K-contiguous B runs every config the autotuner
    keeps there (`gemm_configs.BY_AMD_TARGET`) on v_mfma_f32_32x32x64_f8f6f4 (BK = 32: v_mfma_f32_32x32x16_fp8_fp8),
    (BM / 32) (BN / 32) (BK / k) per K step over the waves, its K loop pipelined through direct-to-LDS rings as
    deep as the config asks (strict: no PipelineWarning; fp8's rings take half of the bf16 bytes the configs
    were fitted to), no register spilled, and links into a code object. gfx942 keeps the exact FMA loop (its
    fp8 MFMA reads fnuz fp8) and says why."""
    import re

    from amd_spills import amd_spills
    from tessera.backends.amdgpu.elf import CodeObject
    from tessera.backends.amdgpu.linker import find_linker
    from tessera.kernels_lib import gemm_configs
    for config in gemm_configs.BY_AMD_TARGET["gfx950"]:
        compiled = compile_fp8(config, "i32:1,i32:16", "gfx950")
        bm, bn, bk = (config.kwargs[key] for key in ("BM", "BN", "BK"))
        asm = compiled.stages["amdgcn"]
        k, mfma = (64, "v_mfma_f32_32x32x64_f8f6f4") if bk % 64 == 0 else (16, "v_mfma_f32_32x32x16_fp8_fp8")
        assert re.findall(r"\bv_mfma_\w+", asm) == [mfma] * ((bm // 32) * (bn // 32) * (bk // k) // config.num_warps), \
            config
        assert "global_load_lds_dword" in asm          # (x4: 16 bytes a lane where the block gives every lane 16)
        assert amd_spills(compiled.metadata) == {}, f"{config} spills"
        assert compiled.metadata["shared_bytes"] <= tessera.get_target("gfx950").shared_memory_bytes
        if find_linker() is not None:
            assert f"{compiled.name}.kd" in CodeObject(compiled.binary).symbols
    with pytest.warns(tessera.PipelineWarning, match="gfx942 has no MFMA for the OCP e4m3/e5m2 of Tessera's fp8: "
                                                     "gfx942's fp8 MFMA reads the fnuz formats"):
        compiled = compile_fp8(gemm_configs.BY_AMD_TARGET["gfx942"][3], "i32:1,i32:16", "gfx942", strict=False)
    assert "v_mfma" not in compiled.stages["amdgcn"]


@pytest.mark.gpu
@pytest.mark.amdgpu
def test_on_a_gfx950_gpu_the_fp8_gemm_matches_the_reference():
    """On an MI350 / MI355: both layouts of B (K-contiguous, as torch._scaled_mm takes it: the f8f6f4 MFMA from
    its rings; N-contiguous), e4m3 and e5m2, per-row scales, M and N no multiple of the blocks."""
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None) is None:
        pytest.skip("needs a ROCm build of torch with an AMD GPU")
    from tessera.kernels_lib.targets import device_arch
    if device_arch() != "gfx950":
        pytest.skip(f"needs gfx950 (MI350 / MI355), this GPU is {device_arch()}")
    for dtype_a, dtype_b, trans_b in ((E4M3, E4M3, True), (E4M3, E4M3, False), (E5M2, E5M2, True)):
        a, b = fp8_operands(300, 200, 512, dtype_a, dtype_b, trans_b=trans_b, seed=6)
        scale_a, scale_b = scales(300, 200, per_row=True)
        out = gemm(a.cuda(), b.cuda(), scale_a=scale_a.cuda(), scale_b=scale_b.cuda(), trans_b=trans_b)
        check(out.cpu(), reference(a, b, scale_a, scale_b, trans_b=trans_b))


def test_fp8_library_gemm_on_wgmma_matches_numpy_on_the_simt_simulator():
    """The library kernel itself, lowered for sm_90a (wgmma, both operands from the rings: B given transposed
    like torch._scaled_mm's column-major B), a per-tensor scale_a (one scalar load) and a per-column scale_b, odd
    M and N, on the SIMT simulator."""
    import numpy as np

    import tessera
    from tessera.backends.simt import run_threads
    from tessera.ir import dtypes as dt
    from tessera.kernels_lib.gemm import gemm_kernel
    from tessera.passes.thread_passes import lower

    M, N, K, BM, BN, BK = 70, 45, 160, 64, 64, 32
    rng = np.random.default_rng(5)
    a = dt.f8e4m3.encode(rng.standard_normal((M, K)))
    bt = dt.f8e4m3.encode(rng.standard_normal((N, K)))         # B^T: K-contiguous
    scale_a, scale_b = (rng.random(n).astype(np.float32) + 0.5 for n in (1, N))     # (scale_a: its one element)
    c = np.zeros((M, N), np.float32)
    args = [a, bt, c, scale_a, scale_b, c, M, N, K, 0.5, K, 1, 1, K]
    traced = [tessera.reinterpret(x, dt.f8e4m3) if i < 2 else x for i, x in enumerate(args)]
    module = gemm_kernel.kernel.specialize(
        *traced, HAS_BIAS=False, SCALE_A="tensor", SCALE_B="vector", ACTIVATION="none", BM=BM, BN=BN, BK=BK,
        GROUP_M=2, PERSISTENT=False, STAGES=3).module
    fn = lower(module, "sm_90a", 4).functions[0]
    assert [op for op in fn.walk() if op.name == "wgmma"] and not [op for op in fn.walk() if op.name == "mma"]
    assert not [op for op in fn.walk() if op.name == "store" and op.operands[1].type.element.dtype == dt.f8e4m3]
    run_threads(fn, args, (-(-M // BM) * -(-N // BN),))         # (no fp8 tile goes through registers)
    x = np.asarray(dt.f8e4m3.decode(a), np.float64) @ np.asarray(dt.f8e4m3.decode(bt), np.float64).T
    expected = 0.5 * x * scale_a[0] * scale_b[None, :]
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-4)


def test_a_scale_mode_other_than_none_tensor_or_vector_names_the_modes():
    """SCALE_A / SCALE_B are modes (`gemm_epilogue.SCALE_MODES`): the old boolean flags fail at trace time, naming
    the kernel, the epilogue's line and the modes, rather than silently dropping the scale."""
    import numpy as np

    import tessera
    from tessera.ir import dtypes as dt
    from tessera.kernels_lib.gemm import gemm_kernel

    a = tessera.reinterpret(dt.f8e4m3.encode(np.zeros((32, 32))), dt.f8e4m3)
    c, scale = np.zeros((32, 32), np.float32), np.ones(32, np.float32)
    with pytest.raises(tessera.StaticAssertionError, match=r"(?s)gemm_kernel.*gemm_epilogue.py.*'none', 'tensor'"):
        gemm_kernel.kernel.specialize(a, a, c, scale, scale, c, 32, 32, 32, 1.0, 32, 1, 32, 1, HAS_BIAS=False,
                                      SCALE_A=True, SCALE_B="none", ACTIVATION="none", BM=32, BN=32, BK=32,
                                      GROUP_M=1, PERSISTENT=False, STAGES=1)
