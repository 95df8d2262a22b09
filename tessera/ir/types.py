"""Types of IR values: scalars, pointers, tiles and tensor views.

Every SSA value has exactly one of these types. They are immutable and
hashable, compare by value, and print in the IR's textual form:

    f32                 a scalar
    ptr<f16>            a pointer to global memory holding f16 elements
    ptr<f16, shared>    a pointer into shared memory
    tile<64x32xbf16>    a 64x32 tile of bf16 values
    tile<128xptr<f32>>  a tile of pointers (one per lane)
    view<f32, 2>        a rank-2 tensor view: base pointer, shape and strides
    smem<2x64x32xf16>   a shared-memory buffer of one program (`tessera.shared`)
    regs<8xf32>         thread IR: the 8 registers one thread holds of a tile
    tensormap           a TMA tensor map passed by value (kernel parameters only)

Tile shapes are static; the element of a tile is a scalar dtype or a pointer.
In thread IR (after lowering), every value is per thread: a scalar is one
register, and a tile becomes `regs<N x T>`, the N elements the thread holds
under the tile's layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .dtypes import DType

ADDRESS_SPACES = ("global", "shared")


class Type:
    """Base class of all IR types."""


@dataclass(frozen=True)
class ScalarType(Type):
    """A single value of a data type."""

    dtype: DType

    def __str__(self) -> str:
        return self.dtype.name


@dataclass(frozen=True)
class PointerType(Type):
    """An address of an element of `pointee` in `address_space` memory."""

    pointee: DType
    address_space: str = "global"

    __tessera_constexpr__ = True    # kernels use pointer types as compile-time values (`x.to(pointer_type(f16))`)

    def __post_init__(self):
        if self.address_space not in ADDRESS_SPACES:
            raise ValueError(f"unknown address space {self.address_space!r}; expected one of {ADDRESS_SPACES}")

    def __str__(self) -> str:
        if self.address_space == "global":
            return f"ptr<{self.pointee.name}>"
        return f"ptr<{self.pointee.name}, {self.address_space}>"


@dataclass(frozen=True)
class TileType(Type):
    """A statically shaped block of scalars or pointers, one per lane."""

    element: ScalarType | PointerType
    shape: tuple[int, ...]

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        return f"tile<{dims}{self.element}>"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ViewType(Type):
    """A strided tensor in global memory; block loads/stores through it are bounds-checked."""

    dtype: DType
    rank: int

    def __str__(self) -> str:
        return f"view<{self.dtype.name}, {self.rank}>"


@dataclass(frozen=True)
class SharedType(Type):
    """A statically shaped buffer of `dtype` elements in the shared memory of one program (tile IR).

    Made by `smem_alloc`; `smem_slot` selects a sub-buffer along the leading
    dim. Its elements are read and written whole-tile (`smem_load`,
    `smem_store`, `smem_async_copy`), never through pointers, so the
    lowering may lay it out (swizzle it) as it likes.
    """

    dtype: DType
    shape: tuple[int, ...]

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        return f"smem<{dims}{self.dtype.name}>"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class RegsType(Type):
    """Thread IR: the `count` registers of `element` type one thread holds of a tile."""

    element: ScalarType | PointerType
    count: int

    def __str__(self) -> str:
        return f"regs<{self.count}x{self.element}>"

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.count,)

    @property
    def numel(self) -> int:
        return self.count


@dataclass(frozen=True)
class TensorMapType(Type):
    """A TMA tensor map (the driver's 128-byte CUtensorMap) passed *by value* as a kernel parameter.

    Only kernel parameters have this type (the verifier rejects it anywhere else): the map lives in the
    kernel's parameter space as a grid constant, and `tma_load` names it directly, so no thread copies it.
    """

    def __str__(self) -> str:
        return "tensormap"


# ---------------------------------------------------------------------------
# Small queries used by type rules, the frontend and the interpreter.

def shape_of(t: Type) -> tuple[int, ...]:
    """Tile shape (registers: (count,)), or () for scalars and pointers."""
    return t.shape if isinstance(t, (TileType, RegsType)) else ()


def element_of(t: Type) -> ScalarType | PointerType:
    """The per-lane type: the tile's (or register array's) element, or the type itself."""
    return t.element if isinstance(t, (TileType, RegsType)) else t


def scalar_dtype(t: Type) -> DType | None:
    """The data type of a scalar or of a tile of scalars; None for pointers and views."""
    elem = element_of(t)
    return elem.dtype if isinstance(elem, ScalarType) else None


def with_element(t: Type, element: ScalarType | PointerType) -> Type:
    """`t` with its per-lane type replaced, keeping the shape."""
    if isinstance(t, RegsType):
        return RegsType(element, t.count)
    return TileType(element, t.shape) if isinstance(t, TileType) else element


def with_shape(element: ScalarType | PointerType, shape: tuple[int, ...]) -> Type:
    """A tile of `element` with `shape`, or the bare element when shape is ()."""
    return TileType(element, tuple(shape)) if shape else element
