"""The launch path without a GPU: launch validation, architecture checks, the CUDA loader driven by a
fake driver, the launcher on a fake backend, and clear errors when no driver or hip-python is present."""

import ctypes
import subprocess
import sys
import textwrap
import time
import types
from collections import Counter
from dataclasses import replace

import pytest

from tessera.ir import dtypes as dt
from tessera.ir.tensor_map import SWIZZLES, Extent, TensorMapRecipe
from tessera.ir.types import PointerType, ScalarType, TensorMapType
from tessera.runtime import cuda, hip
from tessera.runtime.errors import LaunchError
from tessera.runtime.launcher import KernelBinary, Launcher, stream_handle
from tessera.runtime.packing import ArgumentPacker
from tessera.runtime.tensor_map import KernelTensorMaps
from tessera.runtime.stub_driver import PRIMARY_CONTEXT, StubDriver, stubbed_driver
from tessera.runtime.limits import DeviceLimits, as_dim3, validate_launch

ADD_TYPES = [PointerType(dt.f32), PointerType(dt.f32), PointerType(dt.f32), ScalarType(dt.i32)]
ADD = KernelBinary("add", "sm_80", b"cubin", num_threads=128)


class DeviceArray:
    """A GPU array as CuPy presents it: __cuda_array_interface__ plus __dlpack_device__."""

    def __init__(self, address, device=0):
        self.__cuda_array_interface__ = {"data": (address, False), "shape": (4,), "typestr": "<f4", "version": 3}
        self.__dlpack_device__ = lambda: (2, device)


class NumbaArray:
    """A GPU array as Numba presents it: __cuda_array_interface__ alone, which does not say which device."""

    def __init__(self, address):
        self.__cuda_array_interface__ = {"data": (address, False), "shape": (4,), "typestr": "<f4", "version": 3}


# -- limits ---------------------------------------------------------------------------------

LIMITS = DeviceLimits(name="GPU 0 (Test, sm_80)", max_shared_bytes=163 * 1024)


@pytest.mark.parametrize("grid, block, shared, message", [
    ((2**31, 1, 1), (128, 1, 1), 0, r"grid dimension 0 is 2147483648, above the limit of 2147483647.*fewer programs"),
    ((1, 65536, 1), (128, 1, 1), 0, r"grid dimension 1 is 65536.*put the largest grid dimension first"),
    ((1, 1, 70000), (128, 1, 1), 0, r"grid dimension 2"),
    ((1, 1, 1), (2048, 1, 1), 0, r"2048x1x1 threads exceeds .* 1024 threads per block; compile with fewer warps"),
    ((1, 1, 1), (32, 1, 128), 0, r"32x1x128 threads exceeds"),
    ((1, 1, 1), (128, 1, 1), 200 * 1024, r"needs 204800 bytes of shared memory .* at most 166912; use smaller tiles"),
])
def test_launches_beyond_the_device_limits_say_what_to_change(grid, block, shared, message):
    with pytest.raises(LaunchError, match=message):
        validate_launch(grid, block, shared, LIMITS)


def test_launches_within_the_limits_pass():
    validate_launch((2**31 - 1, 65535, 65535), (1024, 1, 1), 163 * 1024, LIMITS)


def test_block_larger_than_the_kernel_was_compiled_for():
    with pytest.raises(LaunchError, match="at most 128 threads per block"):
        validate_launch((1, 1, 1), (256, 1, 1), 0, LIMITS, kernel_max_threads=128)


@pytest.mark.parametrize("dims, expected", [(5, (5, 1, 1)), ((5,), (5, 1, 1)), ((2, 3), (2, 3, 1)),
                                            ([2, 3, 4], (2, 3, 4))])
def test_grids_become_three_dimensions(dims, expected):
    assert as_dim3(dims, "grid") == expected


@pytest.mark.parametrize("dims", [(), (1, 2, 3, 4), (-1,), (1.5,), "4", (True,)])
def test_malformed_grids_are_rejected(dims):
    with pytest.raises(LaunchError, match="grid must be 1 to 3 non-negative ints"):
        as_dim3(dims, "grid")


# -- architectures ----------------------------------------------------------------------------


@pytest.mark.parametrize("capability, target", [((8, 0), "sm_80"), ((8, 6), "sm_86"), ((8, 9), "sm_89"),
                                                ((9, 0), "sm_90a"), ((10, 0), "sm_100"), ((12, 0), "sm_120")])
def test_compute_capability_to_target(capability, target):
    assert cuda.target_name(capability) == target


@pytest.mark.parametrize("target, capability, cubin", [
    ("sm_80", (8, 0), True), ("sm_80", (8, 6), True), ("sm_80", (8, 9), True), ("sm_90a", (9, 0), True),
    ("sm_100", (10, 0), True), ("sm_80", (9, 0), False), ("sm_90", (10, 0), False),
])
def test_compatible_binaries_load(target, capability, cubin):
    cuda.check_architecture(target, capability, cubin=cubin)


@pytest.mark.parametrize("target, capability, cubin, message", [
    ("sm_90a", (8, 0), True, r"compiled for sm_90a \(sm_90a code runs only on compute capability 9.0\) but .* "
                             r"is sm_80.*target='sm_80'"),
    ("sm_90a", (10, 0), False, r"runs only on compute capability 9.0"),
    ("sm_80", (9, 0), True, r"compiled for sm_80 but .* is sm_90a"),   # cubins do not cross major versions
    ("sm_89", (8, 0), True, r"target='sm_80'"),
    ("sm_90", (8, 9), False, r"target='sm_89'"),                        # PTX only runs on newer GPUs
    ("gfx942", (9, 0), True, r"not an NVIDIA target"),
])
def test_binaries_for_another_architecture_are_refused(target, capability, cubin, message):
    with pytest.raises(LaunchError, match=message):
        cuda.check_architecture(target, capability, cubin=cubin)


def test_amd_code_objects_need_their_exact_gfx():
    hip.check_architecture("gfx942:sramecc+", "gfx942")
    with pytest.raises(LaunchError, match="compiled for gfx90a but .* is gfx942; compile it with target='gfx942'"):
        hip.check_architecture("gfx90a", "gfx942")


# -- driver errors ------------------------------------------------------------------------------


def test_driver_errors_keep_the_driver_name_and_add_a_hint():
    from cuda.bindings import driver

    err = cuda.driver_error(driver.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS, "launching kernel 'add' (cuLaunchKernel)")
    assert err.driver_error == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert "launching kernel 'add' (cuLaunchKernel) failed: CUDA_ERROR_ILLEGAL_ADDRESS" in str(err)
    assert "TESSERA_INTERPRET=1" in str(err)


# -- no driver ------------------------------------------------------------------------------------

NO_DRIVER_SCRIPT = textwrap.dedent("""
    import time
    import tessera.runtime.cuda as cuda
    cuda._LIBCUDA_NAMES = ("libcuda-that-does-not-exist.so.1",)   # as on a machine without the driver
    cuda.driver_available.cache_clear()
    start = time.perf_counter()
    assert cuda.driver_available() is False and cuda.device_count() == 0
    assert time.perf_counter() - start < 1.0
    from tessera.ir import dtypes as dt
    from tessera.ir.types import PointerType, ScalarType
    from tessera.runtime.errors import LaunchError
    from tessera.runtime.launcher import KernelBinary, Launcher

    class DeviceArray:
        def __init__(self, address):
            self.__cuda_array_interface__ = {"data": (address, False), "shape": (4,), "typestr": "<f4",
                                             "version": 3}

    launcher = Launcher(KernelBinary("add", "sm_80", b"cubin", num_threads=128),
                        [PointerType(dt.f32), ScalarType(dt.i32)])
    for attempt in (launcher, lambda *a: cuda.get_device(0)):
        try:
            attempt((4,), [DeviceArray(0x1000), 5])
        except LaunchError as exc:
            print("LaunchError:", exc)
""")


def test_without_a_driver_launching_raises_instead_of_hanging():
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", NO_DRIVER_SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("LaunchError: kernel 'add': no NVIDIA driver found")
    assert lines[1].startswith("LaunchError: no NVIDIA driver found") and "CPU interpreter" in lines[1]
    assert time.perf_counter() - start < 30


def test_driver_available_answers_quickly():
    start = time.perf_counter()
    cuda.driver_available.cache_clear()
    cuda.driver_available()
    assert time.perf_counter() - start < 1.0


# -- the CUDA loader on a fake driver ----------------------------------------------------------------


@pytest.fixture
def fake_driver():
    with stubbed_driver() as driver:
        driver.function_max_threads = 128
        yield driver


def calls_to(driver, name):
    return [c for c in driver.calls if c[0] == name]


def test_cuda_device_reads_its_identity_and_limits(fake_driver):
    device = cuda.get_device(0)
    assert (device.name, device.capability, device.target) == ("Stub A100", (8, 0), "sm_80")
    assert device.limits.max_shared_bytes == 163 * 1024 and device.limits.max_grid[1] == 65535
    assert cuda.get_device(0) is device


def test_cuda_launch_passes_the_prepared_parameters(fake_driver):
    launcher = Launcher(ADD, ADD_TYPES, names=["x", "y", "out", "n"])
    launcher((4,), [DeviceArray(0x1000), DeviceArray(0x2000), DeviceArray(0x3000), 500], stream=7)
    assert calls_to(fake_driver, "cuModuleLoadData") == [("cuModuleLoadData", b"cubin", PRIMARY_CONTEXT)]
    [launch] = fake_driver.launches()
    _, function, grid, block, shared, stream, params, extra, context = launch
    assert (function[1], grid, block, shared, stream, extra) == ("add", (4, 1, 1), (128, 1, 1), 0, 7, 0)
    assert params == launcher.packer.kernel_params and context == PRIMARY_CONTEXT
    assert launcher.packer.decode() == [0x1000, 0x2000, 0x3000, 500]


def test_a_block_running_two_programs_launches_half_the_grid_rounded_up(fake_driver):
    """AMD's wave-group ping-pong (`passes/wave_pingpong.py`) runs programs 2b and 2b + 1 in block b: the grid
    the caller gives counts programs, the launch gives the driver blocks (the stub driver stands for any)."""
    import dataclasses
    launcher = Launcher(dataclasses.replace(ADD, programs_per_block=2), ADD_TYPES, names=["x", "y", "out", "n"])
    for programs, blocks in ((4, 2), (5, 3), (1, 1)):
        launcher((programs, 3), [DeviceArray(0x1000), DeviceArray(0x2000), DeviceArray(0x3000), 500], stream=7)
        assert fake_driver.launches()[-1][2] == (blocks, 3, 1)
        # the warm entries (`dsl/launch_codegen.py`) call the prepared launch with the program grid directly
        launcher.prepared(0)(programs, 3, 1, (0x1000, 0x2000, 0x3000, 500), 7)
        assert fake_driver.launches()[-1][2] == (blocks, 3, 1)


def test_cuda_launch_restores_another_current_context(fake_driver):
    fake_driver.current = 0xAA            # e.g. torch made another device's context current
    device = cuda.get_device(0)
    function = device.get_function(device.load_module(cubin=b"cubin"), "add")
    device.launch(function, (1, 1, 1), (128, 1, 1), 0, Launcher(ADD, ADD_TYPES).packer, 0)
    assert fake_driver.launches()[-1][-1] == PRIMARY_CONTEXT and fake_driver.current == 0xAA


def test_dynamic_shared_memory_above_48_kib_is_opted_in_once(fake_driver):
    device = cuda.get_device(0)
    function = device.get_function(device.load_module(cubin=b"cubin"), "add")
    packer = Launcher(ADD, ADD_TYPES).packer
    for _ in range(2):
        device.launch(function, (1, 1, 1), (128, 1, 1), 100_000, packer, 0)
    opt_ins = calls_to(fake_driver, "cuFuncSetAttribute")
    assert opt_ins == [("cuFuncSetAttribute", "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 100_000)]
    with pytest.raises(LaunchError, match="needs 200000 bytes of shared memory"):
        device.launch(function, (1, 1, 1), (128, 1, 1), 200_000, packer, 0)


def test_ptx_is_loaded_when_there_is_no_cubin(fake_driver):
    launcher = Launcher(KernelBinary("add", "sm_80", None, ptx=".version 8.0", num_threads=128), ADD_TYPES)
    launcher((1,), [DeviceArray(1), DeviceArray(2), DeviceArray(3), 4])
    assert calls_to(fake_driver, "cuModuleLoadData")[0][1] == b".version 8.0\0"


def test_driver_failures_become_launch_errors_with_the_kernel_name(fake_driver):
    fake_driver.launch_result = fake_driver.real.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    with pytest.raises(LaunchError, match=r"kernel 'add': launching kernel 'add' \(cuLaunchKernel\) failed: "
                                          r"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES.*fewer warps"):
        Launcher(ADD, ADD_TYPES)((1,), [1, 2, 3, 4])


def test_architecture_mismatch_is_caught_before_loading(fake_driver):
    launcher = Launcher(KernelBinary("add", "sm_90a", b"cubin", num_threads=128), ADD_TYPES)
    with pytest.raises(LaunchError, match=r"kernel 'add': the kernel was compiled for sm_90a .* is sm_80"):
        launcher((1,), [1, 2, 3, 4])
    assert calls_to(fake_driver, "cuModuleLoadData") == []


def test_a_cubin_for_an_older_major_version_falls_back_to_its_ptx(fake_driver):
    A = fake_driver.CUdevice_attribute
    fake_driver.attributes[A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR] = 9    # an H100: sm_90a
    launcher = Launcher(KernelBinary("add", "sm_80", b"cubin", ptx=".target sm_80", num_threads=128), ADD_TYPES)
    launcher((1,), [1, 2, 3, 4])
    assert calls_to(fake_driver, "cuModuleLoadData")[0][1] == b".target sm_80\0"


def warm_launch_calls(driver, launch):
    """The driver calls one more launch makes, after a first one has loaded the module."""
    launch()
    before = Counter(driver.counts)
    launch()
    return driver.counts - before


def test_a_warm_launch_is_one_driver_call(fake_driver):
    launcher = Launcher(ADD, ADD_TYPES)
    arrays = [DeviceArray(0x1000), DeviceArray(0x2000), DeviceArray(0x3000)]
    assert warm_launch_calls(fake_driver, lambda: launcher((2,), [*arrays, 4])) == Counter(cuLaunchKernel=1)


def test_arrays_that_do_not_state_their_device_cost_no_query_on_a_single_gpu(fake_driver):
    launcher = Launcher(ADD, ADD_TYPES)
    arrays = [NumbaArray(0x1000 * (i + 1)) for i in range(3)]
    assert warm_launch_calls(fake_driver, lambda: launcher((2,), [*arrays, 4])) == Counter(cuLaunchKernel=1)


def test_with_several_gpus_each_launch_checks_the_current_context():
    with stubbed_driver(StubDriver(device_count=2)) as driver:
        launcher = Launcher(ADD, ADD_TYPES)
        arrays = [DeviceArray(0x1000), DeviceArray(0x2000), DeviceArray(0x3000)]
        calls = warm_launch_calls(driver, lambda: launcher((2,), [*arrays, 4]))
    assert calls == Counter(cuCtxGetCurrent=1, cuLaunchKernel=1)


def test_a_thread_without_a_current_context_gets_ours(fake_driver):
    launcher = Launcher(ADD, ADD_TYPES)
    launcher((1,), [1, 2, 3, 4])
    fake_driver.current = 0                     # a new thread: nothing current yet
    launcher((1,), [1, 2, 3, 4])
    assert [c[-1] for c in fake_driver.launches()] == [PRIMARY_CONTEXT] * 2
    assert fake_driver.current == PRIMARY_CONTEXT


def test_kernel_launch_bound_is_enforced(fake_driver):
    launcher = Launcher(KernelBinary("add", "sm_80", b"cubin", num_threads=256), ADD_TYPES)
    with pytest.raises(LaunchError, match="at most 128 threads per block"):
        launcher((1,), [1, 2, 3, 4])


# -- the launcher on a fake backend ----------------------------------------------------------------


class FakeBackend:
    """A backend module stand-in: devices that record launches."""

    def __init__(self, current=0):
        self.devices, self.current, self.loads = {}, current, []

    def get_device(self, ordinal):
        return self.devices.setdefault(ordinal, FakeDevice(self, ordinal))

    def current_ordinal(self):
        return self.current

    def pointer_device(self, address):
        return None


class FakeDevice:
    backend = "fake"

    def __init__(self, backend, ordinal):
        self.backend_, self.ordinal, self.launches = backend, ordinal, []

    def check_target(self, target, *, cubin=True):
        pass

    def load_module(self, cubin=None, ptx=None):
        self.backend_.loads.append(self.ordinal)
        return "module"

    def get_function(self, module, name):
        return types.SimpleNamespace(device=self, name=name)

    def launch(self, function, grid, block, shared_bytes, packer, stream):
        self.launches.append((grid, block, shared_bytes, stream, packer.decode()))


def test_launcher_loads_once_per_device_and_packs_each_launch():
    backend = FakeBackend()
    launcher = Launcher(ADD, ADD_TYPES, backend=backend)
    for n in (10, 20):
        launcher((2, 3), [DeviceArray(0x10), DeviceArray(0x20), DeviceArray(0x30), n])
    launcher(1, [DeviceArray(0x40, device=1), DeviceArray(0x50, device=1), 0x60, 30])
    assert backend.loads == [0, 1]
    assert backend.devices[0].launches == [((2, 3, 1), (128, 1, 1), 0, 0, [0x10, 0x20, 0x30, 10]),
                                           ((2, 3, 1), (128, 1, 1), 0, 0, [0x10, 0x20, 0x30, 20])]
    assert backend.devices[1].launches[0][-1] == [0x40, 0x50, 0x60, 30]


def test_an_empty_grid_launches_nothing():
    backend = FakeBackend()
    Launcher(ADD, ADD_TYPES, backend=backend)((0,), [1, 2, 3, 4])
    assert backend.loads == []


def test_tensors_on_different_gpus_are_refused():
    launcher = Launcher(ADD, ADD_TYPES, backend=FakeBackend(), names=["x", "y", "out", "n"])
    with pytest.raises(LaunchError, match=r"kernel 'add': argument 1 \(y\) is on GPU 1 but argument 0 \(x\) is "
                                          r"on GPU 0; put all tensors of a launch on one device"):
        launcher((1,), [DeviceArray(1, device=0), DeviceArray(2, device=1), DeviceArray(3), 4])


def test_cpu_arrays_are_refused_naming_the_argument():
    import numpy as np

    launcher = Launcher(ADD, ADD_TYPES, backend=FakeBackend(), names=["x", "y", "out", "n"])
    with pytest.raises(LaunchError, match=r"kernel 'add': argument 2 \(out\): a numpy array \(CPU memory\)"):
        launcher((1,), [DeviceArray(1), DeviceArray(2), np.zeros(4), 4])


def test_without_tensors_that_say_the_current_device_is_used():
    backend = FakeBackend(current=3)
    Launcher(ADD, ADD_TYPES, backend=backend)((1,), [1, 2, 3, 4])
    assert backend.loads == [3]


@pytest.fixture
def fake_torch(monkeypatch):
    torch = types.ModuleType("torch")

    class Tensor:
        def __init__(self, address, index):
            self.device = types.SimpleNamespace(type="cuda", index=index)
            self._address = address

        def data_ptr(self):
            return self._address

    torch.Tensor = Tensor
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda ordinal: 0x5000 + ordinal)
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


def test_torch_tensors_launch_on_torchs_current_stream(fake_torch):
    backend = FakeBackend()
    launcher = Launcher(ADD, ADD_TYPES, backend=backend)
    x = fake_torch.Tensor(0x100, index=1)
    launcher((1,), [x, x, x, 4])
    assert backend.devices[1].launches[-1][3] == 0x5001          # torch's current stream of cuda:1
    launcher((1,), [x, x, x, 4], stream=9)
    assert backend.devices[1].launches[-1][3] == 9               # an explicit stream wins
    launcher((1,), [DeviceArray(1, device=1)] * 3 + [4])
    assert backend.devices[1].launches[-1][3] == 0               # no torch tensor: the default stream


def test_stream_objects_give_their_handles():
    assert stream_handle(5) == 5
    assert stream_handle(types.SimpleNamespace(cuda_stream=0x77)) == 0x77               # torch.cuda.Stream
    assert stream_handle(types.SimpleNamespace(ptr=0x78)) == 0x78                       # cupy
    core_stream = types.SimpleNamespace(__cuda_stream__=lambda: (0, 0x79))
    assert stream_handle(core_stream) == 0x79
    from cuda.bindings import driver
    assert stream_handle(driver.CUstream(0x7A)) == 0x7A
    with pytest.raises(LaunchError, match="stream= takes an int handle"):
        stream_handle("default")


def test_compiled_kernels_are_read_by_duck_typing():
    compiled = types.SimpleNamespace(name="softmax", target="sm_90a", cubin=b"\x7fELF", stages={"ptx": "ptx"},
                                     metadata={"num_threads": 256, "shared_bytes": 1024})
    assert KernelBinary.of(compiled) == KernelBinary("softmax", "sm_90a", b"\x7fELF", "ptx", 256, 1024)
    compiled.metadata = {}
    with pytest.raises(LaunchError, match="does not say how many threads"):
        KernelBinary.of(compiled)


# -- HIP -----------------------------------------------------------------------------------------------


def test_missing_hip_python_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)            # makes `from hip import hip` fail
    monkeypatch.setattr(hip, "_devices", {})
    with pytest.raises(LaunchError, match=r"hip-python is not installed.*pip install tessera\[rocm\]"):
        hip.get_device(0)
    launcher = Launcher(KernelBinary("add", "gfx942", b"hsaco", num_threads=256), ADD_TYPES, backend="hip")
    with pytest.raises(LaunchError, match=r"kernel 'add': hip-python is not installed"):
        launcher((1,), [DeviceArray(1), DeviceArray(2), DeviceArray(3), 4])


def test_hip_extra_array_hands_over_the_packed_buffer():
    packer = Launcher(ADD, [PointerType(dt.f32), ScalarType(dt.i8), ScalarType(dt.f64)]).packer
    device = object.__new__(hip.HipDevice)
    device._extra = {}
    address = device.extra_array(packer)
    config = (ctypes.c_void_p * 5).from_address(address)
    assert [config[0], config[1], config[2], config[4]] == [hip.HIP_LAUNCH_PARAM_BUFFER_POINTER, packer.address,
                                                            hip.HIP_LAUNCH_PARAM_BUFFER_SIZE, hip.HIP_LAUNCH_PARAM_END]
    assert ctypes.c_size_t.from_address(config[3]).value == packer.size == 24
    assert device.extra_array(packer) == address          # prepared once per packer


# -- hidden tensor-map parameters ------------------------------------------------------------------

MAP_NAMES = ["a_ptr", "M", "K", "stride_am", "a_ptr_tma0"]
MAP_TYPES = [PointerType(dt.bf16), ScalarType(dt.i32), ScalarType(dt.i32), ScalarType(dt.i32), TensorMapType()]
A_MAP = TensorMapRecipe(4, 0, dt.bf16, (Extent(1), Extent(2)), (Extent(3), Extent(None, 1)), (64, 64), "128B")


def encode_on_host(desc):
    """What the driver's encoder depends on, as 128 bytes (the driver itself needs a GPU)."""
    fields = (desc.global_address, *desc.shape, *desc.strides, *desc.box_shape, SWIZZLES[desc.swizzle])
    return b"".join(int(f).to_bytes(8, "little") for f in fields).ljust(128, b"\0")


def map_launcher(backend, encoded):
    launcher = Launcher(KernelBinary("gemm", "sm_90", b"cubin", num_threads=128), MAP_TYPES, backend=backend,
                        names=MAP_NAMES, tensor_maps=[A_MAP])

    def encode(desc):
        encoded.append(desc)
        return encode_on_host(desc)
    launcher.tensor_maps.encode = encode
    return launcher


def test_a_launch_builds_each_tensor_map_from_its_recipe_packs_it_by_value_and_caches_it():
    backend, encoded = FakeBackend(), []
    launcher = map_launcher(backend, encoded)
    for _ in range(2):
        launcher((1,), [0x10000, 100, 72, 80])              # the map is built from the kernel's own arguments
    launcher((1,), [0x20000, 100, 72, 80])                  # another tensor: another map
    assert [(d.global_address, d.shape, d.strides, d.box_shape, d.swizzle) for d in encoded] == [
        (0x10000, (100, 72), (160, 2), (64, 64), "128B"), (0x20000, (100, 72), (160, 2), (64, 64), "128B")]
    first, _, last = backend.devices[0].launches
    assert first[-1] == [0x10000, 100, 72, 80, encode_on_host(encoded[0])]
    assert last[-1][-1] == encode_on_host(encoded[1])


def test_a_map_the_driver_cannot_encode_names_the_kernel_and_the_argument():
    launcher = map_launcher(FakeBackend(), [])
    with pytest.raises(LaunchError, match=r"kernel 'gemm': argument 0 \(a_ptr\): the TMA tensor map the kernel "
                                          r"reads it through cannot be encoded: .*stride of dimension 0 is "
                                          r"1099511627776 bytes"):
        launcher((1,), [0x10000, 100, 72, 2 ** 39])


def test_maps_are_written_into_the_buffer_only_when_they_change_and_prepared_once_per_shape():
    """`KernelTensorMaps.packing`: the buffer holds what `complete` + `pack` would write; an unchanged map is not
    copied again; a new pointer of a known shape reuses the shape's prepared encoder (one per shape)."""
    prepared, encoded = [], []

    def encode(desc):
        return encode_on_host(desc)

    def prepare(desc):
        prepared.append(desc.shape)
        return lambda address: encoded.append(address) or encode_on_host(replace(desc, global_address=address))
    encode.prepare = prepare
    packer = ArgumentPacker(MAP_TYPES, MAP_NAMES)
    maps = KernelTensorMaps([A_MAP], MAP_NAMES, encode=encode)
    writes = []

    class CountingView:
        """The packer's parameter bytes, recording the offset of each write (the maps are sliced in)."""

        def __init__(self, view):
            self.view = view

        def __setitem__(self, index, data):
            writes.append(index.start)
            self.view[index] = data
    packer.view = CountingView(packer.view)
    pack = maps.packing(packer)
    expected = ArgumentPacker(MAP_TYPES, MAP_NAMES)
    for values in ([0x10000, 100, 72, 80], [0x10000, 100, 72, 80], [0x20000, 100, 72, 80], [0x10000, 100, 72, 80],
                   [0x10000, 50, 72, 80]):
        pack(values)
        expected.pack(maps.complete(values))
        assert packer.raw_bytes() == expected.raw_bytes()
    assert len(writes) == 4, "the second launch, with the same tensor, writes no map"
    assert prepared == [(100, 72), (50, 72)] and encoded == [0x10000, 0x20000, 0x10000]


def test_launches_on_two_gpus_alternating_each_pass_their_own_maps():
    """The devices share the launcher's one parameter buffer, so what it holds is tracked once, not per device:
    device 0's launch after device 1's rewrites its map."""
    backend, encoded = FakeBackend(), []
    launcher = map_launcher(backend, encoded)
    for ordinal, address in ((0, 0x10000), (1, 0x20000), (0, 0x10000)):
        backend.current = ordinal
        launcher((1,), [address, 100, 72, 80])
    maps = [launches[-1][-1][-1] for launches in (backend.devices[0].launches[:1], backend.devices[1].launches,
                                                  backend.devices[0].launches[1:])]
    assert maps == [encode_on_host(encoded[0]), encode_on_host(encoded[1]), encode_on_host(encoded[0])]
