"""Tensor maps for TMA loads on the host: describe a tensor, encode the 128-byte `CUtensorMap`.

    desc = TensorMapDescription.for_array(x, box_shape=(64, 64), swizzle="128B")
    run_threads(kernel, [desc, out], grid=...)          # the SIMT simulator takes the description
    blob = encode_tensor_map(desc)                      # on a CUDA machine: the map's 128 bytes

The description and its checks live in `tessera.ir.tensor_map` (the
compiler, simulator and runtime share them); this module adds the driver
call. `encode_tensor_map` imports the driver lazily and raises LaunchError
without one. A kernel takes each map by value (a `tensormap` parameter:
the 128 bytes go into the launch's parameter buffer, `packing.py`).

Kernels whose pipelined loads the compiler turned into TMA loads carry one
`TensorMapRecipe` per hidden map parameter; `KernelTensorMaps` builds those
maps from a launch's arguments, caching the encoded bytes per (pointer,
dims, strides, box, swizzle), so a warm launch with the same tensors pays
a dict lookup per map.
"""

from __future__ import annotations

from tessera.ir import dtypes as dt
import operator
from typing import Callable, Sequence

from tessera.ir.tensor_map import SWIZZLES, TensorMapDescription, TensorMapError, TensorMapRecipe, validate

from .errors import LaunchError

__all__ = ["TensorMapDescription", "TensorMapError", "encode_tensor_map", "driver_data_type", "TENSOR_MAP_BYTES",
           "KernelTensorMaps"]

TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64

# Tessera dtype -> CUtensorMapDataType name; 8-bit floats travel as bytes.
_DATA_TYPES = {
    dt.u8: "UINT8", dt.i8: "UINT8", dt.u16: "UINT16", dt.i16: "UINT16", dt.u32: "UINT32", dt.i32: "INT32",
    dt.u64: "UINT64", dt.i64: "INT64", dt.f16: "FLOAT16", dt.bf16: "BFLOAT16", dt.f32: "FLOAT32", dt.f64: "FLOAT64",
}


def driver_data_type(dtype: dt.DType) -> str:
    """The `CU_TENSOR_MAP_DATA_TYPE_*` suffix for `dtype` (fp8 as UINT8)."""
    if dtype.bits == 8 and dtype.is_float:
        return "UINT8"
    try:
        return _DATA_TYPES[dtype]
    except KeyError:
        raise TensorMapError(f"tensor map: no TMA data type for {dtype.name}") from None


def encode_tensor_map(desc: TensorMapDescription) -> bytes:
    """The 128 bytes of the `CUtensorMap` the driver encodes for `desc` (cuTensorMapEncodeTiled)."""
    validate(desc)
    from .cuda import _check, _driver   # lazy: no driver, no import of cuda-python

    driver = _driver()
    inner_first = lambda values: list(reversed(values))   # noqa: E731  (the driver lists dimension 0 innermost)
    data_type = getattr(driver.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{driver_data_type(desc.dtype)}")
    swizzle = getattr(driver.CUtensorMapSwizzle,
                      "CU_TENSOR_MAP_SWIZZLE_NONE" if SWIZZLES[desc.swizzle] == 0
                      else f"CU_TENSOR_MAP_SWIZZLE_{desc.swizzle}")
    # cuda-bindings 13.0 takes only its own integer types here (13.4 also takes ints): wrap them all
    u32 = lambda values: [driver.cuuint32_t(int(v)) for v in values]   # noqa: E731
    u64 = lambda values: [driver.cuuint64_t(int(v)) for v in values]   # noqa: E731
    result = driver.cuTensorMapEncodeTiled(
        data_type, driver.cuuint32_t(desc.rank), desc.global_address,
        u64(inner_first(desc.shape)),
        u64(inner_first(desc.strides[:-1])),       # rank - 1 strides, dimension 0's is the element size
        u32(inner_first(desc.box_shape)),
        u32([1] * desc.rank),                      # element strides
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzle,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    tensor_map = _check(result, "cuTensorMapEncodeTiled")
    blob = _map_bytes(tensor_map)
    if len(blob) != TENSOR_MAP_BYTES:
        raise LaunchError(f"cuTensorMapEncodeTiled returned {len(blob)} bytes; expected {TENSOR_MAP_BYTES}")
    return blob


def _map_bytes(tensor_map) -> bytes:
    """The raw bytes of a cuda-python `CUtensorMap` (its `opaque` field: 16 x uint64)."""
    words = tensor_map.opaque
    return b"".join(int(w).to_bytes(8, "little") for w in words)


class KernelTensorMaps:
    """The hidden tensor-map arguments of one kernel, built from its recipes and each launch's arguments.

    `names[i]` names parameter i (for errors); `complete(values)` takes the kernel's own arguments (device
    addresses for pointers, numbers for scalars) and returns the full argument list, each map's 128 bytes at
    its parameter's position. `encode` is the encoder (the driver's, by default). A recipe's map depends only
    on the pointer and the arguments its sizes and strides name (its box and swizzle are fixed), so those
    values are the cache key: a warm launch pays one tuple and one dict lookup per map."""

    CAPACITY = 1024                     # encoded maps kept per recipe; the cache starts over when full

    def __init__(self, recipes: Sequence[TensorMapRecipe], names: Sequence[str],
                 encode: Callable[[TensorMapDescription], bytes] = encode_tensor_map):
        self.recipes = tuple(sorted(recipes, key=lambda r: r.param))
        self.names = list(names)
        self.encode = encode
        self._plans = []
        for recipe in self.recipes:
            used = sorted({e.param for e in (*recipe.shape, *recipe.strides) if e.param is not None})
            self._plans.append((recipe, operator.itemgetter(recipe.pointer, *used), {}))

    def __len__(self) -> int:
        return len(self.recipes)

    def complete(self, values: Sequence) -> list:
        values = list(values)
        for recipe, key_of, cache in self._plans:
            key = key_of(values)
            blob = cache.get(key)
            if blob is None:
                blob = self._encode(recipe, values, key, cache)
            values.insert(recipe.param, blob)
        return values

    def _encode(self, recipe: TensorMapRecipe, values: list, key: tuple, cache: dict) -> bytes:
        try:
            blob = self.encode(recipe.describe(values, values[recipe.pointer] or 0))
        except (TensorMapError, LaunchError) as exc:
            name = self.names[recipe.pointer] if recipe.pointer < len(self.names) else ""
            raise LaunchError(f"argument {recipe.pointer} ({name}): the TMA tensor map the kernel reads it through "
                              f"cannot be encoded: {getattr(exc, 'message', exc)}; pass a tensor whose base is "
                              f"16-byte aligned and whose row strides are multiples of 16 bytes below 2**40, or "
                              f"compile for a target without TMA") from None
        if len(cache) >= self.CAPACITY:
            cache.clear()
        cache[key] = blob
        return blob
