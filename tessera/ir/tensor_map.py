"""What a TMA tensor map describes: the global tensor, the box one `tma_load` copies, the swizzle.

    desc = TensorMapDescription.for_array(a, box_shape=(64, 64), dtype=dt.bf16, swizzle="128B")

On a GPU the description is encoded into the driver's opaque 128-byte
`CUtensorMap` (`tessera.runtime.tensor_map.encode_tensor_map`); the SIMT
simulator takes the description itself as the argument of a tensor-map
parameter and copies boxes out of `source`, the array it describes. This
module is the contract both follow, so it holds the checks the CUDA driver
makes in `cuTensorMapEncodeTiled` (so that a bad map fails here, with a
message, and not as CUDA_ERROR_INVALID_VALUE) and the swizzle function.

Conventions: dimensions are listed outermost first, as numpy lists them
(`shape`, byte `strides`, `box_shape`); the driver wants them innermost
first, which the encoder handles. The innermost dimension must be
contiguous (stride = element size). Element strides are 1, interleave is
none, and out-of-bounds elements are filled with zeros.

Swizzles: with `"32B"`, `"64B"` or `"128B"` the box lands in shared memory
with each 16-byte chunk of a row moved: byte address bits [4, 4+b) are
XORed with bits [7, 7+b) (b = 1, 2, 3), the pattern CUTLASS calls
`Swizzle<b, 4, 3>`. The destination must be aligned to the pattern's
period (256, 512, 1024 bytes) and a box row may not exceed the span
(32, 64, 128 bytes); without a swizzle the destination needs 128 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import dtypes as dt

SWIZZLES = {"none": 0, "32B": 1, "64B": 2, "128B": 3}   # name -> b, the number of XORed bits
SWIZZLE_SPAN = {"none": None, "32B": 32, "64B": 64, "128B": 128}
MAX_RANK = 5
MAX_BOX_DIM = 256
MAX_GLOBAL_DIM = 2 ** 32
MAX_GLOBAL_STRIDE = 2 ** 40
GLOBAL_ALIGN = 16


class TensorMapError(ValueError):
    """A tensor-map description the hardware cannot use; the message says which field and why."""


@dataclass(frozen=True)
class TensorMapDescription:
    """A rank-1..5 tiled tensor map: the tensor at `global_address` and the box a TMA load copies."""

    global_address: int
    dtype: dt.DType
    shape: tuple[int, ...]                 # elements per dimension, outermost first
    strides: tuple[int, ...]               # bytes per step of each dimension, outermost first
    box_shape: tuple[int, ...]             # elements of one box per dimension, outermost first
    swizzle: str = "none"
    source: Any = field(default=None, compare=False, repr=False)   # the described array (the simulator reads it)
    # the simulator: the argument's own bytes where `source` is a zero-padded copy of them (a map whose batch and
    # head dims are unbounded reaches past the array); a tma_store writes its elements through to them
    writeback: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))
        object.__setattr__(self, "box_shape", tuple(int(b) for b in self.box_shape))
        validate(self)

    @classmethod
    def for_array(cls, array: Any, box_shape: tuple[int, ...], *, dtype: dt.DType | None = None,
                  swizzle: str = "none") -> "TensorMapDescription":
        """The map of a numpy array (CPU: for the simulator) or of anything with `__cuda_array_interface__`
        (a GPU tensor); `dtype` overrides the element type the array's own dtype implies (uint16 as bf16)."""
        if isinstance(array, np.ndarray):
            address, shape, strides, np_dtype = array.ctypes.data, array.shape, array.strides, array.dtype
        elif hasattr(array, "__cuda_array_interface__"):
            cai = array.__cuda_array_interface__
            np_dtype = np.dtype(cai["typestr"])
            address, shape = int(cai["data"][0]), tuple(cai["shape"])
            strides = cai.get("strides") or _contiguous_strides(shape, np_dtype.itemsize)
        else:
            raise TensorMapError(f"describe a numpy array or a GPU tensor (with __cuda_array_interface__), "
                                 f"got {type(array).__name__}")
        if dtype is None:
            try:
                dtype = dt.dtype_from_numpy(np_dtype)
            except ValueError as e:
                raise TensorMapError(str(e)) from None
        if dtype.is_subbyte or dtype.bits // 8 != np_dtype.itemsize:
            raise TensorMapError(f"the array holds {np_dtype.itemsize}-byte elements but dtype {dtype.name} is "
                                 f"{dtype.bits} bits; pass the array's storage type (uint16 for bf16, uint8 for fp8)")
        return cls(address, dtype, tuple(shape), tuple(strides), tuple(box_shape), swizzle, source=array)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def element_bytes(self) -> int:
        return self.dtype.bits // 8

    @property
    def box_bytes(self) -> int:
        """Bytes one box occupies in shared memory, and the transaction bytes its load completes
        (out-of-bounds elements included: they land as zeros)."""
        return int(np.prod(self.box_shape)) * self.element_bytes

    @property
    def shared_alignment(self) -> int:
        """The alignment a `tma_load` destination needs: 128 bytes, or the swizzle pattern's period."""
        span = SWIZZLE_SPAN[self.swizzle]
        return 128 if span is None else span * 8


def validate(d: TensorMapDescription) -> None:
    """Raise TensorMapError unless `cuTensorMapEncodeTiled` would accept `d` (CUDA driver API docs)."""
    def fail(message: str) -> TensorMapError:
        return TensorMapError(f"tensor map: {message}")

    if not isinstance(d.dtype, dt.DType) or d.dtype.is_subbyte or d.dtype.is_bool or d.dtype.bits > 64:
        raise fail(f"element type must be a 1-, 2-, 4- or 8-byte type, got {d.dtype}")
    rank = len(d.shape)
    if not 1 <= rank <= MAX_RANK:
        raise fail(f"rank must be 1 to {MAX_RANK}, got {rank} (shape {d.shape})")
    if len(d.strides) != rank or len(d.box_shape) != rank:
        raise fail(f"shape {d.shape}, strides {d.strides} and box_shape {d.box_shape} must have one entry per "
                   "dimension")
    if d.swizzle not in SWIZZLES:
        raise fail(f"swizzle must be one of {', '.join(SWIZZLES)}, got {d.swizzle!r}")
    if d.global_address % GLOBAL_ALIGN:
        raise fail(f"global address {d.global_address:#x} is not {GLOBAL_ALIGN}-byte aligned")
    size = d.element_bytes
    for i, extent in enumerate(d.shape):
        if not 0 < extent <= MAX_GLOBAL_DIM:
            raise fail(f"dimension {i} has extent {extent}; extents must be in [1, 2**32]")
    if d.strides[-1] != size:
        raise fail(f"the innermost dimension must be contiguous: its stride is {d.strides[-1]} bytes, the "
                   f"element size is {size}")
    for i, stride in enumerate(d.strides[:-1]):
        if stride == 0 and d.shape[i] > 1:
            raise fail(f"dimension {i} has stride 0 (a broadcast: every index reads the same elements), which TMA "
                       f"cannot read; materialize the tensor (e.g. .contiguous()) or compile for a target "
                       f"without TMA")
        if stride <= 0 or stride % GLOBAL_ALIGN or stride >= MAX_GLOBAL_STRIDE:
            raise fail(f"stride of dimension {i} is {stride} bytes; outer strides must be positive multiples of "
                       f"{GLOBAL_ALIGN} below 2**40 (pad the rows)")
    for i, box in enumerate(d.box_shape):
        if not 0 < box <= MAX_BOX_DIM:
            raise fail(f"box dimension {i} is {box}; box dimensions must be in [1, {MAX_BOX_DIM}]")
    row = d.box_shape[-1] * size
    if row % 16:
        raise fail(f"a box row is {row} bytes ({d.box_shape[-1]} x {d.dtype.name}); it must be a multiple of 16")
    span = SWIZZLE_SPAN[d.swizzle]
    if span is not None and row > span:
        raise fail(f"a box row is {row} bytes but the {d.swizzle} swizzle spans {span}: use a wider swizzle or a "
                   f"box of at most {span // size} elements in the innermost dimension")


def swizzle_offsets(byte_offsets: np.ndarray, swizzle: str) -> np.ndarray:
    """Where bytes at `byte_offsets` (from a destination aligned to the pattern's period) land under `swizzle`."""
    bits = SWIZZLES[swizzle]
    if not bits:
        return byte_offsets
    mask = (1 << bits) - 1
    return byte_offsets ^ (((byte_offsets >> 7) & mask) << 4)


def _contiguous_strides(shape, itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


# ---------------------------------------------------------------------------
# Recipes: how a launcher builds the map of a compiler-added `tensormap` parameter


# The extent of a map dimension the kernel does not bound: one its view's base pointer is offset along (a
# per-program batch or head index times a stride argument). Every coordinate a tma_load can give (an i32) that
# points into the address space is inside it, so the map reads exactly what the pointer arithmetic would.
# `describe` cuts it to the coordinates below ADDRESS_SPACE bytes (so no map claims a span wider than a GPU can
# address); the SIMT simulator narrows it to the array it is given (`tessera.backends.simt.mbarrier`).
UNBOUNDED = 2 ** 31 - 1
ADDRESS_SPACE = 2 ** 49         # bytes a GPU addresses (49-bit virtual addresses from Pascal through Hopper)


@dataclass(frozen=True)
class Extent:
    """A size or stride the launch decides: `scale * args[param]`, or the constant `scale` when `param` is None."""

    param: int | None
    scale: int = 1

    def value(self, args) -> int:
        return self.scale if self.param is None else self.scale * int(args[self.param])

    def text(self, names) -> str:
        if self.param is None:
            return str(self.scale)
        return names[self.param] if self.scale == 1 else f"{self.scale}*{names[self.param]}"


@dataclass(frozen=True)
class TensorMapRecipe:
    """The tensor map of hidden parameter `param`: the tensor at pointer parameter `pointer` with `shape` and
    element `strides` (outermost first, the innermost stride 1) taken from the launch arguments, the box one
    `tma_load` copies, and the swizzle it lands with. Out-of-bounds elements are filled with zeros.

    The compiler records one per hidden parameter (`KERNEL_ATTR` of the thread-IR function, and the compiled
    kernel's metadata); the GPU launcher and the SIMT simulator both build their maps with `describe`."""

    param: int
    pointer: int
    dtype: dt.DType
    shape: tuple[Extent, ...]
    strides: tuple[Extent, ...]
    box_shape: tuple[int, ...]
    swizzle: str = "none"

    def is_empty(self, args) -> bool:
        """Whether the tensor has no elements for these arguments (a map cannot say so: see `describe`)."""
        return any(e.value(args) <= 0 for e in self.shape)

    def describe(self, args, address: int, source: Any = None) -> TensorMapDescription:
        """The description for launch arguments `args` (indexed like the kernel's parameters), with the
        pointer argument at `address`; raises TensorMapError when the driver could not encode it.

        A map's extents are at least 1, so an empty tensor (`is_empty`) is described with its zero extents
        raised to 1 (and zero outer strides to 16 bytes): the map stays encodable for launches that never
        load from it (an empty loop, an empty grid). A kernel that did load a box of it would read that one
        element instead of zeros."""
        size = self.dtype.bits // 8
        shape = tuple(e.value(args) for e in self.shape)
        strides = tuple(e.value(args) * size for e in self.strides)
        shape = tuple(min(n, max(1, ADDRESS_SPACE // st)) if e == Extent(None, UNBOUNDED) and st > 0 else n
                      for n, st, e in zip(shape, strides, self.shape))
        if self.is_empty(args):
            shape = tuple(max(1, n) for n in shape)
            strides = tuple(max(GLOBAL_ALIGN, st) for st in strides[:-1]) + strides[-1:]
        return TensorMapDescription(address, self.dtype, shape, strides, self.box_shape, self.swizzle,
                                    source=source)

    def to_attr(self) -> tuple:
        """The recipe as an IR attribute value (nested lists of ints and strings; -1 marks a constant)."""
        def extents(es):
            return tuple((-1 if e.param is None else e.param, e.scale) for e in es)
        return (self.param, self.pointer, self.dtype.name, extents(self.shape), extents(self.strides),
                self.box_shape, self.swizzle)

    @classmethod
    def from_attr(cls, attr) -> "TensorMapRecipe":
        param, pointer, dtype, shape, strides, box, swizzle = attr

        def extents(es):
            return tuple(Extent(None if p == -1 else int(p), int(s)) for p, s in es)
        return cls(int(param), int(pointer), dt.dtype_from_name(dtype), extents(shape), extents(strides),
                   tuple(int(b) for b in box), str(swizzle))

    def to_json(self, names) -> dict:
        """For metadata and manifests: parameters by position and name (`names[i]` is parameter i), sizes
        and strides (in elements) as text: a parameter name, a number, or "<number>*<name>"."""
        return {"param": self.param, "name": names[self.param], "pointer": names[self.pointer],
                "dtype": self.dtype.name, "shape": [e.text(names) for e in self.shape],
                "strides": [e.text(names) for e in self.strides], "box": list(self.box_shape),
                "swizzle": self.swizzle, "oob_fill": "zero"}

    @classmethod
    def from_json(cls, d: dict, names) -> "TensorMapRecipe":
        """The recipe `to_json` wrote, for a kernel whose parameter i is `names[i]`."""
        index = {name: i for i, name in enumerate(names)}

        def extent(text: str) -> Extent:
            scale, _, name = str(text).rpartition("*")
            if name.lstrip("-").isdigit():
                return Extent(None, int(name))
            return Extent(index[name], int(scale) if scale else 1)
        return cls(int(d["param"]), index[d["pointer"]], dt.dtype_from_name(d["dtype"]),
                   tuple(extent(t) for t in d["shape"]), tuple(extent(t) for t in d["strides"]),
                   tuple(int(b) for b in d["box"]), d["swizzle"])


KERNEL_ATTR = "tensor_maps"     # the thread-IR function attribute holding the recipes (`to_attr` form)


def kernel_recipes(attrs: dict) -> tuple[TensorMapRecipe, ...]:
    """The tensor-map recipes of a kernel with function attributes `attrs` (none: an empty tuple)."""
    return tuple(TensorMapRecipe.from_attr(a) for a in attrs.get(KERNEL_ATTR, ()))
