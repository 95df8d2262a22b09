"""Pointer types as compile-time values, for pointers read from memory.

    a_ptr = tessera.load(a_ptrs + group).to(tessera.pointer_type(tessera.f16))   # an i64 address -> ptr<f16>
    a = tessera.view(a_ptr, (M, K))

A grouped GEMM over separate allocations passes arrays of addresses
(`torch.tensor([t.data_ptr() for t in ts])` on a GPU, `tessera.addresses(arrays)`
on the CPU); each program loads its group's addresses and converts them to
pointers, which work like any pointer argument: views, arithmetic, loads.
"""

from __future__ import annotations

from ...ir.dtypes import DType
from ...ir.types import PointerType


def pointer_type(dtype: DType) -> PointerType:
    """The type of pointers to `dtype` elements in global memory, for `x.to(tessera.pointer_type(dtype))`."""
    if not isinstance(dtype, DType):
        raise TypeError(f"pointer_type takes a tessera dtype such as tessera.f16, got {dtype!r}")
    return PointerType(dtype)


pointer_type.__tessera_constexpr__ = True      # kernels call it while tracing, on compile-time arguments
