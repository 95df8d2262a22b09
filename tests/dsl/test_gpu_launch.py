"""The GPU launch path, as far as it runs without a GPU: classification of device tensors,
clear errors instead of hangs, and a disk cache that spares a second process the compile."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tessera
from tessera.runtime import cuda

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


class FakeDeviceArray:
    """Looks like GPU memory (a `__cuda_array_interface__` object) without a GPU."""

    def __init__(self, n, typestr="<f4", address=0x7F0000000000):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr, "data": (address, False), "version": 3,
                                         "strides": None}


@tessera.kernel
def copy(x_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    tessera.store(out_ptr + offs, tessera.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class FakeCudaTensor:
    """The attributes of a torch CUDA tensor that a launch reads (its class lives in a `torch` module)."""

    __module__ = "torch.fake"

    def __init__(self, numel, dtype="torch.uint8", element_size=1, address=0x7F0000000200, index=1):
        self.dtype, self.device = dtype, type("device", (), {"type": "cuda", "index": index})()
        self._numel, self._element_size, self._address = numel, element_size, address

    def data_ptr(self):
        return self._address

    def numel(self):
        return self._numel

    def element_size(self):
        return self._element_size


def test_a_reinterpreted_cuda_tensor_keeps_its_address_device_and_size():
    """The direct reads `reinterpret` makes of a torch CUDA tensor (library ops view packed weights on every call)
    give what the general readers (`pointer_and_device`, the memory range) would."""
    from tessera.dsl.arguments import DeviceArray

    tensor = FakeCudaTensor(48, "torch.uint8")
    assert tessera.reinterpret(tensor, tessera.u4) == DeviceArray(tensor, tessera.u4, 0x7F0000000200, 1, 48)
    assert tessera.reinterpret(FakeCudaTensor(8, "torch.int16", 2), tessera.bf16).nbytes == 16
    with pytest.raises(TypeError, match="packed u4 data must be a uint8 array, got i16"):
        tessera.reinterpret(FakeCudaTensor(8, "torch.int16", 2), tessera.u4)


def test_device_arrays_specialize_like_host_arrays():
    fn = copy.specialize(FakeDeviceArray(64), FakeDeviceArray(64, address=0x7F0000000100), 64, BLOCK=64).function
    assert [str(a.type) for a in fn.args] == ["ptr<f32>", "ptr<f32>", "i32"]
    assert fn.attrs["divisible_by_16"] == (0, 1, 2)


def test_device_arrays_can_be_reinterpreted_as_packed_low_bit_types():
    packed = tessera.reinterpret(FakeDeviceArray(32, typestr="|u1"), tessera.u4)
    fn = copy.specialize(packed, tessera.reinterpret(FakeDeviceArray(32, "|u1", 0x7F0000000100), tessera.u4),
                         64, BLOCK=64).function
    assert [str(a.type) for a in fn.args] == ["ptr<u4>", "ptr<u4>", "i32"]
    with pytest.raises(TypeError, match="packed u4 data must be a uint8 array, got f32"):
        tessera.reinterpret(FakeDeviceArray(32), tessera.u4)
    with pytest.raises(TypeError, match=r"cannot view uint8 elements \(8 bits\) as bf16"):
        tessera.reinterpret(FakeDeviceArray(32, typestr="|u1"), tessera.bf16)


@pytest.mark.skipif(cuda.driver_available(), reason="checks the no-driver path")
def test_launching_device_arrays_without_a_driver_is_a_clear_error():
    with pytest.raises(tessera.LaunchError, match="no NVIDIA driver"):
        copy[(1,)](FakeDeviceArray(64), FakeDeviceArray(64), 64, BLOCK=64)


def test_mixing_host_and_device_arrays_is_rejected():
    with pytest.raises(tessera.KernelArgumentError, match="mixes host arrays and GPU tensors"):
        copy[(1,)](np.zeros(64, np.float32), FakeDeviceArray(64), 64, BLOCK=64)


def test_launch_options_are_not_kernel_arguments():
    x, out = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    copy[(1,)](x, out, 8, BLOCK=8, num_warps=2)          # accepted and ignored on the CPU
    np.testing.assert_array_equal(out, x)


SECOND_PROCESS = textwrap.dedent("""
    import subprocess, sys, numpy as np
    sys.path.insert(0, {tests!r})
    started = []
    real_popen_init = subprocess.Popen.__init__
    subprocess.Popen.__init__ = lambda self, *a, **k: started.append(a) or real_popen_init(self, *a, **k)
    from test_gpu_launch import copy
    entry = copy.binary(np.zeros(64, np.float32), np.zeros(64, np.float32), 64, BLOCK=64, target="sm_80")
    loaded = [m for m in ("llvmlite.binding", "tessera.dsl.compiler") if m in sys.modules]
    print(len(entry.ptx), len(copy.specializations), len(started), ",".join(loaded) or "-")
""")


def test_a_second_process_loads_from_the_disk_cache_without_compiling(tmp_path):
    env = {**__import__("os").environ, "TESSERA_CACHE_DIR": str(tmp_path)}
    script = SECOND_PROCESS.format(tests=str(ROOT / "tests" / "dsl"))
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    ptx_len, traced, _, loaded = first.stdout.split()
    assert traced == "1" and int(ptx_len) > 0 and "tessera.dsl.compiler" in loaded
    # the second process neither traces the kernel nor loads LLVM nor runs a tool (ptxas --version):
    # the key is computed from the sources, the stored compiler identity and ptxas's file facts
    assert second.stdout.split() == [ptx_len, "0", "0", "-"]
