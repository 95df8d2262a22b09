"""The occupancy query: how many programs of a compiled kernel a GPU runs at once (SMs x blocks per SM), which
sizes the grid of a persistent kernel whose programs wait for each other. On the stub driver, which answers as
the occupancy calculator does for an A100 (108 SMs, 64K registers, 164 KiB shared memory, 2048 threads per SM).
"""

import types

import numpy as np
import pytest

import tessera
from tessera.dsl import gpu_launch
from tessera.dsl.errors import KernelArgumentError
from tessera.ir import dtypes as dt
from tessera.ir.types import PointerType, ScalarType
from tessera.runtime.errors import LaunchError
from tessera.runtime.launcher import KernelBinary, Launcher
from tessera.runtime.stub_driver import stubbed_driver

TYPES = [PointerType(dt.f32), ScalarType(dt.i32)]


def launcher(num_threads=128, shared_bytes=0):
    return Launcher(KernelBinary("persistent", "sm_80", b"cubin", num_threads=num_threads,
                                 shared_bytes=shared_bytes), TYPES)


@pytest.mark.parametrize("registers, threads, per_sm, limit", [
    (20, 128, 16, "threads: 2048 per SM"),
    (128, 128, 4, "registers: 128 x 32 per warp, 16 warps in 64K"),
    (255, 128, 2, "registers: 255 rounds up to 256 per thread"),
    (32, 32, 32, "the 32-block limit"),
    (64, 384, 2, "registers: 12 warps of 2048"),
])
def test_blocks_per_sm_follow_the_limiting_resource(registers, threads, per_sm, limit):
    with stubbed_driver() as driver:
        driver.function_registers = registers
        assert launcher(threads).resident_programs(0) == per_sm * 108, limit


def test_shared_memory_limits_blocks_and_is_opted_in_before_the_query():
    with stubbed_driver() as driver:
        assert launcher(shared_bytes=100_000).resident_programs(0) == 108     # one 101 KB block per 164 KB SM
        names = [c[0] for c in driver.calls if c[0].startswith(("cuFuncSet", "cuOccupancy"))]
        assert names == ["cuFuncSetAttribute", "cuOccupancyMaxActiveBlocksPerMultiprocessor"]
        assert launcher(shared_bytes=40_000).resident_programs(0) == 4 * 108


def test_a_block_that_does_not_fit_at_all_is_an_error_naming_the_kernel():
    with stubbed_driver(), pytest.raises(LaunchError, match=r"kernel 'persistent': not one block fits on an SM of "
                                                          r"GPU 0 \(Stub A100, sm_80\).*use smaller tiles"):
        launcher(shared_bytes=170_000).resident_programs(0)


def test_the_driver_is_asked_once_per_device():
    with stubbed_driver() as driver:
        kernel = launcher()
        assert kernel.resident_programs(0) == kernel.resident_programs(0)
        assert driver.counts["cuOccupancyMaxActiveBlocksPerMultiprocessor"] == 1


def test_a_device_with_more_sms_has_more_resident_programs():
    with stubbed_driver() as driver:
        driver.attributes[driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT] = 132
        assert launcher().resident_programs(0) == 16 * 132


@tessera.kernel
def spin_on(flag, n):
    while tessera.atomic_add(flag, 0) < n:
        pass


class FakeDeviceArray:
    def __init__(self, n, typestr="<i4", address=0x7F0000000000):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr, "data": (address, False), "version": 3,
                                         "strides": None}


def test_a_kernel_answers_for_its_specialization_on_the_arrays_gpu(monkeypatch):
    def fake_binary(kernel, bound, target, num_warps):
        return types.SimpleNamespace(name=kernel.name, target=target, ptx=None, binary=b"cubin",
                                     metadata={"num_threads": 32 * num_warps})

    monkeypatch.setattr(gpu_launch, "binary_for", fake_binary)
    spin_on.launchers.clear()
    with stubbed_driver() as driver:
        driver.function_registers = 64
        assert spin_on.resident_programs(FakeDeviceArray(1), 4) == 8 * 108           # 4 warps, 64 registers
        assert spin_on.resident_programs(FakeDeviceArray(1), 4, num_warps=8) == 4 * 108
        assert not driver.launches()
    spin_on.launchers.clear()


def test_host_arrays_have_no_driver_to_ask():
    with pytest.raises(KernelArgumentError, match="resident_programs asks the GPU driver.*interpret\\(..., resident=\\)"):
        spin_on.resident_programs(np.zeros(1, np.int32), 4)


def test_hip_asks_the_module_occupancy_call_and_multiplies_by_the_compute_units():
    """A HIP launcher on a fake hip-python: hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(f, block, shared)
    for the loaded function, times the device's compute units (hipDeviceAttributeMultiprocessorCount)."""
    from tessera.runtime import hip

    calls = []
    fake = types.SimpleNamespace(
        hipGetDevice=lambda: (0, 0), hipSetDevice=lambda ordinal: (0,),
        hipModuleOccupancyMaxActiveBlocksPerMultiprocessor=lambda f, block, shared: calls.append((f, block, shared))
        or (0, 2))
    device = object.__new__(hip.HipDevice)
    device.ordinal, device.multiprocessors, device._hip, device.limits = 0, 304, fake, None
    function = hip.HipFunction(device, "module", "handle", "persistent")
    backend = types.SimpleNamespace(current_ordinal=lambda: 0)
    kernel = Launcher(KernelBinary("persistent", "gfx942", b"hsaco", num_threads=256, shared_bytes=1024), TYPES,
                      backend=backend)
    kernel._functions[0] = function
    assert kernel.resident_programs() == 2 * 304
    assert calls == [("handle", 256, 1024)]
