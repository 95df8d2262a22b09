"""Fused kernels as GPU code: the functions the fusion pass builds (vertical, lane map, horizontal) lower to
per-thread code that computes on the SIMT simulator what the unfused kernels compute on the tile interpreter,
and compile with ptxas (sm_80, sm_90a) and for gfx942."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera.backends.nvptx import find_ptxas  # noqa: E402
from tessera.ir.core import Module  # noqa: E402
from tessera.passes.fusion import Launch, fuse_launches  # noqa: E402

import fusion_kernels as k  # noqa: E402

M, N, BM, BN = 20, 24, 16, 32


def launch(kernel, grid, names, *args, **constexprs):
    return Launch(kernel.specialize(*args, **constexprs).function, grid, names)


def softmax_plan():
    """row_max -> exp_minus -> row_sum -> divide_rows, one launch; x is buf x, y is buf y."""
    x, m, e, s = np.zeros((M, N), np.float32), np.zeros(M, np.float32), np.zeros((M, N), np.float32), np.zeros(M, np.float32)
    grid, sizes = (tessera.cdiv(M, BM),), (f"#{M}", f"#{N}")
    launches = [launch(k.row_max, grid, ("x", "m", *sizes), x, m, M, N, BM=BM, BN=BN),
                launch(k.exp_minus, grid, ("x", "m", "e", *sizes), x, m, e, M, N, BM=BM, BN=BN),
                launch(k.row_sum, grid, ("e", "s", *sizes), e, s, M, N, BM=BM, BN=BN),
                launch(k.divide_rows, grid, ("e", "s", "y", *sizes), e, s, x, M, N, BM=BM, BN=BN)]
    plan = fuse_launches(launches, live_out=frozenset({"x", "y"}))
    assert len(plan.launches) == 1
    return plan.launches[0]


def horizontal_plan():
    xs = [np.zeros(n, np.float32) for n in (40, 72)]
    launches = [launch(k.unary, (tessera.cdiv(x.size, 32),), (f"x{i}", f"y{i}", f"#{x.size}"), x, x, x.size,
                       OP="sigmoid", BLOCK=32) for i, x in enumerate(xs)]
    plan = fuse_launches(launches)
    assert len(plan.launches) == 1 and plan.launches[0].grid[0] == 2 + 3
    return plan.launches[0]


def run_on_simulator(fused: Launch, values: dict, target: str, num_warps: int = 4):
    from tessera.backends.simt import run_threads
    from tessera.passes.thread_passes import lower
    threads = lower(Module([fused.fn]), target, num_warps).functions[0]
    run_threads(threads, [values[name] if not name.startswith("#") else int(name[1:]) for name in fused.bind],
                fused.grid)


@pytest.mark.parametrize("target", ["sm_80", "gfx942"])
def test_the_fused_softmax_on_the_simt_simulator_matches_torch(target):
    fused = softmax_plan()
    x = np.random.default_rng(0).standard_normal((M, N)).astype(np.float32)
    values = {"x": x, "y": np.zeros_like(x), "m": np.zeros(M, np.float32), "e": np.zeros_like(x),
              "s": np.zeros(M, np.float32)}
    run_on_simulator(fused, values, target)
    np.testing.assert_allclose(values["y"], torch.softmax(torch.from_numpy(x), 1).numpy(), rtol=1e-5, atol=1e-6)
    assert not values["e"].any(), "the intermediate's store was dropped"


def test_the_horizontal_merge_on_the_simt_simulator_runs_both_kernels():
    fused = horizontal_plan()
    rng = np.random.default_rng(1)
    values = {"x0": rng.standard_normal(40).astype(np.float32), "x1": rng.standard_normal(72).astype(np.float32),
              "y0": np.zeros(40, np.float32), "y1": np.zeros(72, np.float32)}
    run_on_simulator(fused, values, "sm_90a")
    for i in (0, 1):
        np.testing.assert_allclose(values[f"y{i}"], 1 / (1 + np.exp(-values[f"x{i}"])), rtol=1e-6)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "gfx942"])
def test_fused_kernels_compile_without_spills(target):
    from tessera.dsl.compiler import compile_tile_module
    if not target.startswith("gfx") and find_ptxas() is None:
        pytest.skip("ptxas not installed")
    for fused in (softmax_plan(), horizontal_plan()):
        compiled = compile_tile_module(Module([fused.fn]), target=target, num_warps=4)
        if target.startswith("gfx"):
            assert compiled.metadata["vgpr_spill_count"] == 0
        else:
            assert compiled.cubin and compiled.metadata["spill_stores"] == 0


def gemm_bias_gelu_plan(config):
    """The library GEMM's kernel (config's tiles) with bias_gelu absorbed as a lane map: c = a @ b is never
    stored, out = gelu(c + bias) is."""
    from tessera.kernels_lib.gemm import gemm_kernel
    Mg, Ng, Kg = 32, 64, 32
    a, b, c = np.zeros((Mg, Kg), np.float16), np.zeros((Kg, Ng), np.float16), np.zeros((Mg, Ng), np.float16)
    names = ("a", "b", "c", "c", "c", "c", f"#{Mg}", f"#{Ng}", f"#{Kg}", "#1.0", f"#{Kg}", "#1", f"#{Ng}", "#1")
    gemm = Launch(gemm_kernel.kernel.specialize(a, b, c, c, c, c, Mg, Ng, Kg, 1.0, Kg, 1, Ng, 1, HAS_BIAS=False,
                                                SCALE_A="none", SCALE_B="none", ACTIVATION="none",
                                                **config.kwargs).function,
                  (tessera.cdiv(Mg, config.kwargs["BM"]) * tessera.cdiv(Ng, config.kwargs["BN"]),), names,
                  writes_all=frozenset({"c"}))
    n = Mg * Ng
    consumer = launch(k.bias_gelu, (tessera.cdiv(n, 128),), ("c", "bias", "out", f"#{n}", f"#{Ng}"),
                      c, np.zeros(Ng, np.float16), c, n, Ng, BLOCK=128)
    plan = fuse_launches([gemm, consumer])
    assert [d.kind for d in plan.decisions if d.fused] == ["lane map"], plan.report()
    return plan.launches[0], (Mg, Ng, Kg)


def test_the_gemm_with_an_absorbed_epilogue_on_the_simt_simulator_matches_torch():
    from tessera.kernels_lib.gemm import CPU_CONFIG
    fused, (Mg, Ng, Kg) = gemm_bias_gelu_plan(CPU_CONFIG)
    rng = np.random.default_rng(2)
    a, b = (rng.standard_normal(s).astype(np.float16) for s in ((Mg, Kg), (Kg, Ng)))
    bias = rng.standard_normal(Ng).astype(np.float16)
    values = {"a": a, "b": b, "bias": bias, "c": np.zeros((Mg, Ng), np.float16), "out": np.zeros((Mg, Ng), np.float16)}
    from tessera.backends.simt import run_threads
    from tessera.passes.thread_passes import lower
    threads = lower(Module([fused.fn]), "sm_80", 4).functions[0]
    run_threads(threads, [values.get(n, None) if not n.startswith("#") else (float(n[1:]) if "." in n else int(n[1:]))
                          for n in fused.bind], fused.grid)
    y = torch.from_numpy(a).float() @ torch.from_numpy(b).float() + torch.from_numpy(bias).float()
    expected = torch.nn.functional.gelu(y, approximate="tanh")
    np.testing.assert_allclose(values["out"].astype(np.float32), expected.numpy(), rtol=2e-2, atol=2e-2)
    assert not values["c"].any()


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_the_gemm_with_an_absorbed_epilogue_compiles_on_tensor_cores_without_spills(target):
    from tessera.dsl.compiler import compile_tile_module
    from tessera.kernels_lib.gemm import CONFIGS
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    fused, _ = gemm_bias_gelu_plan(CONFIGS[3])
    compiled = compile_tile_module(Module([fused.fn]), target=target, num_warps=CONFIGS[3].num_warps)
    assert compiled.metadata["spill_stores"] == 0
    assert ("wgmma" if target == "sm_90a" else "mma.sync") in compiled.stages["ptx"]
