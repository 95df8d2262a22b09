"""The GEMM's tile schedule: grouped (L2-friendly) tile order, and persistent programs that loop over tiles."""

import importlib
import itertools

import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402

gemm_module = importlib.import_module("tessera.kernels_lib.gemm")
gemm, grouped_tile = gemm_module.gemm, gemm_module.grouped_tile


@pytest.mark.parametrize("num_pid_m,num_pid_n,GROUP_M", [
    (1, 1, 1), (5, 3, 2), (5, 3, 8), (3, 5, 2), (7, 4, 3), (8, 8, 8), (9, 2, 4), (16, 1, 8), (1, 16, 8)])
def test_grouped_order_visits_every_tile_once(num_pid_m, num_pid_n, GROUP_M):
    num_tiles = num_pid_m * num_pid_n
    order = [grouped_tile(t, num_pid_m, num_pid_n, GROUP_M) for t in range(num_tiles)]  # runs on the host
    assert sorted(order) == list(itertools.product(range(num_pid_m), range(num_pid_n)))


def test_grouped_order_walks_columns_within_a_group_of_rows():
    # 5 x 3 tiles in groups of 2 rows: rows {0, 1} column by column, then {2, 3}, then the short group {4}.
    assert [grouped_tile(t, 5, 3, 2) for t in range(15)] == [
        (0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2),
        (2, 0), (3, 0), (2, 1), (3, 1), (2, 2), (3, 2),
        (4, 0), (4, 1), (4, 2)]


def test_group_of_one_row_is_row_major():
    assert [grouped_tile(t, 3, 4, 1) for t in range(12)] == list(itertools.product(range(3), range(4)))


def cpu_config(monkeypatch, persistent, group_m, num_sms=2):
    config = tessera.Config({"BM": 16, "BN": 16, "BK": 16, "GROUP_M": group_m, "PERSISTENT": persistent,
                            "STAGES": 2}, num_warps=4)
    monkeypatch.setattr(gemm_module, "CPU_CONFIG", config)
    monkeypatch.setattr(gemm_module, "CPU_NUM_SMS", num_sms)


@pytest.mark.parametrize("persistent", [False, True], ids=["one-program-per-tile", "persistent"])
@pytest.mark.parametrize("group_m", [1, 2, 4])
@pytest.mark.parametrize("M,N,K", [(80, 48, 20), (33, 70, 16), (16, 16, 40)])
def test_schedules_match_torch(monkeypatch, M, N, K, group_m, persistent):
    cpu_config(monkeypatch, persistent, group_m)    # 80 x 48: 5 x 3 tiles, 2 programs when persistent
    g = torch.Generator().manual_seed(M * N + K)
    a, b, bias = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g), torch.randn(N, generator=g)
    expected = torch.relu(0.5 * (a @ b) + bias)
    torch.testing.assert_close(gemm(a, b, bias=bias, activation="relu", alpha=0.5), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("num_sms", [1, 2, 7, 100])
def test_persistent_grid_is_at_most_one_program_per_tile(monkeypatch, num_sms):
    cpu_config(monkeypatch, True, 2, num_sms)
    meta = gemm_module.CPU_CONFIG.kwargs
    assert gemm_module._grid(80, 48, meta, num_sms) == (min(15, num_sms),)
    assert gemm_module._grid(80, 48, {**meta, "PERSISTENT": False}, num_sms) == (15,)
    a, b = torch.randn(80, 24).half(), torch.randn(48, 24).half()
    torch.testing.assert_close(gemm(a, b, trans_b=True).float(), a.float() @ b.float().t(), rtol=1e-2, atol=1e-2)


def test_gpu_configs_group_by_8_and_one_is_persistent():
    assert all(c.kwargs["GROUP_M"] == 8 for c in gemm_module.CONFIGS)
    assert [c.kwargs["PERSISTENT"] for c in gemm_module.CONFIGS].count(True) == 1
    assert gemm_module.CPU_CONFIG.kwargs["GROUP_M"] in (1, 2) and not gemm_module.CPU_CONFIG.kwargs["PERSISTENT"]


def test_persistent_loop_around_k_loop_and_epilogue_compiles_for_hopper():
    from tessera.backends.nvptx import find_ptxas
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    compiled = gemm_module.gemm_kernel.kernel.compile(
        signature="*f8e4m3:16,*f8e4m3:16,*f32:16,*f32:16,*f32:16,*bf16:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,i32:1,i32:16",
        target="sm_90a", num_warps=8, HAS_BIAS=True, SCALE_A="vector", SCALE_B="vector", ACTIVATION="gelu",
        BM=128, BN=128, BK=64, GROUP_M=8, PERSISTENT=True, STAGES=3)
    assert compiled.cubin and compiled.metadata["spill_stores"] == 0
