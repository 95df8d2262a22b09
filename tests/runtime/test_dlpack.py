"""GPU `__dlpack__` objects (JAX, CuPy, ...) as launch arguments: read from their capsules, exported with the
launch's stream.

No GPU is needed: `GpuArray` wraps host memory and says it lives on CUDA
device 0, and the driver is `StubDriver`, so a launch runs everything but
the kernel and records what it passed.
"""

import types

import numpy as np
import pytest
import torch

import tessera
from tessera.dsl import gpu_launch
from tessera.runtime import dlpack
from tessera.runtime.errors import LaunchError
from tessera.runtime.stub_driver import StubDriver, stubbed_driver


class GpuArray:
    """An array known only through `__dlpack__`, on a GPU as far as a consumer can tell; it records the
    `stream=` of every export."""

    def __init__(self, array, device_type=dlpack.DL_CUDA, device_id=0):
        self.array, self.device, self.streams = array, (device_type, device_id), []

    def __dlpack__(self, *, stream=None):
        self.streams.append(stream)
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.device


@tessera.kernel
def copy(x_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    tessera.store(out_ptr + offs, tessera.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def fake_binary(kernel, bound, target, num_warps):
    return types.SimpleNamespace(name=kernel.name, target=target, ptx=None, metadata={"num_threads": 128},
                                 binary=b"cubin")


@pytest.fixture
def driver(monkeypatch):
    copy.launchers.clear()
    monkeypatch.setattr(gpu_launch, "binary_for", fake_binary)
    with stubbed_driver() as stub:
        yield stub


# -- reading capsules ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, name", [(torch.float32, "float32"), (torch.float16, "float16"),
                                         (torch.bfloat16, "bfloat16"), (torch.bool, "bool"),
                                         (torch.int8, "int8"), (torch.uint8, "uint8"), (torch.int64, "int64"),
                                         (torch.float8_e4m3fn, "float8_e4m3fn"),
                                         (torch.float8_e5m2, "float8_e5m2")])
def test_a_capsule_gives_the_element_type_by_name(dtype, name):
    layout = dlpack.read(torch.zeros(2, 3, dtype=dtype))
    assert layout.type_name == name and layout.shape == (2, 3)


def test_a_strided_capsule_spans_its_first_to_last_element():
    a = np.zeros((4, 6), dtype=np.float32)
    view = a[1:, ::2]
    layout = dlpack.read(view)
    assert layout.address == view.ctypes.data
    assert layout.strides == (6, 2)
    assert layout.nbytes == ((3 - 1) * 6 + (3 - 1) * 2 + 1) * 4
    assert dlpack.read(a).nbytes == a.nbytes and dlpack.read(a[:0]).nbytes == 0


def test_the_launch_stream_is_spelled_as_the_protocol_asks():
    assert dlpack.stream_argument(0) == 1                     # CUDA's legacy default stream (0 is ambiguous)
    assert dlpack.stream_argument(0x1234) == 0x1234
    assert dlpack.stream_argument(0, dlpack.DL_ROCM) == 0       # HIP's default stream is 0
    assert dlpack.stream_argument(0x1234, dlpack.DL_ROCM) == 0x1234


def test_producers_without_the_stream_keyword_are_still_read():
    class Old:
        def __init__(self, array):
            self.array = array

        def __dlpack__(self):
            return self.array.__dlpack__()

    a = np.arange(4, dtype=np.float32)
    assert dlpack.read(Old(a), stream=7).address == a.ctypes.data


def test_arrays_in_other_memory_are_refused_naming_it():
    with pytest.raises(LaunchError, match="in CPU memory .*copy it to the GPU"):
        dlpack.gpu_device(GpuArray(np.zeros(4), device_type=dlpack.DL_CPU))
    with pytest.raises(LaunchError, match="in Metal memory"):
        dlpack.gpu_device(GpuArray(np.zeros(4), device_type=8))


# -- launching them ------------------------------------------------------------------------------


def test_a_dlpack_array_is_bound_by_its_element_type_and_alignment():
    x, out = GpuArray(np.zeros(64, dtype=np.float16)), GpuArray(np.zeros(64, dtype=np.float16))
    bound = copy._bind((x, out, 64), {"BLOCK": 64})
    assert [str(p.type) for p in bound.params[:2]] == ["ptr<f16>", "ptr<f16>"]
    assert set(x.streams) == {dlpack.NO_SYNCHRONIZATION}       # binding reads the layout without waiting


def test_an_unknown_element_type_is_refused_naming_the_argument():
    complex_array = GpuArray(np.zeros(4, dtype=np.complex64))
    with pytest.raises(tessera.KernelArgumentError, match="argument 'x_ptr'.*complex.*no tessera equivalent"):
        copy._bind((complex_array, complex_array, 4), {"BLOCK": 64})


def test_a_launch_exports_each_array_for_its_stream_and_passes_its_address(driver):
    x, out = GpuArray(np.arange(64, dtype=np.float32)), GpuArray(np.zeros(64, dtype=np.float32))
    copy[(1,)](x, out, 64, BLOCK=64)
    assert x.streams[-1] == dlpack.CUDA_LEGACY_DEFAULT_STREAM and out.streams[-1] == 1
    launcher = next(iter(copy.launchers.values()))
    assert launcher.packer.decode()[:2] == [x.array.ctypes.data, out.array.ctypes.data]

    copy[(1,)](x, out, 64, BLOCK=64, stream=0x77)
    assert x.streams[-1] == 0x77 and out.streams[-1] == 0x77
    assert driver.launches()[-1][5] == 0x77


def test_arrays_on_two_gpus_are_refused_naming_both(monkeypatch):
    monkeypatch.setattr(gpu_launch, "binary_for", fake_binary)
    x = GpuArray(np.arange(64, dtype=np.float32), device_id=1)
    out = GpuArray(np.zeros(64, dtype=np.float32), device_id=0)
    with stubbed_driver(StubDriver(device_count=2)), \
            pytest.raises(LaunchError, match=r"argument 1 \(out_ptr\) is on GPU 0 but argument 0 \(x_ptr\) is on GPU 1"):
        copy[(1,)](x, out, 64, BLOCK=64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and a CUDA build of torch")
def test_a_torch_cuda_tensor_seen_only_through_dlpack_runs_on_the_gpu():
    class DLPackOnly:
        """A CUDA tensor behind the DLPack protocol alone (as JAX arrays are)."""

        def __init__(self, tensor):
            self.tensor, self.streams = tensor, []

        def __dlpack__(self, *, stream=None):
            self.streams.append(stream)
            return self.tensor.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return self.tensor.__dlpack_device__()

    x = torch.arange(1000, dtype=torch.float32, device="cuda")
    out = torch.zeros_like(x)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        copy[(tessera.cdiv(1000, 256),)](DLPackOnly(x), wrapped := DLPackOnly(out), 1000, BLOCK=256,
                                         stream=side)
    side.synchronize()
    assert wrapped.streams[-1] == side.cuda_stream
    assert torch.equal(out, x)
