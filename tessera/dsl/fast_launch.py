"""The warm GPU launch path: a fingerprint of the arguments -> the prepared launcher.

`bind_arguments` classifies every argument the general way (Python-level
work: tens of µs). A launch that repeats an earlier specialization needs much
less. This module computes a fingerprint that is at least as fine as the
specialization key — per positional argument its type and exactly the facts
the key records (integer width bucket, divisibility by 16, == 1; tensor dtype,
16-byte alignment and device; which tensors overlap) plus the constexpr
values with their types — and maps it to the `Launcher` the first (slow)
launch prepared. Anything unusual (runtime arguments given by keyword,
defaults, numpy scalars, host arrays) returns no fingerprint and takes the
slow path, which is always correct.
"""

from __future__ import annotations

from typing import Any

from .source import KernelSource

_I32 = (-(2**31), 2**31 - 1)
_I64 = (-(2**63), 2**63 - 1)


class FastLaunches:
    """Per-kernel table of prepared launches, keyed by argument fingerprints."""

    def __init__(self, source: KernelSource, do_not_specialize: frozenset[str]):
        names = source.param_names
        self.num_params = len(names)
        self.constexpr_names = source.constexpr_params
        self.constexpr_positions = frozenset(i for i, n in enumerate(names) if n in source.constexpr_params)
        self.runtime_positions = tuple(i for i, n in enumerate(names) if n not in source.constexpr_params)
        self.generic = frozenset(i for i, n in enumerate(names) if n in do_not_specialize)
        self.launchers: dict[tuple, Any] = {}

    def fingerprint(self, args: tuple, kwargs: dict, num_warps: int) -> tuple | None:
        """A key at least as fine as the specialization key, or None to take the slow path."""
        if len(args) + len(kwargs) != self.num_params or any(k not in self.constexpr_names for k in kwargs):
            return None
        parts: list = []
        ranges: list[tuple[int, int, int]] = []
        for i, value in enumerate(args):
            kind = type(value)
            if i in self.constexpr_positions:
                parts.append((kind, value))
            elif kind is int:
                bucket = 32 if _I32[0] <= value <= _I32[1] else 64 if _I64[0] <= value <= _I64[1] else None
                if bucket is None:
                    return None
                parts.append((bucket,) if i in self.generic else (bucket, value % 16 == 0, value == 1))
            elif kind is float or kind is bool:
                parts.append(kind)
            else:
                described = _device_array_facts(value)
                if described is None:
                    return None
                dtype, address, size, device = described
                parts.append((dtype, i in self.generic or address % 16 == 0, device))
                ranges.append((i, address, address + size))
        overlapping = frozenset(i for i, a0, a1 in ranges for j, b0, b1 in ranges if i != j and a0 < b1 and b0 < a1)
        constexprs = tuple(sorted((k, type(v), v) for k, v in kwargs.items()))
        try:
            key = (tuple(parts), overlapping, constexprs, num_warps)
            hash(key)
        except TypeError:        # an unhashable constexpr: the slow path reports it
            return None
        return key

    def runtime_args(self, args: tuple) -> list:
        return [args[i] for i in self.runtime_positions]


def _device_array_facts(value: Any) -> tuple[Any, int, int, Any] | None:
    """(dtype, address, size in bytes, device) of a GPU tensor, or None for anything else."""
    if getattr(value, "is_cuda", False) and type(value).__module__.startswith("torch"):
        return value.dtype, value.data_ptr(), value.numel() * value.element_size(), value.device.index
    interface = getattr(value, "__cuda_array_interface__", None)
    if interface is not None and interface.get("strides") is None:
        size = 1
        for extent in interface["shape"]:
            size *= extent
        typestr = interface["typestr"]
        return typestr, interface["data"][0], size * int(typestr[2:]), None
    return None
