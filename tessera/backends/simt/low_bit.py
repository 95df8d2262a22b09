"""The SIMT meaning of the low-bit ops (`tessera.ir.low_bit_ops`): sub-byte addresses, bytes <-> values.

A sub-byte element pointer is `Pointers(memory, k)`: element k of the
packed tensor, at bit k * bits. `byte_address` addresses the same array as
bytes (`Memory.as_bytes`), so the byte loads and stores that the low-bit
pass makes are checked for bounds, masks and vector promises like any
other. `unpack_bits` and `pack_bits` are `dtypes.unpack` / `dtypes.pack`
per thread, and the conversion to the result's dtype is the interpreter's
`cast` (`DType.quantize`), so a fused unpack-and-convert computes what a
load followed by a cast computes.
"""

from __future__ import annotations

import numpy as np

from tessera.ir import dtypes as dt
from tessera.ir.low_bit_ops import packed_dtype
from tessera.ir.types import scalar_dtype

from ..interp.values import Pointers
from .ops import simt


@simt("byte_address")
def _byte_address(ctx, op, ptr):
    return Pointers(ptr.memory.as_bytes(), (ptr.offsets * ptr.memory.dtype.bits) >> 3)


@simt("bit_offset")
def _bit_offset(ctx, op, ptr):
    return ((ptr.offsets * ptr.memory.dtype.bits) & 7).astype(np.int32)


@simt("unpack_bits")
def _unpack_bits(ctx, op, data):
    packed, result = packed_dtype(op.attrs["packed"]), scalar_dtype(op.result.type)
    count = op.result.type.count
    threads = data.shape[0]
    patterns = dt.unpack(np.ascontiguousarray(data, dtype=np.uint8), packed, threads * count)
    values = packed.decode(patterns)
    if result != packed:
        values = result.quantize(values)
    return np.asarray(values).reshape(threads, count)


@simt("pack_bits")
def _pack_bits(ctx, op, values):
    dtype = scalar_dtype(op.operands[0].type)
    threads = values.shape[0]
    return dt.pack(dtype.encode(values), dtype).reshape(threads, op.result.type.count)
