"""A captured GEMM -> elementwise chain on GPU memory, on a machine without a GPU.

The library's GPU launch (`gemm.launch_tuned`, what `gemm(a, b)` calls for CUDA tensors) records inside
`tessera.fusion()` through the real capture, fusion pass, `FusedKernel`, compiler, binary cache and launcher;
only the driver is `StubDriver` (an sm_80 GPU that accepts launches and runs nothing) and the arrays are
`__cuda_array_interface__` objects. What the fused kernel computes is checked by running the very function the
stub was asked to launch on the CPU interpreter; the binaries it becomes are checked by ptxas and ld.lld.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.backends.interp import Memory, run_function
from tessera.backends.nvptx import find_ptxas
from tessera.dsl import compiler
from tessera.dsl.fused_kernel import FusedKernel
from tessera.kernels_lib.gemm import CONFIGS, gemm_kernel, gemm_kernel_fast, launch_tuned
from tessera.runtime.stub_driver import stubbed_driver

import fusion_kernels as k

torch = pytest.importorskip("torch")

M, N, K = 200, 144, 64
BASE = 0x7F0000000000


class DeviceBuffer:
    """GPU memory as `__cuda_array_interface__` describes it, with host data standing for its contents."""

    def __init__(self, host: np.ndarray, address: int):
        self.host = host
        self.__cuda_array_interface__ = {"shape": (host.size,), "typestr": host.dtype.str, "data": (address, False),
                                         "version": 3, "strides": None}


def buffers():
    rng = np.random.default_rng(18)
    host = {"a": rng.standard_normal((M, K)).astype(np.float16), "b": rng.standard_normal((K, N)).astype(np.float16),
            "c": np.zeros((M, N), np.float32), "bias": rng.standard_normal(N).astype(np.float32),
            "out": np.zeros((M, N), np.float32)}
    return {name: DeviceBuffer(x, BASE + i * (1 << 20)) for i, (name, x) in enumerate(host.items())}


def capture_gemm_bias_gelu(bufs):
    """gemm(a, b) as the library launches it on the GPU, then bias_gelu on its output, captured."""
    a, b, c, bias, out = (bufs[n] for n in ("a", "b", "c", "bias", "out"))
    with tessera.fusion() as f:
        launch_tuned(gemm_kernel, (a, b, c, c, c, c, M, N, K, 1.0, K, 1, N, 1), c, M, N, 132, tessera.capturing(),
                     HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none")
        k.bias_gelu[(tessera.cdiv(M * N, 512),)](c, bias, out, M * N, N, BLOCK=512)
        f.intermediate(c)
    return f


def interpret(f, bufs) -> None:
    """Run the fused function the capture launched on the CPU interpreter, on the buffers' host data."""
    (launch,) = f.launches
    starts = {span[1]: name for span, name in f.ranges.items()}
    by_name = {starts[d.__cuda_array_interface__["data"][0]]: d.host for d in bufs.values()}
    args = []
    for name, param in zip(launch.bind, launch.fn.args):
        if name.startswith("#"):
            args.append(float(name[1:]) if "." in name else int(name[1:]))
        else:
            args.append(Memory(by_name[name].reshape(-1), param.type.pointee))
    run_function(launch.fn, args, launch.grid)


@pytest.fixture
def gpu(tmp_path, monkeypatch):
    """The stub GPU, an empty binary cache, and the library kernels' tuning state left as found."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))
    compiles = []
    real = compiler.compile_tile_module
    monkeypatch.setattr(compiler, "compile_tile_module", lambda *a, **kw: compiles.append(a[0]) or real(*a, **kw))
    with stubbed_driver() as driver:
        driver.compiles = compiles
        yield driver
    gemm_kernel.pin(None)


def test_a_gemm_on_gpu_memory_takes_its_elementwise_consumer_as_its_epilogue(gpu):
    bufs = buffers()
    f = capture_gemm_bias_gelu(bufs)
    assert f.ran == ["gemm_kernel+bias_gelu"]
    report = f.report()
    assert "lane map gemm_kernel -> bias_gelu: fused (bias_gelu re-indexed onto gemm_kernel's output tile)" in report
    # nothing tuned for this shape: the model's choice, 64 x 64 tiles (12 tiles fill the SMs in one wave)
    assert "gemm_kernel: autotuned; launched with the model config (BM=64, BN=64, BK=64" in report
    (launch,) = gpu.launches()
    function, grid, block = launch[1], launch[2], launch[3]
    assert function[1] == f.launches[0].fn.name and grid == (12, 1, 1) and block == (128, 1, 1)
    interpret(f, bufs)
    y = torch.from_numpy(bufs["a"].host).float() @ torch.from_numpy(bufs["b"].host).float()
    expected = torch.nn.functional.gelu(y + torch.from_numpy(bufs["bias"].host), approximate="tanh")
    np.testing.assert_allclose(bufs["out"].host, expected.numpy(), rtol=2e-3, atol=2e-3)
    assert not bufs["c"].host.any()             # the intermediate's store was dropped


def test_a_pinned_or_tuned_config_is_the_one_the_fused_kernel_runs(gpu):
    gemm_kernel.pin(CONFIGS[2])                 # 64 x 128 tiles
    f = capture_gemm_bias_gelu(buffers())
    assert f.ran == ["gemm_kernel+bias_gelu"]
    assert "launched with the pinned config (BM=64, BN=128" in f.report()
    assert gpu.launches()[0][2] == (tessera.cdiv(M, 64) * tessera.cdiv(N, 128), 1, 1)


def test_the_exact_gemm_is_captured_since_a_fast_math_producer_refuses_its_consumer(gpu):
    bufs = buffers()
    a, b, c, bias, out = (bufs[n] for n in ("a", "b", "c", "bias", "out"))
    with tessera.fusion() as f:
        launch_tuned(gemm_kernel_fast, (a, b, c, c, c, c, M, N, K, 1.0, K, 1, N, 1), c, M, N, 132, tessera.capturing(),
                     HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none")
        k.bias_gelu[(tessera.cdiv(M * N, 512),)](c, bias, out, M * N, N, BLOCK=512)
    assert len(f.ran) == 2 and "numerics options differ (fast_math)" in f.report()


def test_a_new_capture_of_the_same_chain_loads_the_fused_binary_from_disk(gpu, tmp_path):
    capture_gemm_bias_gelu(buffers())
    assert len(gpu.compiles) == 1
    capture_gemm_bias_gelu(buffers())           # a new FusedKernel: nothing in memory, the disk entry serves
    assert len(gpu.compiles) == 1 and len(gpu.launches()) == 2
    script = ("import sys; sys.path.insert(0, 'tests/fusion'); from test_capture_gpu_path import *\n"
              "from tessera.runtime.stub_driver import stubbed_driver\n"
              "compiles = []; real = compiler.compile_tile_module\n"
              "compiler.compile_tile_module = lambda *a, **kw: compiles.append(1) or real(*a, **kw)\n"
              "with stubbed_driver() as driver:\n"
              "    capture_gemm_bias_gelu(buffers())\n"
              "print(len(compiles), len(driver.launches()))\n")
    env = dict(os.environ, TESSERA_CACHE_DIR=str(tmp_path / "cache"))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["0", "1"]     # the second process launched without compiling


def test_the_fused_binary_key_follows_the_ir_the_target_and_the_options(gpu):
    f = capture_gemm_bias_gelu(buffers())
    fn = f.launches[0].fn
    first = FusedKernel(fn).binary("sm_80")
    assert len(gpu.compiles) == 1 and FusedKernel(fn).binary("sm_80").ptx == first.ptx and len(gpu.compiles) == 1
    FusedKernel(fn).binary("sm_80", num_warps=8)
    assert len(gpu.compiles) == 2
    relu = tessera.fusion()
    with relu:
        xs = [DeviceBuffer(np.zeros(1024, np.float32), BASE + i * 8192) for i in range(3)]
        k.unary[(1,)](xs[0], xs[1], 1024, OP="relu", BLOCK=1024)
        k.unary[(1,)](xs[1], xs[2], 1024, OP="tanh", BLOCK=1024)
    assert relu.ran == ["unary+unary"] and len(gpu.compiles) == 3     # other IR, another entry


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "gfx942"])
def test_the_captured_fused_gemm_compiles_for_each_target(gpu, target):
    if not target.startswith("gfx") and find_ptxas() is None:
        pytest.skip("ptxas not installed")
    f = capture_gemm_bias_gelu(buffers())
    entry = FusedKernel(f.launches[0].fn).binary(target)
    assert entry.binary
    if target.startswith("gfx"):
        assert entry.metadata["vgpr_spill_count"] == 0
    else:
        assert entry.metadata["spill_stores"] == 0
        assert ("wgmma" if target == "sm_90a" else "mma.sync") in entry.ptx


def test_the_gemm_model_weighs_padding_and_waves_and_prefers_larger_tiles_among_equals():
    from tessera.kernels_lib.gemm_configs import COMMON, predicted
    assert predicted(COMMON, {"M": 4096, "N": 4096}) == COMMON[0]       # 128 x 128: as few waves, more reuse
    assert predicted(COMMON, {"M": 200, "N": 144}).kwargs["BM"] == 64   # 12 small tiles in one wave
    assert predicted(COMMON, {"M": 32768, "N": 64}) == COMMON[1]        # tall: 128 x 64, no padded columns


def test_q_k_and_v_projections_on_gpu_memory_run_as_one_launch(gpu):
    bufs = buffers()
    a = bufs["a"]
    weights = [DeviceBuffer(bufs["b"].host.copy(), BASE + (8 + i) * (1 << 20)) for i in range(3)]
    outs = [DeviceBuffer(np.zeros((M, N), np.float32), BASE + (12 + i) * (1 << 20)) for i in range(3)]
    with tessera.fusion() as f:
        for w, c in zip(weights, outs):
            launch_tuned(gemm_kernel, (a, w, c, c, c, c, M, N, K, 1.0, K, 1, N, 1), c, M, N, 132, tessera.capturing(),
                         HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none")
    assert f.ran == ["gemm_kernel+gemm_kernel+gemm_kernel"]
    assert "horizontal gemm_kernel | gemm_kernel | gemm_kernel: fused (3 launches -> 1, grid 36)" in f.report()
    assert [launch[2] for launch in gpu.launches()] == [(36, 1, 1)]
