"""On a machine with an NVIDIA GPU: the tutorial kernels run on the device, unchanged, and match torch."""

import importlib.util
from pathlib import Path

import pytest

import tessera
from tessera.testing import assert_close

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


def tutorial(file: str, name: str):
    spec = importlib.util.spec_from_file_location(file.replace("-", "_")[:-3], ROOT / "tutorials" / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def test_vector_add_on_the_gpu():
    add = tutorial("01-vector-add.py", "add")
    n = 100_003
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    add[(tessera.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    assert_close(out, x + y, rtol=0, atol=0)


def test_softmax_on_the_gpu():
    softmax = tutorial("02-fused-softmax.py", "softmax")
    x = torch.randn(64, 781, device="cuda")
    out = torch.empty_like(x)
    softmax[(64,)](x, out, 64, 781, BLOCK=1024)
    assert_close(out, torch.softmax(x, dim=1), rtol=1.3e-6, atol=1e-5)


def test_matmul_on_the_gpu():
    matmul = tutorial("03-matmul.py", "matmul")
    M, N, K = 200, 136, 300
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
    matmul[(tessera.cdiv(M, 64), tessera.cdiv(N, 64))](a, b, c, M, N, K, BM=64, BN=64, BK=32)
    assert_close(c, (a.float() @ b.float()).half(), rtol=1e-2, atol=1e-2, matmul=(a, b, 32))


def test_dropout_and_the_grouped_gemm_on_the_gpu():
    file = "07-dropout-and-grouped-gemm.py"
    dropout, grouped_gemm = tutorial(file, "dropout"), tutorial(file, "grouped_gemm")
    reference_dropout = tutorial(file, "reference_dropout")
    x = torch.randn(10_000, device="cuda")
    out = torch.empty_like(x)
    dropout[(10,)](x, out, 10_000, 0.2, 1234, BLOCK=1024)
    assert_close(out.cpu(), torch.from_numpy(reference_dropout(x.cpu().numpy(), 0.2, 1234)), rtol=0, atol=0)
    shapes = [(48, 32, 64), (16, 64, 32), (80, 16, 16)]
    a = [torch.randn(m, k, device="cuda", dtype=torch.float16) for m, n, k in shapes]
    b = [torch.randn(k, n, device="cuda", dtype=torch.float16) for m, n, k in shapes]
    c = [torch.zeros(m, n, device="cuda") for m, n, k in shapes]
    sizes = torch.tensor(shapes, dtype=torch.int32, device="cuda").reshape(-1)
    grouped_gemm[(15, 3)](tessera.addresses(a), tessera.addresses(b), tessera.addresses(c), sizes, BM=16, BN=16,
                          BK=16)
    for ai, bi, ci in zip(a, b, c):
        assert_close(ci, ai.float() @ bi.float(), rtol=1e-3, atol=1e-3)


def test_a_launch_replays_inside_a_cuda_graph():
    add = tutorial("01-vector-add.py", "add")
    n = 4096
    x, y, out = torch.randn(n, device="cuda"), torch.randn(n, device="cuda"), torch.zeros(n, device="cuda")
    add[(4,)](x, y, out, n, BLOCK=1024)                      # compile and load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        add[(4,)](x, y, out, n, BLOCK=1024)
    x.add_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, x + y, rtol=0, atol=0)


def test_interpret_mode_runs_cuda_tensors_on_the_cpu(monkeypatch):
    monkeypatch.setenv("TESSERA_INTERPRET", "1")
    add = tutorial("01-vector-add.py", "add")
    x, y, out = torch.randn(300, device="cuda"), torch.randn(300, device="cuda"), torch.zeros(300, device="cuda")
    add[(1,)](x, y, out, 300, BLOCK=512)
    assert_close(out, x + y, rtol=0, atol=0)
