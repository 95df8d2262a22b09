"""Kernel-argument packing: the ABI layout, exact scalar conversion, and device pointers."""

import ctypes
import math
import sys
import types

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tessera.ir import dtypes as dt
from tessera.ir.types import PointerType, ScalarType, TensorMapType, ViewType
from tessera.runtime.errors import LaunchError
from tessera.runtime import dlpack
from tessera.runtime.packing import ArgumentPacker, _bf16_bits, device_pointer, param_layout

PACKABLE = [dt.bool_, dt.i8, dt.i16, dt.i32, dt.i64, dt.u8, dt.u16, dt.u32, dt.u64,
            dt.f16, dt.bf16, dt.f32, dt.f64, dt.f8e4m3, dt.f8e5m2, dt.e8m0]
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)

# Numbers `DType.quantize` accepts: anything numpy holds in a numeric dtype.
numbers = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(width=32).map(np.float32),
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.integers(0, 255).map(np.uint8),
)


def same(actual, expected) -> bool:
    """Equal as the kernel would see them: NaN matches NaN, and the sign of zero counts."""
    if isinstance(expected, float) and math.isnan(expected):
        return isinstance(actual, float) and math.isnan(actual)
    if isinstance(expected, float):
        return actual == expected and math.copysign(1, actual) == math.copysign(1, expected)
    return actual == expected


# -- layout -------------------------------------------------------------------------------


def test_layout_of_a_mixed_signature_aligns_each_parameter_to_its_size():
    types_ = [PointerType(dt.f32), ScalarType(dt.i8), ScalarType(dt.f16), ScalarType(dt.bf16), ScalarType(dt.f64),
              ScalarType(dt.bool_), ScalarType(dt.i32), ScalarType(dt.i16), PointerType(dt.u8), ScalarType(dt.u8)]
    slots, size = param_layout(types_)
    # hand-computed: ptr@0, i8@8, (pad) f16@10, bf16@12, (pad) f64@16, bool@24, (pad) i32@28,
    # i16@32, (pad) ptr@40, u8@48 -> 49 bytes
    assert [(s.offset, s.size) for s in slots] == [(0, 8), (8, 1), (10, 2), (12, 2), (16, 8), (24, 1), (28, 4),
                                                   (32, 2), (40, 8), (48, 1)]
    assert size == 49


def test_kernel_params_point_at_each_parameter_offset():
    packer = ArgumentPacker([ScalarType(dt.i8), PointerType(dt.f32), ScalarType(dt.f16), ScalarType(dt.i64)])
    pointers = (ctypes.c_void_p * 4).from_address(packer.kernel_params)
    assert [p - packer.address for p in pointers] == [0, 8, 16, 24]
    assert packer.address % 8 == 0
    packer.pack([-1, 0xDEADBEEF, 1.5, 7])
    assert ctypes.c_int8.from_address(pointers[0]).value == -1
    assert ctypes.c_uint64.from_address(pointers[1]).value == 0xDEADBEEF
    assert ctypes.c_int64.from_address(pointers[3]).value == 7


def test_a_tensor_map_is_128_bytes_by_value_at_a_64_byte_aligned_offset():
    packer = ArgumentPacker([PointerType(dt.bf16), ScalarType(dt.i32), TensorMapType(), ScalarType(dt.i32),
                             TensorMapType()])
    assert [(s.offset, s.size) for s in packer.slots] == [(0, 8), (8, 4), (64, 128), (192, 4), (256, 128)]
    assert packer.size == 384 and packer.address % 64 == 0
    maps = [bytes(range(128)), bytes(range(128, 256))]
    packer.pack([0x1000, 7, maps[0], -1, maps[1]])
    pointers = (ctypes.c_void_p * 5).from_address(packer.kernel_params)
    assert ctypes.string_at(pointers[2], 128) == maps[0] and ctypes.string_at(pointers[4], 128) == maps[1]
    assert packer.decode() == [0x1000, 7, maps[0], -1, maps[1]]


@pytest.mark.parametrize("value", [bytes(64), bytes(129), 12345], ids=["short", "long", "int"])
def test_a_tensor_map_must_be_its_128_bytes(value):
    packer = ArgumentPacker([ScalarType(dt.i32), TensorMapType()], names=["n", "a_ptr_tma0"])
    with pytest.raises(LaunchError, match=r"argument 1 \(a_ptr_tma0\): a tensor-map parameter takes the 128 bytes"):
        packer.pack([1, value])


def test_addresses_never_move_between_launches():
    packer = ArgumentPacker([PointerType(dt.f32), ScalarType(dt.i32)])
    before = (packer.address, packer.kernel_params)
    for n in range(3):
        packer.pack([n, n])
    assert (packer.address, packer.kernel_params) == before
    assert packer.decode() == [2, 2]


def test_a_kernel_without_parameters_still_has_valid_arrays():
    packer = ArgumentPacker([])
    packer.pack([])
    assert packer.size == 0 and packer.kernel_params and packer.decode() == []


@pytest.mark.parametrize("bad, message", [
    (PointerType(dt.f32, "shared"), "global-memory pointers"),
    (ScalarType(dt.i4), "sub-byte"),
    (ViewType(dt.f32, 2), "only pointers, scalars and tensor maps"),
])
def test_parameters_without_an_abi_are_rejected(bad, message):
    with pytest.raises(LaunchError, match=message):
        ArgumentPacker([bad])


# -- scalars -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", PACKABLE, ids=lambda d: d.name)
@SETTINGS
@given(value=numbers)
def test_pack_then_decode_is_the_quantized_value(dtype, value):
    fast, exact = ArgumentPacker([ScalarType(dtype)]), ArgumentPacker([ScalarType(dtype)])
    fast.pack([value])
    assert same(fast.decode()[0], dtype.quantize(value).item())
    # the one-struct fast path and the per-value `encode` path write the same bytes
    exact._pack_exactly([value])
    if dtype.is_float and math.isnan(exact.decode()[0]):
        assert math.isnan(fast.decode()[0])      # NaN payloads may differ; the kernel sees NaN either way
    else:
        assert fast.raw_bytes() == exact.raw_bytes()


@SETTINGS
@given(st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                 st.floats(min_value=-1e-38, max_value=1e-38),          # bf16 subnormals and underflow
                 st.floats(min_value=3.3e38, max_value=3.5e38)))        # around bf16's largest value
def test_bf16_fast_conversion_rounds_like_the_dtype(x):
    assert _bf16_bits(x) == int(dt.bf16.encode(x))


def test_wrapping_and_rounding_examples():
    packer = ArgumentPacker([ScalarType(dt.i8), ScalarType(dt.u16), ScalarType(dt.i32), ScalarType(dt.f16),
                             ScalarType(dt.f32), ScalarType(dt.bf16), ScalarType(dt.bool_), ScalarType(dt.u64)])
    packer.pack([200, -1, 2**31, 1e6, 2**60 + 2**36 + 1, 1.0 + 2**-8 + 2**-30, 2, -1])
    i8, u16, i32, f16, f32, bf16, flag, u64 = packer.decode()
    assert (i8, u16, i32) == (-56, 65535, -(2**31))         # ints wrap
    assert f16 == math.inf                                  # overflow to inf
    assert f32 == float(2**60 + 2**37)                      # rounded once from the exact int (not via double)
    assert bf16 == 1.0 + 2**-7                              # above the tie: rounds up
    assert flag is True and u64 == 2**64 - 1


def test_float_to_int_truncates_and_saturates():
    packer = ArgumentPacker([ScalarType(dt.i32), ScalarType(dt.u8), ScalarType(dt.i16)])
    packer.pack([-2.7, 300.0, math.nan])
    assert packer.decode() == [-2, 255, 0]


def test_pointers_round_trip_as_addresses():
    packer = ArgumentPacker([PointerType(dt.f32), PointerType(dt.i8)])
    packer.pack([2**64 - 1, None])
    assert packer.decode() == [2**64 - 1, 0]


@SETTINGS
@given(st.integers(0, 2**64 - 1), st.integers(-(2**31), 2**31 - 1))
def test_pointer_and_int_round_trip(address, n):
    packer = ArgumentPacker([PointerType(dt.f16), ScalarType(dt.i32)])
    packer.pack([address, n])
    assert packer.decode() == [address, n]


@pytest.mark.parametrize("values, message", [
    ([1], r"takes 2 runtime arguments \(x, n\), got 1"),
    ([1, 2, 3], "got 3"),
    ([-5, 1], r"argument 0 \(x\).*outside \[0, 2\*\*64\)"),
    ([1.5, 1], r"argument 0 \(x\).*device address"),
    ([1, "seven"], r"argument 1 \(n\): cannot pass 'seven' as a i32"),
    ([1, np.zeros(3)], r"argument 1 \(n\).*array of shape"),
])
def test_bad_values_name_the_argument(values, message):
    packer = ArgumentPacker([PointerType(dt.f32), ScalarType(dt.i32)], names=["x", "n"])
    with pytest.raises(LaunchError, match=message):
        packer.pack(values)


# -- device pointers -------------------------------------------------------------------------


class FakeDeviceArray:
    """A GPU array as CuPy/Numba present it: __cuda_array_interface__ (and optionally __dlpack_device__)."""

    def __init__(self, address, device=None):
        self.__cuda_array_interface__ = {"data": (address, False), "shape": (4,), "typestr": "<f4", "version": 3}
        if device is not None:
            self.__dlpack_device__ = lambda: (2, device)   # kDLCUDA


def test_device_pointer_reads_the_cuda_array_interface():
    assert device_pointer(FakeDeviceArray(0x7F0000001000)) == 0x7F0000001000
    assert device_pointer(FakeDeviceArray(0x1000, device=0), device=0) == 0x1000


def test_device_pointer_rejects_arrays_on_another_gpu():
    with pytest.raises(LaunchError, match=r"on GPU 1 but the launch runs on GPU 0.*to\('cuda:0'\)"):
        device_pointer(FakeDeviceArray(0x1000, device=1), device=0)


def test_numpy_arrays_are_cpu_memory():
    with pytest.raises(LaunchError, match="numpy array \\(CPU memory\\).*CPU interpreter"):
        device_pointer(np.zeros(4, np.float32))


def test_host_dlpack_arrays_are_rejected():
    class HostArray:
        def __dlpack__(self, stream=None):
            raise AssertionError("must not be exported")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(LaunchError, match="CPU memory"):
        device_pointer(HostArray())


def test_unknown_objects_are_rejected_with_what_to_pass():
    with pytest.raises(LaunchError, match="cannot pass a list.*torch CUDA tensor.*__cuda_array_interface__"):
        device_pointer([1, 2, 3])


def test_dlpack_capsules_are_read_without_consuming_the_array():
    a = np.arange(8, dtype=np.float32)
    assert dlpack.read(a).address == a.ctypes.data
    assert dlpack.read(a[3:]).address == a[3:].ctypes.data
    assert a.sum() == 28  # still alive and intact


@pytest.fixture
def fake_torch(monkeypatch):
    """A stand-in `torch` module (torch itself is optional) with CPU and CUDA tensors."""
    torch = types.ModuleType("torch")

    class Device:
        def __init__(self, type_, index=None):
            self.type, self.index = type_, index

        def __str__(self):
            return self.type if self.index is None else f"{self.type}:{self.index}"

    class Tensor:
        def __init__(self, device, address=0x5000):
            self.device, self._address = device, address

        def data_ptr(self):
            return self._address

    torch.Tensor, torch.Device = Tensor, Device
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


def test_cpu_tensors_say_to_move_them(fake_torch):
    with pytest.raises(LaunchError, match=r"CPU tensor was passed to a GPU launch; move it with \.cuda\(\)"):
        device_pointer(fake_torch.Tensor(fake_torch.Device("cpu")))


def test_cuda_tensors_give_their_data_pointer_and_device(fake_torch):
    x = fake_torch.Tensor(fake_torch.Device("cuda", 1), address=0xABC000)
    assert device_pointer(x, device=1) == 0xABC000
    with pytest.raises(LaunchError, match="on GPU 1 but the launch runs on GPU 0"):
        device_pointer(x, device=0)
