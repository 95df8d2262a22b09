"""Cluster launches without a GPU (`tessera/runtime/cluster_launch.py`), on the stub driver: a kernel compiled
with a cluster shape launches through cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION (and a plain
kernel through cuLaunchKernel, as before); a grid that is not a whole number of clusters, or a GPU without
clusters, is a LaunchError saying what to change."""

import numpy as np
import pytest

import tessera
from tessera.ir import dtypes as dt
from tessera.ir.types import PointerType, ScalarType
from tessera.runtime.errors import LaunchError
from tessera.runtime.launcher import KernelBinary, Launcher
from tessera.runtime.stub_driver import PRIMARY_CONTEXT, StubDriver, stubbed_driver

TYPES = [PointerType(dt.f32), ScalarType(dt.i32)]
CLUSTERED = KernelBinary("k", "sm_90a", b"cubin", num_threads=128, shared_bytes=100_000, cluster_dims=(2, 1, 1))


class DeviceArray:
    def __init__(self, address):
        self.__cuda_array_interface__ = {"data": (address, False), "shape": (4,), "typestr": "<f4", "version": 3}
        self.__dlpack_device__ = lambda: (2, 0)


@pytest.fixture
def hopper():
    with stubbed_driver(StubDriver(hopper=True)) as driver:
        driver.function_max_threads = 128
        yield driver


def test_a_clustered_kernel_launches_with_the_cluster_dimension_attribute(hopper):
    launcher = Launcher(CLUSTERED, TYPES, names=["x", "n"])
    for _ in range(2):
        launcher((8,), [DeviceArray(0x1000), 3], stream=5)
    assert hopper.counts["cuLaunchKernelEx"] == 2 and hopper.counts["cuLaunchKernel"] == 0
    _, function, grid, block, shared, stream, params, attributes, context = hopper.launches()[-1]
    assert (function[1], grid, block, shared, stream) == ("k", (8, 1, 1), (128, 1, 1), 100_000, 5)
    assert attributes == {"cluster_dims": (2, 1, 1)}
    assert params == launcher.packer.kernel_params and context == PRIMARY_CONTEXT
    # above 48 KiB of dynamic shared memory: opted in once, as on the plain path
    assert [c for c in hopper.calls if c[0] == "cuFuncSetAttribute"] == [
        ("cuFuncSetAttribute", "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 100_000)]


def test_a_grid_of_partial_clusters_is_refused_before_the_driver(hopper):
    launcher = Launcher(CLUSTERED, TYPES, names=["x", "n"])
    with pytest.raises(LaunchError, match=r"kernel 'k'.*grid \(7, 1, 1\) is not a whole number of clusters of "
                                          r"\(2, 1, 1\) programs"):
        launcher((7,), [DeviceArray(0x1000), 3])
    assert hopper.counts["cuLaunchKernelEx"] == 0


def test_a_gpu_without_clusters_is_refused():
    with stubbed_driver() as driver:           # an A100: compute capability 8.0
        launcher = Launcher(KernelBinary("k", None, None, "ptx", 128, 0, (2, 1, 1)), TYPES, names=["x", "n"])
        with pytest.raises(LaunchError, match=r"runs in clusters of \(2, 1, 1\) programs .* has no thread-block "
                                              r"clusters \(they need compute capability 9.0\+\)"):
            launcher((8,), [DeviceArray(0x1000), 3])
        assert driver.counts["cuLaunchKernelEx"] == 0


@tessera.kernel
def pair_copy(x_ptr, y_ptr, n, BLOCK: tessera.constexpr, CLUSTER: tessera.constexpr):
    tessera.cluster_dims(CLUSTER)
    i = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    tessera.store(y_ptr + i, tessera.load(x_ptr + i, mask=i < n), mask=i < n)


@pytest.mark.parametrize("cluster, entry", [(2, "cuLaunchKernelEx"), (1, "cuLaunchKernel")])
def test_a_kernel_launch_takes_the_cluster_path_only_with_a_cluster_shape(hopper, cluster, entry):
    x, y = DeviceArray(0x1000), DeviceArray(0x2000)
    pair_copy[(4,)](x, y, 512, BLOCK=128, CLUSTER=cluster)
    assert hopper.counts[entry] == 1 and hopper.counts["cuLaunchKernel"] + hopper.counts["cuLaunchKernelEx"] == 1
    compiled = pair_copy.compile(x, y, 512, BLOCK=128, CLUSTER=cluster, target="sm_90a")
    assert compiled.metadata.get("cluster_dims") == ([2, 1, 1] if cluster == 2 else None)
    assert (".reqnctapercluster 2, 1, 1" in compiled.stages["ptx"]) == (cluster == 2)


def test_the_interpreter_runs_a_clustered_kernel_on_whole_clusters_only():
    x = np.arange(512, dtype=np.float32)
    y = np.zeros_like(x)
    pair_copy[(4,)](x, y, 512, BLOCK=128, CLUSTER=2)
    np.testing.assert_array_equal(x, y)
    with pytest.raises(tessera.InterpreterError, match=r"grid \(3, 1, 1\) is not a whole number of clusters"):
        pair_copy[(3,)](x, y, 512, BLOCK=128, CLUSTER=2)


def test_cluster_dims_out_of_range_is_a_compile_error():
    with pytest.raises(tessera.CompileError, match=r"cluster_dims \(32, 1, 1\): .* at most 16 programs"):
        pair_copy[(32,)](np.zeros(4, np.float32), np.zeros(4, np.float32), 4, BLOCK=128, CLUSTER=32)


def test_a_warm_cluster_launch_makes_one_driver_call_and_finds_its_context_when_another_is_current(hopper):
    launcher = Launcher(CLUSTERED, TYPES, names=["x", "n"])
    launcher((8,), [DeviceArray(0x1000), 3])
    before = sum(hopper.counts.values())
    launcher((8,), [DeviceArray(0x1000), 3])
    assert sum(hopper.counts.values()) - before == 1                  # cuLaunchKernelEx alone
    hopper.current = 0xAA                     # another library's context: refused, then ours pushed and popped
    launcher((8,), [DeviceArray(0x1000), 3])
    assert hopper.launches()[-1][-1] == PRIMARY_CONTEXT and hopper.current == 0xAA
