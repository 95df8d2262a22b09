"""Reductions, scans, arg-reductions and dot.

Orders are fixed, so results are reproducible and custom combines that are
associative but not commutative see their operands in index order:

* reduce: a pairwise tree over adjacent lanes. Each level combines lanes
  (0,1), (2,3), ... and carries an odd last lane up unchanged, until one
  lane is left; every combine is rounded to the element dtype. (For
  integers and max/min any order gives the same answer; float sums may
  differ from a GPU's order in the last bits.)
* scan: sequential. Forward: out[i] = out[i-1] (+) x[i]. Reverse (suffix):
  out[i] = x[i] (+) out[i+1]. Again rounded after every combine.
* max/min (reduce and scan) ignore NaN like the `max`/`min` ops: the result
  is NaN only where every lane is NaN.
* arg_reduce returns the smallest index holding the max (min); NaN lanes
  are ignored, and a row of only NaNs gives index 0.
* dot: integer inputs with an integer accumulator are exact (int64, which
  wraps like any narrower width), then wrapped to the accumulator dtype.
  Otherwise products and sums are formed in float64 (exact for f16, bf16 and
  fp8 inputs at any practical K) and rounded once to the accumulator dtype.
  `input_precision="tf32"` first rounds f32 inputs to tf32 (10 mantissa
  bits, to nearest with ties away from zero: `numerics.round_to_tf32`), as
  the tensor-core path does with cvt.rna.tf32.f32 before its mma.

A custom combine region made only of lane-wise ops runs once per tree level
(or scan step) on whole arrays of lanes; any other region runs once per
pair of elements.
"""

from __future__ import annotations

import numpy as np

from tessera.ir.dtypes import DType
from tessera.ir.ops import is_lanewise_region
from tessera.ir.types import scalar_dtype

from tessera.ir import numerics
from .registry import semantics

_KIND_TO_OP = {"sum": "add", "prod": "mul", "max": "max", "min": "min", "and": "and", "or": "or", "xor": "xor"}


def _combiner(ctx, op, dtype: DType):
    """combine(a, b) -> a (+) b, elementwise over arrays of the element dtype."""
    kind = op.attrs["kind"]
    if kind == "custom":
        return _region_combiner(ctx, op.regions[0], dtype)
    # The op's type rule (ir/ops.py) already rejects kinds that do not fit the dtype.
    name = _KIND_TO_OP[kind]
    return lambda a, b: numerics.binary(name, a, b, dtype)


def _region_combiner(ctx, region, dtype: DType):
    if is_lanewise_region(region):
        def combine(a, b):
            with ctx.lanewise():
                (out,) = ctx.run_region(region, [a, b])
            return np.broadcast_to(out, np.broadcast_shapes(np.shape(a), np.shape(b)))
        return combine

    def combine_each(a, b):
        a, b = np.broadcast_arrays(a, b)
        out = np.empty(a.shape, dtype=dtype.compute_dtype)
        for index in np.ndindex(a.shape):
            (out[index],) = ctx.run_region(region, [np.asarray(a[index]), np.asarray(b[index])])
        return out
    return combine_each


@semantics("reduce")
def _reduce(ctx, op, x):
    combine = _combiner(ctx, op, scalar_dtype(op.operands[0].type))
    lanes = np.moveaxis(x, op.attrs["axis"], -1)
    while lanes.shape[-1] > 1:
        n = lanes.shape[-1]
        pairs = combine(lanes[..., 0:n - 1:2], lanes[..., 1:n:2])
        lanes = np.concatenate([pairs, lanes[..., n - 1:]], axis=-1) if n % 2 else pairs
    return np.array(lanes[..., 0])


@semantics("scan")
def _scan(ctx, op, x):
    dtype = scalar_dtype(op.operands[0].type)
    kind, axis, reverse = op.attrs["kind"], op.attrs["axis"], op.attrs.get("reverse", False)
    fast = {"max": np.fmax, "min": np.fmin}.get(kind)
    if kind in ("sum", "prod") and (dtype.is_int or numerics.is_native(dtype)):
        fast = np.add if kind == "sum" else np.multiply  # exact order-for-order (or modular) in numpy
    if fast is not None and not dtype.is_bool:
        flipped = np.flip(x, axis) if reverse else x
        out = numerics.to_dtype(fast.accumulate(flipped, axis=axis), dtype)
        return np.flip(out, axis) if reverse else out
    combine = _combiner(ctx, op, dtype)
    lanes = np.moveaxis(x, axis, -1)
    out = np.array(lanes, dtype=dtype.compute_dtype, copy=True)
    n = lanes.shape[-1]
    if reverse:
        for i in range(n - 2, -1, -1):
            out[..., i] = combine(lanes[..., i], out[..., i + 1])
    else:
        for i in range(1, n):
            out[..., i] = combine(out[..., i - 1], lanes[..., i])
    return np.moveaxis(out, -1, axis)


@semantics("arg_reduce")
def _arg_reduce(ctx, op, x):
    lanes = np.moveaxis(x, op.attrs["axis"], -1)
    best = (np.fmax if op.attrs["kind"] == "argmax" else np.fmin).reduce(lanes, axis=-1)
    hits = lanes == best[..., None]  # NaN never hits
    return np.argmax(hits, axis=-1).astype(np.int32)


@semantics("dot")
def _dot(ctx, op, a, b, acc):
    source = scalar_dtype(op.operands[0].type)
    target = scalar_dtype(op.result.type)
    if not source.is_float and not target.is_float:
        exact = acc.astype(np.int64) + a.astype(np.int64) @ b.astype(np.int64)
        return target.quantize(exact)
    if op.attrs.get("input_precision") == "tf32" and source.bits == 32:
        a, b = numerics.round_to_tf32(a), numerics.round_to_tf32(b)
    wide = acc.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)
    return target.quantize(wide)
