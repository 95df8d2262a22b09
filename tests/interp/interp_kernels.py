"""Small kernels for the interpreter tests, built with the IR Builder.

    run_op("add", (a, f32), (b, f32))           # -> numpy array of the result
    run_op("cast", (a, f32), result=TileType(ScalarType(bf16), a.shape))

`run_op` builds a kernel that loads each operand from its own memory, applies
the op under test once and stores the result, then runs it and returns the
result decoded from memory. Memory contents are made and read with
`tessera.ir.dtypes` (encode/pack, unpack/decode), not with the interpreter.
"""

from __future__ import annotations

import math

import numpy as np

from tessera.backends.interp import Memory, run_function
from tessera.ir import dtypes as dt
from tessera.ir.builder import Builder
from tessera.ir.core import Function, Location, Value
from tessera.ir.ops import OPS
from tessera.ir.types import PointerType, ScalarType, TileType, Type, shape_of, scalar_dtype

LOC = Location("kernel.py", 7, 5)


def scalar(dtype) -> ScalarType:
    return ScalarType(dtype)


def tile(dtype, *shape) -> TileType:
    return TileType(ScalarType(dtype), tuple(shape))


def ptr(dtype) -> PointerType:
    return PointerType(dtype)


def new_kernel(*params: tuple[str, Type], name: str = "k") -> tuple[Builder, Function]:
    """A builder positioned in a fresh kernel's body; every op gets location LOC."""
    b = Builder()
    b.loc = LOC
    fn = b.function(name, [t for _, t in params], [n for n, _ in params])
    return b, fn


def const(b: Builder, value, t: Type) -> Value:
    return b.create("constant", attrs={"value": value}, result_types=[t]).result


def lane_pointers(b: Builder, base: Value, shape: tuple[int, ...]) -> Value:
    """A tile of pointers base + [0, 1, ..., numel-1] in row-major order, shaped `shape`."""
    n = math.prod(shape)
    flat = b.create("splat", [base], result_types=[TileType(base.type, (n,))]).result
    flat = b.create("addptr", [flat, b.create("arange", attrs={"start": 0, "end": n}).result]).result
    if len(shape) == 1:
        return flat
    return b.create("reshape", [flat], result_types=[TileType(base.type, shape)]).result


def load_value(b: Builder, base: Value, shape: tuple[int, ...]) -> Value:
    """Load a scalar (shape ()) or a row-major tile from pointer `base`."""
    pointers = base if shape == () else lane_pointers(b, base, shape)
    return b.create("load", [pointers]).result


def store_value(b: Builder, base: Value, value: Value) -> None:
    shape = shape_of(value.type)
    pointers = base if shape == () else lane_pointers(b, base, shape)
    b.create("store", [pointers, value])


def memory(values, dtype, extra: int = 0) -> Memory:
    """Memory of `dtype` holding `values` (then `extra` zero elements), made with dtypes' codecs."""
    values = np.concatenate([np.asarray(values).reshape(-1), np.zeros(extra)]) if extra else np.asarray(values)
    patterns = dtype.encode(np.asarray(values).reshape(-1))
    if dtype.is_subbyte:
        return Memory(dt.pack(patterns, dtype), dtype)
    if dtype.storage_dtype == dtype.compute_dtype:
        return Memory(np.ascontiguousarray(dtype.quantize(values).reshape(-1)), dtype)
    return Memory(patterns.astype(dtype.storage_dtype), dtype)


def contents(mem: Memory) -> np.ndarray:
    """All values in `mem`, decoded with dtypes' codecs (independently of Memory.load)."""
    dtype = mem.dtype
    if dtype.is_subbyte:
        return dtype.decode(dt.unpack(mem.array, dtype, mem.size))
    if mem.array.dtype == dtype.compute_dtype:
        return mem.array.reshape(-1).copy()
    return dtype.decode(mem.array.reshape(-1))


def value_type(dtype, shape: tuple[int, ...]) -> Type:
    return TileType(ScalarType(dtype), shape) if shape else ScalarType(dtype)


def run_op(name: str, *operands: tuple[np.ndarray, dt.DType], attrs: dict | None = None,
           result: Type | None = None) -> np.ndarray:
    """Apply op `name` once to the operands (value array, dtype) and return its result."""
    attrs = attrs or {}
    shapes = [np.shape(v) for v, _ in operands]
    if result is None:
        result = OPS[name].infer([value_type(d, s) for (_, d), s in zip(operands, shapes)], attrs)[0]
    out_dtype, out_shape = scalar_dtype(result), shape_of(result)

    b, fn = new_kernel(*[(f"in{i}", ptr(d)) for i, (_, d) in enumerate(operands)], ("out", ptr(out_dtype)))
    ins = [load_value(b, p, s) for p, s in zip(fn.args, shapes)]
    op = b.create(name, ins, attrs=attrs, result_types=[result])
    store_value(b, fn.args[-1], op.result)
    b.create("return")

    mems = [memory(v, d) for v, d in operands]
    out = memory(np.zeros(max(1, math.prod(out_shape))), out_dtype)
    run_function(fn, [*mems, out], grid=(1,))
    return contents(out)[: math.prod(out_shape)].reshape(out_shape)
