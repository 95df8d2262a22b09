"""What a warm `tessera::gemm` call asks of the real driver on a Hopper GPU: one `cuLaunchKernel`, no tensor-map
encode while its tensors stay; one encode (C's map) when its output lands at a new address. The CPU twin, on the
stub driver, is test_gemm_launch_calls.py. Skipped without an NVIDIA driver or on GPUs older than sm_90."""

from collections import Counter

import pytest

from tessera.runtime import cuda
from tessera.testing import assert_close

from counting_driver import CountingDriver

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda.device_count() == 0, reason="needs an NVIDIA GPU")]

torch = pytest.importorskip("torch")


@pytest.fixture
def driver(monkeypatch):
    """The counting driver, with the small-M kernels' launches prepared on it (not on the uncounted one)."""
    from tessera.kernels_lib import gemm_split_k

    if cuda.get_device(0).capability < (9, 0):
        pytest.skip("TMA needs sm_90+")
    counting = CountingDriver(cuda._driver())
    monkeypatch.setattr(cuda, "_driver", lambda: counting)
    monkeypatch.setattr(cuda, "_devices", {})
    kernels = (gemm_split_k.gemm_split_k_kernel, gemm_split_k.gemm_split_k_kernel_fast)
    for kernel in kernels:
        kernel.launchers.clear()
        kernel.fast_launches.clear()
    yield counting
    for kernel in kernels:
        kernel.launchers.clear()
        kernel.fast_launches.clear()


def test_a_warm_gemm_op_is_one_driver_call_and_a_new_output_one_encode(driver):
    from tessera.kernels_lib.gemm import gemm

    a, b = (torch.randn(64, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    kept = [gemm(a, b) for _ in range(3)]           # kept alive: each output at a new address
    before = Counter(driver.counts)
    kept.append(gemm(a, b))
    assert driver.counts - before == Counter(cuTensorMapEncodeTiled=1, cuLaunchKernel=1)
    del kept                                        # freed: the allocator hands back blocks seen above
    gemm(a, b)
    gemm(a, b)
    before = Counter(driver.counts)
    out = gemm(a, b)
    assert driver.counts - before == Counter(cuLaunchKernel=1)
    assert_close(out.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-1)


@pytest.mark.parametrize("M,N,K", [(16, 256, 256), (16, 1024, 8192), (512, 512, 256), (256, 4096, 4096)],
                         ids=["small-m", "small-m-split", "tiled", "few-tiles-split"])
@pytest.mark.parametrize("trans_b", [False, True], ids=["b", "b-weight"])
def test_replayed_plans_compute_the_product(M, N, K, trans_b):
    """Warm calls replay their shape's plan (`gemm_plan.py`): each call's output is right, not only the first."""
    import importlib

    gemm = importlib.import_module("tessera.kernels_lib.gemm")
    g = torch.Generator().manual_seed(M + N)
    a = torch.randn((M, K), generator=g).to(torch.bfloat16).cuda()
    b = torch.randn((N, K) if trans_b else (K, N), generator=g).to(torch.bfloat16).cuda()
    bias = torch.randn(N, generator=g).cuda()
    reference = torch.relu(a.float() @ (b.float().t() if trans_b else b.float()) + bias)
    plans = len(gemm._PLANS)
    for _ in range(4):
        out = gemm.gemm(a, b, bias, activation="relu", trans_b=trans_b)
        assert_close(out.float(), reference, rtol=2e-2, atol=2e-1)
    assert len(gemm._PLANS) == plans + 1, "the warm calls were planned"


def test_with_patched_maps_each_new_output_gets_its_own_product(driver, monkeypatch):
    """$TESSERA_TMA_ADDRESS_PATCH=1 (`runtime/tensor_map_patch.py`): 300 calls, each output kept (a new address
    every call) and scaled by its own alpha, so a C map patched wrong would store into another call's output. Every
    output must be its own product, with most maps patched rather than encoded. This passing (with
    tests/runtime/test_tensor_map_patch.py's GPU test) is what lets the switch default to on."""
    from tessera.kernels_lib.gemm import gemm

    monkeypatch.setenv("TESSERA_TMA_ADDRESS_PATCH", "1")
    a, b = (torch.randn(64, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    product = a.float() @ b.float()
    alphas = [1.0 + i / 64 for i in range(300)]
    before = Counter(driver.counts)
    outputs = [gemm(a, b, alpha=alpha) for alpha in alphas]
    encodes = (driver.counts - before)["cuTensorMapEncodeTiled"]
    for alpha, out in zip(alphas, outputs):
        assert_close(out.float(), alpha * product, rtol=2e-2, atol=5e-1)
    assert encodes < len(outputs) // 4, f"{encodes} encodes: the maps were not patched"


@pytest.mark.parametrize("scales", ["per-tensor", "per-row-and-column", "mixed"])
def test_replayed_fp8_plans_with_scales_compute_the_product(scales):
    """fp8 calls with scales replay their plan too (`gemm_plan.py`: each scale's own address passed, a 0-d one
    read as one scalar); each call's scales differ, so a replay passing a stale address would be caught."""
    import importlib

    gemm = importlib.import_module("tessera.kernels_lib.gemm")
    if cuda.get_device(0).capability < (8, 9):
        pytest.skip("fp8 needs sm_89+")
    g = torch.Generator().manual_seed(7)
    a = torch.randn((64, 512), generator=g).to(torch.float8_e4m3fn).cuda()
    b = torch.randn((512, 256), generator=g).to(torch.float8_e4m3fn).cuda()
    product = a.float() @ b.float()
    plans = len(gemm._PLANS)
    for step in range(5):
        if scales == "per-tensor":
            scale_a, scale_b = torch.tensor(0.5 + step, device="cuda"), torch.tensor(0.25, device="cuda")
        elif scales == "mixed":
            scale_a, scale_b = torch.tensor(0.5 + step, device="cuda"), torch.rand(256, generator=g).cuda()
        else:
            scale_a = torch.rand(64, generator=g).cuda() + step
            scale_b = torch.rand(256, generator=g).cuda()
        out = gemm.gemm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.float32)
        expected = product * (scale_a.reshape(-1, 1) if scale_a.dim() else scale_a) * scale_b.reshape(1, -1)
        assert_close(out, expected, rtol=2e-2, atol=2e-1)
    assert len(gemm._PLANS) == plans + 1, "the warm calls were planned"
