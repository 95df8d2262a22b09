"""`Memory`: a user's numpy array seen as kernel memory of one element dtype.

Reads and writes go straight to the user's array, in place, so a kernel's
stores are visible to the caller afterwards. Elements are addressed by
element offset into the flattened (C-order) array:

* byte-or-wider types: the array's numpy dtype must be the type's
  `storage_dtype` (`float32` for f32, `uint16` bit patterns for bf16, `uint8`
  for fp8, ...). Loads decode, stores encode.
* sub-byte types (i1..i7, u1..u7, fp4, fp6): the array is `uint8` bytes
  holding a packed little-endian bit stream; element k occupies bits
  [k*bits, (k+1)*bits) (see `tessera.ir.dtypes.pack`). Loads extract those
  bits; stores read-modify-write them and leave every other bit alone.

Memory does no bounds or mask checks: the ops (`memory.py`) check offsets
first, so they can name the op and source line in the error.
"""

from __future__ import annotations

import numpy as np

from tessera.ir import dtypes as dt
from tessera.ir.dtypes import DType

from .errors import InterpreterError


class WriteClock:
    """Counts stores that changed some memory's bits, while a cooperative launch watches (see `cooperative.py`).

    A program spinning on a flag is stalled when an iteration of its loop changed nothing it can see; the
    clock tells the scheduler whether anything changed since. Unwatched (the usual case) stores cost nothing
    extra; watched ones compare the bytes they overwrite.
    """

    watching = 0     # nesting depth of cooperative launches in progress
    ticks = 0        # stores that changed memory while watched
    reads = 0        # loads while watched: a loop that reads no memory is not waiting for another program


class Memory:
    """A numpy array read and written in place as elements of `dtype`."""

    def __init__(self, array: np.ndarray, dtype: DType | None = None, *, numel: int | None = None,
                 name: str | None = None):
        """Wrap `array`; `dtype` overrides the element type numpy's dtype implies
        (a uint16 array as bf16, a uint8 array as packed u4); `numel` limits the
        addressable elements (default: all the array holds); `name` is used in errors."""
        if not isinstance(array, np.ndarray):
            raise InterpreterError(f"Memory wraps a numpy array, got {type(array).__name__}")
        if not array.flags.c_contiguous:
            raise InterpreterError(
                f"Memory needs a C-contiguous array (got strides {array.strides} for shape {array.shape}); "
                "pass np.ascontiguousarray(x) and copy results back if the kernel writes to it")
        if dtype is None:
            try:
                dtype = dt.dtype_from_numpy(array.dtype)
            except ValueError as e:
                raise InterpreterError(str(e)) from None
        _check_storage(array, dtype)
        capacity = array.size * 8 // dtype.bits if dtype.is_subbyte else array.size
        if numel is None:
            numel = capacity
        if not 0 <= numel <= capacity:
            raise InterpreterError(f"Memory of {numel} {dtype.name} elements does not fit in an array "
                                   f"holding {capacity} of them")
        self.array = array
        self.dtype = dtype
        self.size = numel
        self.name = name
        self._flat = array.reshape(-1)  # a view: the array is contiguous
        self._bytes: Memory | None = None

    def as_bytes(self) -> "Memory":
        """The same array as u8 elements, one Memory per array (the SIMT simulator addresses the bytes of a
        packed sub-byte tensor through it; pointers compare memories by identity)."""
        if self.dtype == dt.u8:
            return self
        if self._bytes is None:
            self._bytes = Memory(self.array, dt.u8, name=f"{self.name or 'memory'} (bytes)")
        return self._bytes

    def named(self, name: str) -> "Memory":
        """The same memory (same array, in place) under another name for errors."""
        return Memory(self.array, self.dtype, numel=self.size, name=name)

    def __repr__(self) -> str:
        return f"Memory({self.name or 'unnamed'}: {self.size} x {self.dtype.name})"

    # -- element access (offsets already bounds-checked) ---------------------

    def load(self, offsets: np.ndarray) -> np.ndarray:
        """Values (compute_dtype) of the elements at `offsets`, in the offsets' shape."""
        offsets = np.asarray(offsets, dtype=np.int64)
        if WriteClock.watching:
            WriteClock.reads += 1
        if self.dtype.is_subbyte:
            return self.dtype.decode(self._read_bits(offsets))
        raw = self._flat[offsets]
        if raw.dtype == self.dtype.compute_dtype:
            return np.asarray(raw)
        return self.dtype.decode(raw)

    def store(self, offsets: np.ndarray, values: np.ndarray) -> None:
        """Write `values` at `offsets`; where offsets repeat, the last lane (row-major) wins."""
        if not self.array.flags.writeable:
            raise InterpreterError(f"cannot store into {self!r}: its numpy array is read-only")
        offsets = np.asarray(offsets, dtype=np.int64)
        values = np.broadcast_to(np.asarray(values), offsets.shape).reshape(-1)
        offsets = offsets.reshape(-1)
        offsets, values = _last_write_per_offset(offsets, values)
        if WriteClock.watching:
            self._watched_store(offsets, values)
            return
        self._store(offsets, values)

    def _watched_store(self, offsets: np.ndarray, values: np.ndarray) -> None:
        """`_store`, ticking the write clock if any bit changed (an atomic add of 0 changes nothing)."""
        touched = offsets
        if self.dtype.is_subbyte:       # an element may straddle two bytes
            byte = (offsets * self.dtype.bits) >> 3
            touched = np.concatenate([byte, np.minimum(byte + 1, self._flat.size - 1)])
        before = self._flat[touched].tobytes()
        self._store(offsets, values)
        if self._flat[touched].tobytes() != before:
            WriteClock.ticks += 1

    def _store(self, offsets: np.ndarray, values: np.ndarray) -> None:
        if self.dtype.is_subbyte:
            self._write_bits(offsets, self.dtype.encode(values))
        elif self._flat.dtype == self.dtype.compute_dtype:
            same = values.dtype == self._flat.dtype
            self._flat[offsets] = values if same else self.dtype.quantize(values)
        else:
            self._flat[offsets] = self.dtype.encode(values)

    def values(self) -> np.ndarray:
        """Every element as a 1-D compute_dtype array (handy for checking results)."""
        return self.load(np.arange(self.size, dtype=np.int64))

    # -- packed sub-byte elements -------------------------------------------

    def _bit_positions(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        bit = offsets * self.dtype.bits
        return bit >> 3, (bit & 7).astype(np.uint16)

    def _read_bits(self, offsets: np.ndarray) -> np.ndarray:
        byte, shift = self._bit_positions(offsets)
        last = self._flat.size - 1
        low = self._flat[byte].astype(np.uint16)
        high = self._flat[np.minimum(byte + 1, last)].astype(np.uint16)  # used only when straddling
        word = low | (high << np.uint16(8))
        return ((word >> shift) & np.uint16((1 << self.dtype.bits) - 1)).astype(np.uint8)

    def _write_bits(self, offsets: np.ndarray, patterns: np.ndarray) -> None:
        """Read-modify-write: clear each element's bits, then set them (offsets are distinct)."""
        byte, shift = self._bit_positions(offsets)
        mask = np.uint16((1 << self.dtype.bits) - 1) << shift
        bits = patterns.astype(np.uint16) << shift
        np.bitwise_and.at(self._flat, byte, ~(mask & 0xFF).astype(np.uint8))
        np.bitwise_or.at(self._flat, byte, (bits & 0xFF).astype(np.uint8))
        straddles = (mask >> 8) != 0
        if straddles.any():
            nxt = byte[straddles] + 1
            np.bitwise_and.at(self._flat, nxt, ~(mask[straddles] >> 8).astype(np.uint8))
            np.bitwise_or.at(self._flat, nxt, (bits[straddles] >> 8).astype(np.uint8))


def _check_storage(array: np.ndarray, dtype: DType) -> None:
    if dtype.is_subbyte:
        if array.dtype != np.uint8:
            raise InterpreterError(
                f"{dtype.name} is stored packed, {8 / dtype.bits:g} elements per byte: pass a uint8 array "
                f"(e.g. tessera.ir.dtypes.pack({dtype.name}.encode(values), {dtype.name})), got {array.dtype}")
        return
    want = dtype.storage_dtype
    if array.dtype != want:
        hint = f"x.view(np.{want})" if array.dtype.itemsize == want.itemsize else f"x.astype(np.{want})"
        if dtype.is_float and dtype.storage_dtype.kind == "u":
            hint = f"{dtype.name}.encode(values) (bit patterns)"
        raise InterpreterError(f"{dtype.name} elements are stored as {want} in memory, got a {array.dtype} "
                               f"array; pass {hint}")


def _last_write_per_offset(offsets: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop all but the last of lanes that write the same offset."""
    if offsets.size < 2:
        return offsets, values
    reversed_offsets = offsets[::-1]
    unique, first_in_reversed = np.unique(reversed_offsets, return_index=True)
    if unique.size == offsets.size:
        return offsets, values
    keep = np.sort(offsets.size - 1 - first_in_reversed)
    return offsets[keep], values[keep]
