"""Launching compiled kernels on a real NVIDIA GPU (skipped where there is none).

Vector add from tutorial 01 is compiled by `compile_tile_module` for the
device's architecture, loaded and launched: on driver-allocated memory
(no torch needed), on torch tensors, and inside a captured CUDA graph.
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tessera.ir.target import TARGETS
from tessera.runtime import cuda
from tessera.runtime.errors import LaunchError
from tessera.runtime.launcher import KernelBinary, Launcher
from tessera.testing import assert_close

from counting_driver import CountingDriver

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(cuda.device_count() == 0, reason="needs an NVIDIA GPU and its driver")]

ROOT = Path(__file__).resolve().parents[2]
N, BLOCK = 10_000, 1024


def tutorial_add():
    spec = importlib.util.spec_from_file_location("tutorial_01", ROOT / "tutorials" / "01-vector-add.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.add


def compile_target(device) -> str:
    """The device's own target, or the newest known one its cubins run on (sm_86 -> sm_80)."""
    if device.target in TARGETS:
        return device.target
    usable = []
    for name, target in TARGETS.items():
        if target.vendor == "nvidia":
            try:
                cuda.check_architecture(name, device.capability, cubin=True)
                usable.append(name)
            except LaunchError:
                pass
    if not usable:
        pytest.skip(f"no tessera target runs on {device.target}")
    return max(usable, key=lambda t: int("".join(c for c in t if c.isdigit())))


@pytest.fixture(scope="module")
def add_kernel():
    """(compiled vector add, its parameter types and names) for GPU 0."""
    from tessera.dsl.compiler import compile_tile_module

    device = cuda.get_device(0)
    host = np.empty(N, np.float32)
    module = tutorial_add().specialize(host, host, host, N, BLOCK=BLOCK).module
    compiled = compile_tile_module(module, target=compile_target(device))
    args = module.functions[0].args
    return compiled, [a.type for a in args], [a.name_hint for a in args]


class DriverArray:
    """Device memory from cuMemAlloc, exposed through __cuda_array_interface__."""

    def __init__(self, device, host: np.ndarray):
        self.d = cuda._driver()
        cuda._check(self.d.cuCtxSetCurrent(device.context), "cuCtxSetCurrent")
        self.nbytes, self.dtype, self.shape = host.nbytes, host.dtype, host.shape
        self.address = int(cuda._check(self.d.cuMemAlloc(self.nbytes), "cuMemAlloc"))
        cuda._check(self.d.cuMemcpyHtoD(self.address, host.ctypes.data, self.nbytes), "cuMemcpyHtoD")
        self.__cuda_array_interface__ = {"data": (self.address, False), "shape": self.shape,
                                         "typestr": self.dtype.str, "version": 3}

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        cuda._check(self.d.cuMemcpyDtoH(out.ctypes.data, self.address, self.nbytes), "cuMemcpyDtoH")
        return out

    def free(self):
        cuda._check(self.d.cuMemFree(self.address), "cuMemFree")


def inputs():
    rng = np.random.default_rng(0)
    return rng.standard_normal(N, dtype=np.float32), rng.standard_normal(N, dtype=np.float32)


@pytest.mark.parametrize("form", ["cubin", "ptx"])
def test_vector_add_on_driver_memory(add_kernel, form):
    compiled, param_types, names = add_kernel
    binary = KernelBinary.of(compiled)
    if form == "ptx":
        binary = KernelBinary(binary.name, binary.target, None, binary.ptx, binary.num_threads, binary.shared_bytes)
    elif binary.image is None:
        pytest.skip("ptxas is not installed, so there is no cubin")
    device = cuda.get_device(0)
    x, y = inputs()
    arrays = [DriverArray(device, a) for a in (x, y, np.zeros_like(x))]
    try:
        launcher = Launcher(binary, param_types, names=names)
        launcher(((N + BLOCK - 1) // BLOCK,), [*arrays, N])
        device.synchronize()
        assert_close(arrays[2].numpy(), x + y, rtol=0, atol=0)
    finally:
        for a in arrays:
            a.free()


def test_vector_add_on_torch_tensors(add_kernel):
    torch = pytest.importorskip("torch")
    compiled, param_types, names = add_kernel
    x, y = (torch.from_numpy(a).cuda() for a in inputs())
    out = torch.zeros_like(x)
    Launcher(compiled, param_types, names=names)(((N + BLOCK - 1) // BLOCK,), [x, y, out, N])
    torch.cuda.synchronize()
    assert_close(out, x + y, rtol=0, atol=0)


def test_vector_add_is_captured_in_a_cuda_graph(add_kernel):
    torch = pytest.importorskip("torch")
    compiled, param_types, names = add_kernel
    launcher = Launcher(compiled, param_types, names=names)
    x, y = (torch.from_numpy(a).cuda() for a in inputs())
    out = torch.zeros_like(x)
    grid = ((N + BLOCK - 1) // BLOCK,)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                 # warm up (loads the module) off the capture
        launcher(grid, [x, y, out, N])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):                 # the launch goes to torch's capture stream
        launcher(grid, [x, y, out, N])
    out.zero_()
    x.add_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, x + y, rtol=0, atol=0)


def test_cpu_tensors_and_wrong_devices_are_refused(add_kernel):
    torch = pytest.importorskip("torch")
    compiled, param_types, names = add_kernel
    launcher = Launcher(compiled, param_types, names=names)
    x = torch.zeros(N, device="cuda")
    with pytest.raises(LaunchError, match=r"argument 1 \(y_ptr\): a CPU tensor was passed to a GPU launch"):
        launcher((1,), [x, torch.zeros(N), x, N])
    if torch.cuda.device_count() > 1:
        with pytest.raises(LaunchError, match="is on GPU 1 but argument 0 .* is on GPU 0"):
            launcher((1,), [x, torch.zeros(N, device="cuda:1"), x, N])


def test_a_cubin_for_another_architecture_is_refused_before_loading(add_kernel):
    compiled, param_types, _ = add_kernel
    device = cuda.get_device(0)
    other = "sm_80" if device.capability[0] != 8 else "sm_90a"
    binary = KernelBinary(compiled.name, other, b"not loaded", None, 128, 0)
    with pytest.raises(LaunchError, match=f"compiled for {other}.*compile it with target="):
        Launcher(binary, param_types)((1,), [0, 0, 0, 0])


def test_grid_limits_are_checked_before_the_driver(add_kernel):
    compiled, param_types, _ = add_kernel
    with pytest.raises(LaunchError, match="grid dimension 1 is 65536"):
        Launcher(compiled, param_types)((1, 65536), [0, 0, 0, 0])


def test_a_warm_launch_on_the_gpu_is_one_driver_call(monkeypatch):
    torch = pytest.importorskip("torch")
    driver = CountingDriver(cuda._driver())
    monkeypatch.setattr(cuda, "_driver", lambda: driver)
    monkeypatch.setattr(cuda, "_devices", {})
    add = tutorial_add()                      # a fresh kernel: nothing prepared on the uncounted driver
    x, y = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    out = torch.empty_like(x)
    grid = (-(-N // BLOCK),)
    for _ in range(3):
        add[grid](x, y, out, N, BLOCK=BLOCK)
    several = cuda.device_count() > 1         # then each launch checks which context is current
    before = driver.counts.copy()             # (counted from here: device_count() asks the driver too)
    add[grid](x, y, out, N, BLOCK=BLOCK)
    assert driver.counts - before == ({"cuCtxGetCurrent": 1} if several else {}) | {"cuLaunchKernel": 1}
    torch.cuda.synchronize()
    assert_close(out, x + y, rtol=0, atol=0)
