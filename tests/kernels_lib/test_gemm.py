"""tessera::gemm (tessera/kernels_lib/gemm.py) on the CPU interpreter, against torch in float32."""

import itertools
import re
import warnings

import pytest

torch = pytest.importorskip("torch")

from tessera.kernels_lib import gemm  # noqa: E402
from tessera.kernels_lib import gemm_configs  # noqa: E402
from tessera.kernels_lib.gemm import CONFIGS, HOPPER_CONFIGS, gemm_kernel  # noqa: E402

from hopper_gemm import NO_EPILOGUE, lowered_gemm  # noqa: E402
from amd_spills import amd_spills  # noqa: E402
from amdgcn_phases import loop_bodies, opcode_counts  # noqa: E402
from tma_maps import maps_by_use  # noqa: E402

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 3e-2, torch.float32: 1e-4}
ACTIVATIONS = {
    None: lambda x: x,
    "relu": torch.relu,
    "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu,
}


def reference(a, b, bias=None, activation=None, out_dtype=None, trans_a=False, trans_b=False, alpha=1.0):
    out_dtype = out_dtype or a.dtype
    a, b = a.float(), b.float()
    x = alpha * ((a.t() if trans_a else a) @ (b.t() if trans_b else b))
    if bias is not None:
        x = x + bias.float()
    return ACTIVATIONS[activation](x).to(out_dtype)


def operands(M, N, K, dtype, trans_a=False, trans_b=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn((K, M) if trans_a else (M, K), generator=g).to(dtype)
    b = torch.randn((N, K) if trans_b else (K, N), generator=g).to(dtype)
    return a, b


def check(out, expected):
    assert out.dtype == expected.dtype and out.shape == expected.shape
    tol = TOLERANCE[out.dtype]
    torch.testing.assert_close(out.float(), expected.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (17, 33, 64), (64, 17, 33), (33, 64, 17)])
def test_matches_torch(M, N, K, trans_a, trans_b, dtype):
    a, b = operands(M, N, K, dtype, trans_a, trans_b)
    out = gemm(a, b, trans_a=trans_a, trans_b=trans_b)
    check(out, reference(a, b, trans_a=trans_a, trans_b=trans_b, out_dtype=dtype))


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("bias_dtype", [None, torch.float32, torch.float16])
def test_epilogue(activation, bias_dtype):
    a, b = operands(17, 33, 20, torch.float16, seed=1)
    bias = None if bias_dtype is None else torch.randn(33).to(bias_dtype)
    out = gemm(a, b, bias=bias, activation=activation, alpha=0.25)
    check(out, reference(a, b, bias, activation, alpha=0.25, out_dtype=torch.float16))


@pytest.mark.parametrize("in_dtype,out_dtype", [(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
                                                (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float16)])
def test_out_dtype(in_dtype, out_dtype):
    a, b = operands(9, 18, 27, in_dtype, trans_b=True, seed=2)
    bias = torch.randn(18)
    out = gemm(a, b, bias=bias, out_dtype=out_dtype, trans_b=True, activation="gelu", alpha=-1.5)
    check(out, reference(a, b, bias, "gelu", out_dtype, trans_b=True, alpha=-1.5))


def test_strided_views_are_not_copied_and_other_layouts_work():
    a, b = operands(12, 10, 8, torch.float32, seed=3)
    a_col_major = a.t().contiguous().t()       # the same matrix, stored column-major
    b_every_other = torch.randn(8, 20)[:, ::2]  # neither row- nor column-major: copied
    check(gemm(a_col_major, b_every_other), reference(a, b_every_other))


def test_empty_and_zero_k():
    assert gemm(torch.randn(0, 4), torch.randn(4, 3)).shape == (0, 3)
    bias = torch.randn(3)
    check(gemm(torch.randn(5, 0), torch.randn(0, 3), bias=bias, activation="relu"),
          torch.relu(bias).expand(5, 3).contiguous())


def test_opcheck():
    a, b = operands(5, 7, 6, torch.float16, seed=4)
    op = torch.ops.tessera.gemm.default
    torch.library.opcheck(op, (a, b))
    torch.library.opcheck(op, (a.t().contiguous(), b, torch.randn(7)),
                          {"activation": "silu", "trans_a": True, "alpha": 2.0, "out_dtype": torch.float32})


def test_fake_tensor_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        a, b = torch.empty(1000, 300, dtype=torch.bfloat16), torch.empty(200, 300, dtype=torch.bfloat16)
        out = gemm(a, b, bias=torch.empty(200), trans_b=True, out_dtype=torch.float32)
        assert out.shape == (1000, 200) and out.dtype == torch.float32
        with pytest.raises(ValueError, match="shape mismatch"):
            gemm(a, b)


def test_torch_compile_traces_the_op():
    def f(a, b, bias):
        return gemm(a, b, bias=bias, activation="relu").float() * 2

    a, b = operands(6, 5, 4, torch.float16, seed=5)
    bias = torch.randn(5)
    out = torch.compile(f, fullgraph=True, backend="eager")(a, b, bias)
    torch.testing.assert_close(out, reference(a, b, bias, "relu", torch.float16).float() * 2, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("call,message", [
    (lambda: gemm(torch.randn(4, 5), torch.randn(6, 3)), r"op\(a\) is 4x5 \(a \(4, 5\).*op\(b\) is 6x3 \(b \(6, 3\)"),
    (lambda: gemm(torch.randn(4, 5), torch.randn(3, 5)), "shape mismatch"),
    (lambda: gemm(torch.randn(4, 5), torch.randn(5)), "2-D"),
    (lambda: gemm(torch.randn(4, 5).double(), torch.randn(5, 3).double()), "float64"),
    (lambda: gemm(torch.randn(4, 5).half(), torch.randn(5, 3)), "same dtype"),
    (lambda: gemm(torch.randn(4, 5).half(), torch.randn(5, 3).to(torch.float8_e4m3fn)), "same dtype"),
    (lambda: gemm(torch.randn(4, 5), torch.randn(5, 3), bias=torch.randn(4)), r"bias must have shape \(3,\)"),
    (lambda: gemm(torch.randn(4, 5).half(), torch.randn(5, 3).half(), bias=torch.randn(3).bfloat16()), "bias"),
    (lambda: gemm(torch.randn(4, 5), torch.randn(5, 3), activation="tanh"), "activation"),
    (lambda: gemm(torch.randn(4, 5), torch.randn(5, 3), out_dtype=torch.int32), "out_dtype"),
])
def test_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_gpu_configs_are_tiles_of_64_and_128_and_hopper_adds_128_by_256_and_256_by_128_and_clusters():
    assert gemm_kernel.tuner.configs == gemm_configs.ALL         # the prune hook keeps a device's own
    shipped = CONFIGS + HOPPER_CONFIGS
    amd = [c for configs in gemm_configs.BY_AMD_TARGET.values() for c in configs]
    assert [c for c in gemm_configs.ALL if c in shipped] == shipped     # the common ones in order, then Hopper's,
    assert all(c in amd for c in gemm_configs.ALL if c not in shipped)  # between them AMD's shallower twins
    assert all(c.kwargs["BM"] in (64, 128) and c.kwargs["BN"] in (64, 128) and c.num_warps in (4, 8)
               for c in CONFIGS)
    plain = [c for c in HOPPER_CONFIGS if not gemm_configs.is_clustered(c)]
    clustered = [c for c in HOPPER_CONFIGS if gemm_configs.is_clustered(c)]     # test_gemm_cluster.py
    assert {(c.kwargs["BM"], c.kwargs["BN"], c.num_warps) for c in plain} == {(128, 256, 8), (256, 128, 8)}
    assert {(c.kwargs["BM"], c.kwargs["BN"], c.kwargs.get("CLUSTER_M", 1), c.kwargs.get("CLUSTER_N", 1))
            for c in clustered} == {(128, 256, 2, 1), (128, 128, 2, 1), (256, 128, 1, 2)}
    assert len(plain) + len(clustered) == len(HOPPER_CONFIGS)


def test_kernel_compiles_for_hopper():
    from tessera.backends.nvptx import find_ptxas
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    compiled = gemm_kernel.kernel.compile(
        signature="*f16:16,*f16:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,i32:1,i32:16",
        target="sm_90a", num_warps=4, HAS_BIAS=True, SCALE_A="none", SCALE_B="none", ACTIVATION="gelu",
        BM=64, BN=64, BK=64, GROUP_M=8, PERSISTENT=False, STAGES=3)
    assert compiled.cubin


def test_fp8_kernel_compiles_for_hopper():
    from tessera.backends.nvptx import find_ptxas
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    compiled = gemm_kernel.kernel.compile(
        signature="*f8e4m3:16,*f8e4m3:16,*f32:16,*f32:16,*f32:16,*bf16:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,i32:1,i32:16",
        target="sm_90a", num_warps=4, HAS_BIAS=True, SCALE_A="tensor", SCALE_B="vector", ACTIVATION="relu",
        BM=64, BN=64, BK=64, GROUP_M=8, PERSISTENT=False, STAGES=3)     # (scale_a: one scalar; scale_b: per column)
    assert compiled.cubin and compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0
    # the per-tensor scale_a: one 4-byte load at its parameter's address itself (no index arithmetic)
    ptx = compiled.stages["ptx"]
    address = re.search(r"ld\.param\.b64\s+(%rd\d+), \[gemm_kernel_param_3\]", ptx).group(1)
    assert re.search(rf"ld\.global(\.nc)?\.b32\s+%r\d+, \[{address}\]", ptx), "scale_a is not read as one scalar"


# stride_am, stride_ak, stride_bk, stride_bn: B row-major (K x N), or B^T stored (N x K), as trans_b passes it
GEMM_SIGNATURE = "*bf16:16,*bf16:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,{b}"
B_STRIDES = {"b-row-major": "i32:16,i32:1", "b-transposed": "i32:1,i32:16"}


@pytest.mark.parametrize("b_layout", list(B_STRIDES))
@pytest.mark.parametrize("target", ["sm_80", "sm_90", "sm_90a"])
def test_every_shipped_config_compiles_pipelined_without_spills(target, b_layout):
    """Each config's K loop becomes a pipeline of its STAGES, fits the target's shared memory and assembles
    with no register spills. sm_80: cp.async feeding mma.sync, STAGES - 1 ahead. sm_90: TMA loads from two
    by-value tensor-map parameters (A's and B's, read in place) feeding mma.sync. sm_90a: the same TMA fills
    (one box per 128-byte column block of a wgmma slot) feeding wgmma (B row-major: MN-major,
    imm-trans-b = 1), with one group left in flight across iterations and the fills still STAGES - 1 ahead
    (the refill follows wgmma.wait_group 1: test_gemm_hopper.py); ptxas does not serialize the wgmmas."""
    from tessera.backends.nvptx import find_ptxas
    from tessera.ir.target import get_target
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    for config in CONFIGS:
        compiled = gemm_kernel.kernel.compile(
            signature=GEMM_SIGNATURE.format(b=B_STRIDES[b_layout]), target=target, num_warps=config.num_warps,
            HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none", **config.kwargs)
        metadata, ptx = compiled.metadata, compiled.stages["ptx"]
        stages = config.kwargs["STAGES"]
        assert metadata["spill_stores"] == metadata["spill_loads"] == 0, f"{config} spills"
        assert metadata["shared_bytes"] <= get_target(target).shared_memory_bytes
        if target in ("sm_90", "sm_90a"):
            assert "cp.async.cg" not in ptx and "cp.async.wait_group" not in ptx and "cp.async.bulk.tensor.2d" in ptx
            # A's and B's maps, and C's: the epilogue stores C by TMA (`passes/schedule/tma_store.py`)
            assert len(re.findall(r"\.param \.align 64 \.b8 gemm_kernel_param_\d+\[128\]", ptx)) == 3
            assert "st.local" not in ptx and "__local_depot" not in ptx       # the maps are read in place
            assert maps_by_use(ptx, metadata["tensor_maps"]) == {"load": ["a_ptr", "b_ptr"], "store": ["c_ptr"]}
            # one store per 64-column block of the 128B-swizzled tile stmatrix wrote (`stmatrix_store.py`)
            assert ptx.count("cp.async.bulk.tensor.2d.global.shared::cta") == config.kwargs["BN"] // 64
            assert "st.global" not in ptx and "stmatrix.sync.aligned.m8n8.x4" in ptx
        # a persistent config also starts the next tile's first STAGES - 1 fills before its epilogue
        fills = stages + (stages - 1 if config.kwargs["PERSISTENT"] else 0)
        if target == "sm_90":
            assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster") == 2 * fills, config
            assert "wgmma" not in ptx and "mma.sync.aligned.m16n8k16" in ptx
        elif target == "sm_90a":
            # STAGES - 1 prologue fills and one per iteration; a slot row of BK (A, B^T) or BN (B) bf16 elements
            # is one box per 128-byte column block (one 64B box for BK = 32)
            k_boxes = max(1, config.kwargs["BK"] // 64)
            n_boxes = k_boxes if b_layout == "b-transposed" else config.kwargs["BN"] // 64
            assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster") == fills * (k_boxes + n_boxes), config
            assert "none" not in {m["swizzle"] for m in metadata["tensor_maps"][:2]}
            trans_b = int(b_layout == "b-row-major")
            mma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.bf16\.bf16 .*, p, 1, 1, 0, (\d);", ptx)
            assert len(mma) == config.kwargs["BK"] // 16 and {int(t) for _, t in mma} == {trans_b}, config
            assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx), f"{config}: no group in flight"
            # the one proxy fence orders C's st.shared before its TMA store, after the K loop
            assert "mma.sync" not in ptx and "ldmatrix" not in ptx and ptx.count("fence.proxy.async") == 1
            assert "serialized" not in metadata["log"], metadata["log"]
        else:
            assert "cp.async.cg.shared.global" in ptx and re.search(rf"cp\.async\.wait_group\s+{stages - 2};", ptx), \
                f"{config}: not pipelined {stages} deep"
            assert "wgmma" not in ptx and "mma.sync.aligned.m16n8k16" in ptx


def gemm_on_the_simulator(M, N, K, trans_a, trans_b, config, seed=0):
    """The library kernel lowered for sm_90a and run on the SIMT simulator: (its C, numpy's), float32. Its ring
    slots are filled by TMA (the simulator builds the two maps from the kernel's recipes and the arguments)."""
    import tessera
    from tessera.backends.simt import run_threads
    fn, args, expected, _ = lowered_gemm(M, N, K, config, trans_a, trans_b, seed, target="sm_90a")
    names = [op.name for op in fn.walk()]
    assert "wgmma" in names and "tma_load" in names and "async_copy" not in names
    tiles = tessera.cdiv(M, config.kwargs["BM"]) * tessera.cdiv(N, config.kwargs["BN"])
    grid = (1,) if config.kwargs["PERSISTENT"] else (tiles,)     # persistent: one program walks every tile
    run_threads(fn, args, grid)
    return args[5], expected


SIMULATED = {   # M, N, K (odd where no row stride needs 16-byte alignment), trans_a, trans_b, config
    "odd-M-K-one-warpgroup": (77, 48, 144, False, False, CONFIGS[3]),
    "transposed-A-odd-N-two-warpgroups": (128, 61, 96, True, False, CONFIGS[1]),
    "transposed-B-odd-M": (69, 64, 112, False, True, CONFIGS[2]),
    "transposed-A-and-B-odd-N-persistent": (128, 173, 112, True, True, CONFIGS[5]),
}


@pytest.mark.parametrize("name", list(SIMULATED))
def test_library_gemm_on_wgmma_matches_numpy_on_the_simt_simulator(name):
    """A shipped config (BK cut to 32 to keep the simulation short) on the simulator, which checks the
    whole asynchronous protocol (TMA boxes, mbarrier phases, barriers, async-proxy visibility, wgmma
    groups in flight) as it runs."""
    import numpy as np

    import tessera
    M, N, K, trans_a, trans_b, config = SIMULATED[name]
    small = tessera.Config(dict(config.kwargs, BK=32), num_warps=config.num_warps)
    out, expected = gemm_on_the_simulator(M, N, K, trans_a, trans_b, small)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)


GEMM_ARGS = ["a_ptr", "b_ptr", "bias_ptr", "scale_a_ptr", "scale_b_ptr", "c_ptr", "M", "N", "K", "alpha",
             "stride_am", "stride_ak", "stride_bk", "stride_bn"]


@pytest.mark.parametrize("b_layout", list(B_STRIDES))
def test_tensor_map_recipes_of_the_library_gemm_on_sm_90(b_layout):
    """The recipes a launcher builds the two hidden maps from: A (M x K, rows stride_am apart) in BM x BK boxes,
    B in BK x BN boxes, or B^T (N x K, stride_bn apart) in BN x BK boxes; the slot swizzle is 128B where a
    box row is 128 bytes, none for BN = 128 rows of B (the unswizzled slot the ldmatrix reads use)."""
    from tessera.backends.nvptx import find_ptxas
    from tessera.dsl.gpu_launch import launch_parameters
    from tessera.ir.parser import parse_module
    from tessera.ir.tensor_map import kernel_recipes
    from tessera.ir.types import TensorMapType

    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    config = CONFIGS[0]     # BM = BN = 128, BK = 64
    compiled = gemm_kernel.kernel.compile(
        signature=GEMM_SIGNATURE.format(b=B_STRIDES[b_layout]), target="sm_90", num_warps=config.num_warps,
        HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none", **config.kwargs)
    fn = parse_module(compiled.stages["thread_ir"]).functions[0]        # the printed recipes read back
    names = [a.name_hint for a in fn.args]
    assert names[:len(GEMM_ARGS)] == GEMM_ARGS and names[len(GEMM_ARGS):] == ["a_ptr_tma0", "b_ptr_tma1",
                                                                               "c_ptr_tma2"]
    a_map, b_map, c_map = compiled.metadata["tensor_maps"]
    assert [r.to_json(names) for r in kernel_recipes(fn.attrs)] == [a_map, b_map, c_map]
    assert a_map == {"param": 14, "name": "a_ptr_tma0", "pointer": "a_ptr", "dtype": "bf16", "shape": ["M", "K"],
                     "strides": ["stride_am", "1"], "box": [128, 64], "swizzle": "128B", "oob_fill": "zero"}
    if b_layout == "b-row-major":
        expected_b = dict(shape=["K", "N"], strides=["stride_bk", "1"], box=[64, 128], swizzle="none")
    else:
        expected_b = dict(shape=["N", "K"], strides=["stride_bn", "1"], box=[128, 64], swizzle="128B")
    assert b_map == {"param": 15, "name": "b_ptr_tma1", "pointer": "b_ptr", "dtype": "bf16", "oob_fill": "zero",
                     **expected_b}
    # C's, for the epilogue's TMA stores of the 128 x 128 block, one per 128B-swizzled column block of 64
    # (`passes/schedule/tma_store.py`)
    assert c_map == {"param": 16, "name": "c_ptr_tma2", "pointer": "c_ptr", "dtype": "bf16", "shape": ["M", "N"],
                     "strides": ["N", "1"], "box": [128, 64], "swizzle": "128B", "oob_fill": "zero"}
    # a launcher appends the maps to the kernel's own parameters and rebuilds the recipes from the metadata
    own_types = [a.type for a in fn.args[:len(GEMM_ARGS)]]
    types, launch_names, recipes = launch_parameters(own_types, GEMM_ARGS, compiled.metadata)
    assert types == [*own_types, *[TensorMapType()] * 3] and launch_names == names
    assert recipes == list(kernel_recipes(fn.attrs))


# gfx950 has the double-K form ("mfma.wide"): half the instructions of gfx942's for the same tile.
WIDEST_MFMA = {"gfx90a": "v_mfma_f32_32x32x8bf16_1k",      # (its assembler spelling)
               "gfx942": "v_mfma_f32_32x32x8_bf16",
               "gfx950": "v_mfma_f32_32x32x16_bf16"}


@pytest.mark.parametrize("target", ["gfx90a", "gfx942", "gfx950"])
def test_every_shipped_config_compiles_for_amd_matrix_cores_into_a_loadable_code_object(target):
    """The same configs on AMD: the dot runs on MFMA (its widest bf16 form: `WIDEST_MFMA`), the tiles fit the LDS,
    no vector registers spill, and the object links into an ET_DYN code object with the kernel's descriptor (when a
    linker is found).
    STAGES pipelines the K loop with direct-to-LDS rings on gfx942 / gfx950 (as many stages as the LDS holds);
    gfx90a has no asynchronous copies: its K loop is the plain one, and the compile says so.
    B row-major is MN-major in its LDS slots: gfx950 reads its fragments with LDS transpose reads
    (ds_read_b64_tr_b16, 4 k a read), gfx942 element by element (ds_read_u16, then packs)."""
    import tessera
    from tessera.backends.amdgpu.elf import CodeObject
    from tessera.backends.amdgpu.linker import find_linker
    from tessera.ir.target import get_target
    for config in CONFIGS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled = gemm_kernel.kernel.compile(
                signature=GEMM_SIGNATURE.format(b=B_STRIDES["b-row-major"]), target=target,
                num_warps=config.num_warps, strict=False, HAS_BIAS=False, SCALE_A="none", SCALE_B="none",
                ACTIVATION="none", **config.kwargs)
        said = " ".join(str(w.message) for w in caught if issubclass(w.category, tessera.PipelineWarning))
        assert (f"runs as a plain loop on {target}" in said) == (target == "gfx90a"), said
        assert ("global_load_lds" in compiled.stages["amdgcn"]) == (target != "gfx90a")
        metadata = compiled.metadata
        mfma = set(re.findall(r"\bv_mfma_f32_\w+", compiled.stages["amdgcn"]))
        assert mfma == {WIDEST_MFMA[target]}, f"{config}: not on the widest matrix instruction, but on {mfma}"
        assert amd_spills(metadata) == {}, f"{config} spills registers"
        assert metadata["shared_bytes"] <= get_target(target).shared_memory_bytes
        if target != "gfx90a":
            k_loop = opcode_counts(max(loop_bodies(compiled.stages["amdgcn"]), key=len))
            assert (k_loop.get("ds_read_b64_tr_b16", 0) > 0) == (target == "gfx950"), f"{config}: {k_loop}"
            assert (k_loop.get("ds_read_u16", 0) > 0) == (target != "gfx950"), f"{config}: {k_loop}"
        if find_linker() is not None:
            code = CodeObject(compiled.binary)
            assert code.elf_type == "ET_DYN" and f"{compiled.name}.kd" in code.symbols


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_the_amd_configs_compile_with_every_stage_they_ask_for(target):
    """What an MI300 / MI355 tunes over (`gemm_configs.BY_AMD_TARGET`) compiles in strict mode: no ring is made
    shallower than its STAGES (a PipelineWarning, here an error), in bf16 with either layout of B. Fails for
    gfx942 if the stage cap (`gemm_configs.fitted`) is dropped: its 64 KiB of LDS holds 2 stages of the
    128 x 128 x 64 rings where the common config asks for 3."""
    for config in gemm_configs.BY_AMD_TARGET[target]:
        for b_strides in B_STRIDES.values():
            compiled = gemm_kernel.kernel.compile(
                signature=GEMM_SIGNATURE.format(b=b_strides), target=target, num_warps=config.num_warps,
                strict=True, HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none",
                **config.kwargs)
            assert "global_load_lds" in compiled.stages["amdgcn"], config


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_the_amd_configs_are_the_common_ones_as_deep_as_the_lds_holds(target):
    """Each AMD config is its common twin (and in the autotuner's list), its STAGES lowered where the target's LDS
    holds fewer of its rings: on gfx942 the 64-wide-K tiles of 128 rows or columns, to the deepest the planner
    keeps (one stage more is refused in strict mode, the planner counting `ring_bytes` a stage); gfx950's
    160 KiB holds every config as shipped."""
    import tessera
    lowered = []
    for twin, config in zip(CONFIGS, gemm_configs.BY_AMD_TARGET[target], strict=True):
        assert config in gemm_configs.ALL and config.num_warps == twin.num_warps
        assert {**config.kwargs, "STAGES": twin.kwargs["STAGES"]} == twin.kwargs
        if config != twin:
            lowered.append((config.kwargs["BM"], config.kwargs["BN"], config.kwargs["BK"], config.kwargs["STAGES"]))
            deeper = {**config.kwargs, "STAGES": config.kwargs["STAGES"] + 1}
            planner_says = (f"{config.kwargs['STAGES']} of the {deeper['STAGES']} stages fit in {target}'s shared "
                            f"memory \\({gemm_configs.ring_bytes(config)} bytes per stage\\)")
            with pytest.raises(tessera.CompileError, match=planner_says):
                gemm_kernel.kernel.compile(signature=GEMM_SIGNATURE.format(b=B_STRIDES["b-row-major"]),
                                           target=target, num_warps=config.num_warps, strict=True,
                                           **NO_EPILOGUE, **deeper)
    assert lowered == ([(128, 128, 64, 2), (128, 64, 64, 2), (64, 128, 64, 2), (128, 128, 64, 2)]
                       if target == "gfx942" else [])


def test_pin_config_pins_both_compilations_of_the_kernel():
    """The exact and the fast-math kernel tune apart: the op runs the fast one for float16 / bfloat16 outputs,
    so a pinned config (the GPU session's config sweep) must reach both."""
    from tessera.kernels_lib.gemm import gemm_kernel_fast, pin_config
    try:
        pin_config(CONFIGS[1])
        assert gemm_kernel.tuner.pinned == gemm_kernel_fast.tuner.pinned == CONFIGS[1]
    finally:
        pin_config(None)
    assert gemm_kernel.tuner.pinned is None and gemm_kernel_fast.tuner.pinned is None
