"""Pointers as numbers on the CPU: which array a byte address points into (`int_to_ptr`, `ptr_to_int`).

On a GPU a pointer is a number; here it is `Pointers(memory, offsets)`.
`ptr_to_int` gives a pointer's real address: its numpy array's data
address plus the offset in bytes. `int_to_ptr` finds the array holding an
address among those the launch can reach -- the kernel's array arguments,
and the arrays whose addresses the host took with `register` (what
`tessera.addresses(...)` does for the pointer arrays of a grouped GEMM) --
and views it as elements of the pointer's dtype. So every dereference is
bounds-checked against a real array: an address in none of them becomes a
pointer into an empty memory named after the address, which fails (naming
it) when a lane that is not masked off reads or writes through it.

A tile of pointers points into one array (the interpreter's `Pointers`
holds one memory): lanes pointing into two different arrays are an error
saying so; lanes outside every array are allowed, for masked-off lanes.
"""

from __future__ import annotations

import weakref

import numpy as np

from tessera.ir.dtypes import DType
from tessera.ir.types import element_of, scalar_dtype

from .errors import InterpreterError
from .registry import semantics
from .storage import Memory
from .values import Pointers

_REGISTERED: "weakref.WeakValueDictionary[int, np.ndarray]" = weakref.WeakValueDictionary()


def register(array: np.ndarray) -> int:
    """Make `array` reachable by address in later interpreted launches; returns its address."""
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
        raise InterpreterError(f"only C-contiguous numpy arrays can be reached by address, got "
                               f"{type(array).__name__}; pass np.ascontiguousarray(x)")
    _REGISTERED[id(array)] = array
    return data_address(array)


def data_address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


class AddressSpace:
    """The arrays one launch reaches by address, and a Memory per (array, dtype) that pointers share."""

    def __init__(self, arguments: list):
        self.memories: dict[tuple[int, DType], Memory] = {}
        self.arrays: dict[int, np.ndarray] = dict(_REGISTERED.items())
        self.bases: dict[int, int] = {}          # id(memory) -> its address, for memories of no array
        for value in arguments:
            if isinstance(value, Pointers):
                memory = value.memory
                self.arrays[id(memory.array)] = memory.array
                self.memories.setdefault((id(memory.array), memory.dtype), memory)

    def base(self, memory: Memory) -> int:
        return self.bases.get(id(memory), data_address(memory.array))

    def addresses(self, pointers: Pointers) -> np.ndarray:
        """The byte address of every lane of `pointers` (uint64)."""
        dtype = pointers.memory.dtype
        if dtype.is_subbyte:
            raise InterpreterError(f"a pointer to {dtype.name} elements (packed, below a byte) has no byte address")
        offsets = pointers.offsets.astype(np.int64) * (dtype.bits // 8)
        return (np.uint64(self.base(pointers.memory)) + offsets.astype(np.uint64)).astype(np.uint64)

    def pointers(self, addresses: np.ndarray, dtype: DType) -> Pointers:
        """Pointers to `dtype` elements at byte `addresses` (see the module docstring)."""
        if dtype.is_subbyte:
            raise InterpreterError(f"pointers to {dtype.name} elements (packed, below a byte) cannot come from "
                                   f"integers; use a pointer to the bytes (u8)")
        addresses = np.asarray(addresses).astype(np.uint64)
        owner = self._owner(addresses)
        if owner is None:
            first = int(addresses.reshape(-1)[0]) if addresses.size else 0
            memory = self._memory_of_nothing(first, dtype)
        else:
            memory = self._memory(owner, dtype)
        size = dtype.bits // 8
        delta = addresses.astype(np.int64) - np.int64(self.base(memory))
        inside = (delta >= 0) & (delta < memory.size * size)
        if (inside & (delta % size != 0)).any():
            bad = int(addresses[inside & (delta % size != 0)].reshape(-1)[0])
            raise InterpreterError(f"address {bad:#x} is not aligned to the {size}-byte {dtype.name} elements of "
                                   f"{memory.name}")
        return Pointers(memory, np.floor_divide(delta, size))

    def _owner(self, addresses: np.ndarray) -> np.ndarray | None:
        """The one array that the lanes inside any array point into (None: no lane is inside one)."""
        owner = None
        for array in self.arrays.values():
            start = data_address(array)
            inside = (addresses >= np.uint64(start)) & (addresses < np.uint64(start + array.nbytes))
            if not inside.any():
                continue
            if owner is not None and owner is not array:
                raise InterpreterError("the lanes of a tile of pointers point into two different arrays; the "
                                       "interpreter follows one array per tile of pointers: load through each "
                                       "array's pointers separately (e.g. one program or loop step per array)")
            owner = array
        return owner

    def _memory(self, array: np.ndarray, dtype: DType) -> Memory:
        key = (id(array), dtype)
        if key not in self.memories:
            raw = array.reshape(-1).view(np.uint8)
            raw = raw[:raw.size - raw.size % (dtype.bits // 8)]
            self.memories[key] = Memory(raw.view(dtype.storage_dtype), dtype,
                                        name=f"the array at {data_address(array):#x}")
        return self.memories[key]

    def _memory_of_nothing(self, address: int, dtype: DType) -> Memory:
        memory = Memory(np.zeros(0, dtype.storage_dtype), dtype,
                        name=f"address {address:#x} (inside no array the kernel can reach: its array arguments "
                             f"and the arrays given to tessera.addresses)")
        self.bases[id(memory)] = address
        self.memories[(id(memory.array), dtype)] = memory
        return memory


@semantics("ptr_to_int")
def _ptr_to_int(ctx, op, pointers):
    return ctx.addresses.addresses(pointers).astype(scalar_dtype(op.result.type).compute_dtype)


@semantics("int_to_ptr")
def _int_to_ptr(ctx, op, addresses):
    return ctx.addresses.pointers(addresses, element_of(op.result.type).pointee)
