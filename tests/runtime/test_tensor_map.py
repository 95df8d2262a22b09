"""Tensor-map descriptions: the fields cuTensorMapEncodeTiled constrains are checked on the host with a message
naming the field; on a CUDA machine the description encodes into the driver's 128-byte map."""

import numpy as np
import pytest

from tessera.ir import dtypes as dt
from tessera.runtime import cuda
from tessera.runtime.errors import LaunchError
from tessera.runtime.tensor_map import (
    TENSOR_MAP_BYTES, TensorMapDescription, TensorMapError, driver_data_type, encode_tensor_map,
)

ADDRESS = 0x7F00_0000_0000


def describe(**changes):
    fields = dict(global_address=ADDRESS, dtype=dt.bf16, shape=(256, 512), strides=(1024, 2), box_shape=(64, 64),
                  swizzle="128B")
    fields.update(changes)
    return TensorMapDescription(**fields)


def test_a_good_description_knows_its_box_bytes_and_shared_alignment():
    d = describe()
    assert (d.rank, d.element_bytes, d.box_bytes, d.shared_alignment) == (2, 2, 8192, 1024)
    assert describe(swizzle="none", box_shape=(8, 16)).shared_alignment == 128
    assert describe(swizzle="64B", box_shape=(8, 32)).shared_alignment == 512


def test_for_array_reads_address_shape_strides_and_keeps_the_source():
    x = np.zeros((100, 256), np.uint16)[:, :200]          # padded rows: a 512-byte stride
    d = TensorMapDescription.for_array(x, (32, 64), dtype=dt.bf16)
    assert (d.global_address, d.shape, d.strides, d.dtype) == (x.ctypes.data, (100, 200), (512, 2), dt.bf16)
    assert d.source is x


class FakeGpuTensor:
    __cuda_array_interface__ = {"data": (ADDRESS, False), "shape": (128, 64), "typestr": "<f4", "version": 3}


def test_for_array_accepts_cuda_array_interface_objects():
    d = TensorMapDescription.for_array(FakeGpuTensor(), (16, 32))
    assert (d.global_address, d.dtype, d.strides) == (ADDRESS, dt.f32, (256, 4))


@pytest.mark.parametrize("changes, message", [
    (dict(global_address=ADDRESS + 8), "global address 0x7f0000000008 is not 16-byte aligned"),
    (dict(strides=(1000, 2)), "stride of dimension 0 is 1000 bytes; outer strides must be positive multiples of 16"),
    (dict(strides=(1024, 4)), "innermost dimension must be contiguous"),
    (dict(strides=(0, 2)), r"dimension 0 has stride 0 \(a broadcast.*materialize the tensor"),
    (dict(box_shape=(512, 64)), r"box dimension 0 is 512; box dimensions must be in \[1, 256\]"),
    (dict(box_shape=(64, 0)), "box dimension 1 is 0"),
    (dict(box_shape=(64, 128)), "a box row is 256 bytes but the 128B swizzle spans 128: .* at most 64 elements"),
    (dict(box_shape=(64, 4)), "a box row is 8 bytes .* must be a multiple of 16"),
    (dict(swizzle="256B"), "swizzle must be one of none, 32B, 64B, 128B"),
    (dict(shape=(0, 512)), "dimension 0 has extent 0"),
    (dict(shape=(2,) * 6, strides=(1024,) * 5 + (2,), box_shape=(1,) * 5 + (8,)), "rank must be 1 to 5"),
    (dict(strides=(1024,)), "must have one entry per dimension"),
    (dict(dtype=dt.dtype_from_name("u4")), "element type must be a 1-, 2-, 4- or 8-byte type"),
])
def test_invalid_descriptions_name_the_field(changes, message):
    with pytest.raises(TensorMapError, match=message):
        describe(**changes)


def test_for_array_rejects_a_dtype_of_another_size():
    with pytest.raises(TensorMapError, match="2-byte elements but dtype f32 is 32 bits"):
        TensorMapDescription.for_array(np.zeros((64, 64), np.uint16), (8, 8), dtype=dt.f32)


def test_driver_data_types():
    assert [driver_data_type(t) for t in (dt.bf16, dt.f16, dt.f32, dt.i32, dt.u8)] == \
        ["BFLOAT16", "FLOAT16", "FLOAT32", "INT32", "UINT8"]
    assert driver_data_type(dt.dtype_from_name("f8e4m3")) == "UINT8"


def test_encoding_without_a_driver_is_a_launch_error(monkeypatch):
    monkeypatch.setattr(cuda, "driver_available", lambda: False)
    with pytest.raises(LaunchError, match="no NVIDIA driver found"):
        encode_tensor_map(describe())


def test_the_encode_call_passes_the_bindings_own_argument_types(monkeypatch):
    """cuda-bindings refuses plain ints for cuTensorMapEncodeTiled's cuuint32_t / cuuint64_t arguments (seen on
    an H200 with 13.0 and here with 13.4); with no driver, a call whose arguments convert fails only at loading
    libcuda, after the conversion."""
    driver = pytest.importorskip("cuda.bindings.driver")
    if cuda.driver_available():
        pytest.skip("with a driver the call succeeds; test_encode_a_real_tensor_map covers it")
    monkeypatch.setattr(cuda, "_driver", lambda: driver)
    with pytest.raises(Exception) as info:
        encode_tensor_map(describe())
    assert not isinstance(info.value, TypeError), info.value


@pytest.mark.gpu
def test_encode_a_real_tensor_map():
    torch = pytest.importorskip("torch")

    x = torch.zeros((256, 512), dtype=torch.bfloat16, device="cuda")
    d = TensorMapDescription.for_array(x, (64, 64), dtype=dt.bf16, swizzle="128B")
    blob = encode_tensor_map(d)
    assert len(blob) == TENSOR_MAP_BYTES and any(blob)


def attention_key_recipe():
    """The map the attention forward reads K (B, S, H_kv, D) through on sm_90a: leading (batch, head) dims at
    the view's base offsets, unbounded, then the view's (Sk, D); strides not in decreasing order."""
    from tessera.ir.tensor_map import UNBOUNDED, Extent, TensorMapRecipe
    # parameters: 0 k_ptr, 1 Sk, 2 stride_b, 3 stride_s, 4 stride_h
    return TensorMapRecipe(5, 0, dt.bf16, (Extent(None, UNBOUNDED), Extent(None, UNBOUNDED), Extent(1), Extent(None, 128)),
                           (Extent(2), Extent(4), Extent(3), Extent(None, 1)), (1, 1, 64, 64), "128B")


def test_an_unbounded_dim_is_cut_to_the_address_space():
    from tessera.ir.tensor_map import ADDRESS_SPACE, UNBOUNDED
    B, S, H, D = 2, 1000, 8, 128
    d = attention_key_recipe().describe([0, S, S * H * D, H * D, D], ADDRESS)
    assert d.shape == (ADDRESS_SPACE // (S * H * D * 2), UNBOUNDED, S, D)     # a head step is 256 bytes
    assert d.strides == (S * H * D * 2, D * 2, H * D * 2, 2)


@pytest.mark.gpu
def test_encode_a_map_with_unbounded_leading_dims():
    """The driver takes the attention K map: extents up to 2**31 - 1 on dims whose strides are out of order."""
    torch = pytest.importorskip("torch")
    B, S, H, D = 2, 1000, 8, 128
    k = torch.zeros((B, S, H, D), dtype=torch.bfloat16, device="cuda")
    blob = encode_tensor_map(attention_key_recipe().describe([0, S, S * H * D, H * D, D], k.data_ptr()))
    assert len(blob) == TENSOR_MAP_BYTES and any(blob)
