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
maps from a launch's arguments and writes them into the launch's prepared
parameter buffer, re-encoding only when a map's (pointer, dims, strides)
change (its box, dtype and swizzle are the recipe's), so a warm launch with
the same tensors compares one small tuple per map and writes nothing. With
$TESSERA_TMA_ADDRESS_PATCH=1 a tensor at a new address gets its map patched
from the driver's map of the same description (`tensor_map_patch.py`)
rather than encoded again.
"""

from __future__ import annotations

import ctypes
import dataclasses
import operator
from typing import Any, Callable, Sequence

from tessera.ir import dtypes as dt
from tessera.ir.tensor_map import (GLOBAL_ALIGN, SWIZZLES, TensorMapDescription, TensorMapError, TensorMapRecipe,
                                   validate)

from . import tensor_map_patch
from .errors import LaunchError
from .packing import _Inexact as Inexact

__all__ = ["TensorMapDescription", "TensorMapError", "encode_tensor_map", "prepare_encoding", "driver_data_type",
           "TENSOR_MAP_BYTES", "KernelTensorMaps"]

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
    return prepare_encoding(desc)(desc.global_address)


def prepare_encoding(desc: TensorMapDescription) -> Callable[[int], bytes]:
    """`encode(address)`: the map of `desc` with its tensor at `address`, each call one driver call.

    Everything but the address is validated and converted to the bindings' types here, once: a launch whose
    output tensor is new each call (a fresh `torch.empty`) re-encodes only its map's address, for about a
    microsecond of Python rather than the ~20 a description, its checks and the conversions cost."""
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
    arguments = (
        u64(inner_first(desc.shape)),
        u64(inner_first(desc.strides[:-1])),       # rank - 1 strides, dimension 0's is the element size
        u32(inner_first(desc.box_shape)),
        u32([1] * desc.rank),                      # element strides
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzle,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    rank, call = driver.cuuint32_t(desc.rank), driver.cuTensorMapEncodeTiled

    def encode(address: int) -> bytes:
        _check_aligned(address)
        result = call(data_type, rank, address, *arguments)
        if int(result[0]):
            _check(result, "cuTensorMapEncodeTiled")        # raises the driver's error
        blob = _map_bytes(result[1])
        if len(blob) != TENSOR_MAP_BYTES:
            raise LaunchError(f"cuTensorMapEncodeTiled returned {len(blob)} bytes; expected {TENSOR_MAP_BYTES}")
        return blob
    if tensor_map_patch.enabled():      # new addresses patched into a learned map, not encoded (off by default)
        patcher = tensor_map_patch.AddressPatcher(encode, f"tensor map of a {desc.dtype.name} {desc.shape} tensor")

        def patched(address: int) -> bytes:
            _check_aligned(address)
            return patcher(address)
        patched.patcher = patcher
        return patched
    return encode


def _check_aligned(address: int) -> None:
    """The one check of a map's description that depends on its address (encoded or patched alike)."""
    if address % GLOBAL_ALIGN:
        raise TensorMapError(f"tensor map: global address {address:#x} is not {GLOBAL_ALIGN}-byte aligned")


def _map_bytes(tensor_map) -> bytes:
    """The raw bytes of a cuda-python `CUtensorMap`: read at its address (its `opaque` field, 16 x uint64, as
    a fallback for bindings without `getPtr`)."""
    get_pointer = getattr(tensor_map, "getPtr", None)
    if get_pointer is not None:
        return ctypes.string_at(get_pointer(), TENSOR_MAP_BYTES)
    return b"".join(int(w).to_bytes(8, "little") for w in tensor_map.opaque)


class KernelTensorMaps:
    """The hidden tensor-map arguments of one kernel, built from its recipes and each launch's arguments.

    `names[i]` names parameter i (for errors). The maps come after the kernel's own parameters (the compiler
    appends them), so `packing(packer)` gives the launch's `pack(values)`: it packs the kernel's own arguments
    (device addresses for pointers, numbers for scalars) and writes each map's 128 bytes into the packer's
    buffer at its parameter's offset only when the map differs from the one already there. A recipe's map
    depends only on the pointer and the arguments its sizes and strides name (its box and swizzle are fixed),
    so those values are its key: a warm launch with the same tensors compares one small tuple per map and
    writes nothing; a new tensor finds its map in a cache of encoded maps, or encodes it (one driver call,
    `prepare_encoding`, whose conversions are kept per shape). `complete(values)` returns the full argument
    list instead, maps in place (for tests and backends without a prepared buffer). `encode` is the encoder of
    a whole description (the driver's, by default; tests give their own)."""

    CAPACITY = 1024                     # encoded maps (and prepared shapes) kept per recipe; starts over when full

    def __init__(self, recipes: Sequence[TensorMapRecipe], names: Sequence[str],
                 encode: Callable[[TensorMapDescription], bytes] = encode_tensor_map):
        self.recipes = tuple(sorted(recipes, key=lambda r: r.param))
        self.names = list(names)
        self.encode = encode
        self._plans = []
        for recipe in self.recipes:
            used = sorted({e.param for e in (*recipe.shape, *recipe.strides) if e.param is not None})
            key_of = operator.itemgetter(recipe.pointer, *used) if used else (
                lambda values, pointer=recipe.pointer: (values[pointer],))      # always a tuple
            self._plans.append(_MapPlan(recipe, key_of, (recipe.pointer, *used)))

    def __len__(self) -> int:
        return len(self.recipes)

    def complete(self, values: Sequence) -> list:
        values = list(values)
        for plan in self._plans:
            values.insert(plan.recipe.param, self._blob(plan, values, plan.key_of(values)))
        return values

    def packing(self, packer: Any) -> Callable[[Sequence], None] | None:
        """`pack(values)` over `packer` (an `ArgumentPacker` of the kernel's parameters, maps included) writing
        the maps in place (see the class docstring); None when the maps are not the trailing parameters."""
        own = len(packer.slots) - len(self._plans)
        if [p.recipe.param for p in self._plans] != list(range(own, len(packer.slots))):
            return None
        pack_own, view = packer.prefix_pack(own), packer.view
        steps = tuple((plan, plan.key_of, packer.slots[plan.recipe.param].offset, plan.blobs)
                      for plan in self._plans)
        written: list = [None] * len(steps)     # the key of the map each slot holds now
        blob_of = self._blob
        # every map's key at once: a warm launch with the same tensors compares one tuple, then writes nothing
        keys_of = operator.itemgetter(*(i for plan in self._plans for i in plan.indices), 0)    # always a tuple
        last = None                             # keys_of(values) of the launch the slots were written for

        def write_maps(values: Sequence, keys: tuple) -> None:
            nonlocal last
            last = None                         # a failed encode leaves the slots unknown
            for i, (plan, key_of, offset, blobs) in enumerate(steps):
                key = key_of(values)
                if key != written[i]:
                    written[i] = None
                    blob = blobs.get(key) or blob_of(plan, values, key)     # (the cache looked up inline)
                    view[offset:offset + len(blob)] = blob
                    written[i] = key
            last = keys

        checked = getattr(pack_own, "checked", None)
        if checked is not None:             # the own arguments' struct call inlined: one Python frame per launch
            pack_into, buffer, start, at, kind, exactly, fallback = checked

            def pack(values: Sequence) -> None:
                try:
                    if not isinstance(values[at], kind):
                        raise Inexact
                    pack_into(buffer, start, *values)
                except fallback:
                    exactly(values)
                keys = keys_of(values)
                if keys != last:
                    write_maps(values, keys)
            return pack

        def pack(values: Sequence) -> None:
            pack_own(values)
            keys = keys_of(values)
            if keys != last:
                write_maps(values, keys)
        return pack

    def _blob(self, plan: "_MapPlan", values: Sequence, key: tuple) -> bytes:
        blob = plan.blobs.get(key)
        if blob is not None:
            return blob
        recipe = plan.recipe
        try:
            encode = plan.by_shape.get(key[1:])
            if encode is None:
                desc = recipe.describe(values, values[recipe.pointer] or 0)
                prepare = getattr(self.encode, "prepare", None)
                encode = prepare(desc) if prepare is not None else _whole(self.encode, desc)
                if len(plan.by_shape) >= self.CAPACITY:
                    plan.by_shape.clear()
                plan.by_shape[key[1:]] = encode
            blob = encode(values[recipe.pointer] or 0)
        except (TensorMapError, LaunchError) as exc:
            name = self.names[recipe.pointer] if recipe.pointer < len(self.names) else ""
            raise LaunchError(f"argument {recipe.pointer} ({name}): the TMA tensor map the kernel reads it through "
                              f"cannot be encoded: {getattr(exc, 'message', exc)}; pass a tensor whose base is "
                              f"16-byte aligned and whose row strides are multiples of 16 bytes below 2**40, or "
                              f"compile for a target without TMA") from None
        if len(plan.blobs) >= self.CAPACITY:
            plan.blobs.clear()
        plan.blobs[key] = blob
        return blob


encode_tensor_map.prepare = prepare_encoding     # KernelTensorMaps asks the encoder for its per-shape form


class _MapPlan:
    """One recipe's keys and caches: key_of(values) = (pointer, *the extents' arguments); blobs by key, and the
    prepared per-address encoder by the key's shape part (key[1:])."""

    __slots__ = ("recipe", "key_of", "indices", "blobs", "by_shape")

    def __init__(self, recipe: TensorMapRecipe, key_of: Callable, indices: tuple[int, ...]):
        self.recipe, self.key_of, self.indices = recipe, key_of, indices    # key_of(values): values[indices]
        self.blobs: dict[tuple, bytes] = {}
        self.by_shape: dict[tuple, Callable[[int], bytes]] = {}


def _whole(encode: Callable[[TensorMapDescription], bytes], desc: TensorMapDescription) -> Callable[[int], bytes]:
    """An encoder of whole descriptions (one a test gives) as a per-address one."""
    return lambda address: encode(dataclasses.replace(desc, global_address=address))
