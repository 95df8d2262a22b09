"""On a machine with an NVIDIA GPU: the generated C launchers, built into a shared library against the real
driver (-lcuda), launch on torch's stream and compute what torch computes -- vector add, and the library GEMM
whose C launcher encodes its TMA tensor maps itself (A's and B's, which the K loop loads through, and C's,
which the epilogue stores through)."""

import ctypes
import ctypes.util
import subprocess

import pytest

from tessera.aot import Specialization
from tessera.runtime import cuda
from tessera.testing import assert_close

from test_c_launcher import ADD, CC, GEMM, GEMM_CONSTS, GEMM_SIGNATURE, INCLUDE, compile_kernel
from tma_maps import maps_by_use     # (test_c_launcher puts tests/kernels_lib on sys.path)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda.device_count() == 0, reason="needs an NVIDIA GPU"),
              pytest.mark.skipif(CC is None or INCLUDE is None, reason="needs a C compiler and cuda.h")]
torch = pytest.importorskip("torch")


def shared_library(spec: Specialization, folder) -> ctypes.CDLL:
    """The launcher built into a shared library; its cu* symbols resolve against the driver loaded globally
    (the driver's folder need not be on the linker's path)."""
    done = subprocess.run([CC, "-std=c11", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{INCLUDE}",
                           f"{spec.symbol}.c", "-o", f"lib{spec.symbol}.so"], cwd=folder, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(str(folder / f"lib{spec.symbol}.so"))


def stream() -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def test_a_c_launched_vector_add_matches_torch(tmp_path):
    target = cuda.get_device(0).target
    spec = Specialization.load(compile_kernel(tmp_path, ADD, "*f32:16,*f32:16,*f32:16,i32", ["BLOCK=1024"],
                                              target=target))
    lib = shared_library(spec, tmp_path)
    lib.add_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 3 + [ctypes.c_uint64] * 3 + [ctypes.c_int32]
    n = 100_003
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.full_like(x, float("nan"))
    torch.cuda.synchronize()          # torch's context is current: the C code loads into it
    status = lib.add_launch(stream(), (n + 1023) // 1024, 1, 1, x.data_ptr(), y.data_ptr(), out.data_ptr(), n)
    assert status == 0
    torch.cuda.synchronize()
    assert_close(out, x + y, rtol=0, atol=0)


def test_a_c_launched_tma_gemm_matches_torch(tmp_path):
    if cuda.get_device(0).capability != (9, 0):
        pytest.skip("the GEMM is compiled for sm_90a (TMA + wgmma)")
    spec = Specialization.load(compile_kernel(tmp_path, GEMM, GEMM_SIGNATURE, GEMM_CONSTS, target="sm_90a", warps=8))
    # the maps the C launcher encodes are exactly those the kernel's TMA instructions use
    assert maps_by_use((tmp_path / "gemm_kernel.ptx").read_text(), list(spec.tensor_maps)) == \
        {"load": ["a_ptr", "b_ptr"], "store": ["c_ptr"]}
    lib = shared_library(spec, tmp_path)
    lib.gemm_kernel_launch.argtypes = ([ctypes.c_void_p] + [ctypes.c_uint] * 3 + [ctypes.c_uint64] * 6
                                       + [ctypes.c_int32] * 3 + [ctypes.c_float] + [ctypes.c_int32] * 4)
    M, N, K = 1008, 1008, 2000                      # multiples of 16, as the signature assumes; not of the blocks
    g = torch.Generator().manual_seed(0)
    a = torch.randn((M, K), generator=g).to(torch.bfloat16).cuda()
    b = torch.randn((K, N), generator=g).to(torch.bfloat16).cuda()
    c = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    tiles = -(-M // 128) * -(-N // 128)
    torch.cuda.synchronize()
    status = lib.gemm_kernel_launch(stream(), tiles, 1, 1, a.data_ptr(), b.data_ptr(), c.data_ptr(), c.data_ptr(),
                                    c.data_ptr(), c.data_ptr(), M, N, K, 1.0, K, 1, N, 1)
    assert status == 0
    torch.cuda.synchronize()
    assert_close(c.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-1, matmul=(a.float(), b.float(), 64))
