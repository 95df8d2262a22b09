"""Kernel signatures written as text, for the command line: `*f32:16, *f32, i32:1, f32`.

Each entry describes one runtime parameter, in order:

    *DTYPE       pointer to DTYPE elements        (*bf16, *u4, ...)
    *DTYPE:16    ... known to be 16-byte aligned
    DTYPE        scalar                           (i32, f32, bool, ...)
    INT:16       integer known to be divisible by 16
    INT:1        integer known to equal 1

constexpr parameters are not listed; they come from `NAME=VALUE` pairs.
"""

from __future__ import annotations

import ast
from typing import Any

from ..ir import dtypes as dt
from ..ir.types import PointerType, ScalarType
from .source import KernelSource
from .specialization import ParamSpec


class SignatureError(ValueError):
    """A signature or constexpr that does not fit the kernel; the message says which entry."""


def parse_signature(source: KernelSource, signature: str, constexprs: dict[str, Any]) -> list[ParamSpec]:
    """ParamSpecs for `source`'s parameters from a signature string and constexpr values by name."""
    runtime = [p for p in source.param_names if p not in source.constexpr_params]
    entries = [e.strip() for e in signature.split(",") if e.strip()]
    if len(entries) != len(runtime):
        raise SignatureError(f"kernel '{source.name}' has {len(runtime)} runtime parameters ({', '.join(runtime)}) "
                             f"but the signature lists {len(entries)}")
    unknown = set(constexprs) - set(source.constexpr_params)
    if unknown:
        raise SignatureError(f"{sorted(unknown)} are not constexpr parameters of '{source.name}' "
                             f"(those are: {sorted(source.constexpr_params)})")
    by_name = dict(zip(runtime, entries))
    specs = []
    for name in source.param_names:
        if name in source.constexpr_params:
            if name in constexprs:
                value = constexprs[name]
            elif name in source.defaults:
                value = source.defaults[name]
            else:
                raise SignatureError(f"constexpr '{name}' needs a value: --const {name}=VALUE")
            specs.append(ParamSpec(name, constexpr=True, value=value))
        else:
            specs.append(_parse_entry(name, by_name[name]))
    return specs


def _parse_entry(name: str, entry: str) -> ParamSpec:
    text, _, hint = entry.partition(":")
    is_pointer = text.startswith("*")
    try:
        dtype = dt.dtype_from_name(text.lstrip("*"))
    except ValueError as exc:
        raise SignatureError(f"parameter '{name}': {exc}") from None
    if hint not in ("", "16", "1") or (hint == "1" and (is_pointer or not dtype.is_int)):
        raise SignatureError(f"parameter '{name}': hint ':{hint}' is not one of ':16' (aligned/divisible) or "
                             f"':1' (integer equal to 1)")
    if is_pointer:
        return ParamSpec(name, False, type=PointerType(dtype), divisible_by_16=hint == "16")
    return ParamSpec(name, False, type=ScalarType(dtype), divisible_by_16=hint == "16", equals_one=hint == "1")


def parse_constexpr(name: str, text: str) -> Any:
    """A constexpr value written on the command line: a dtype name or a Python literal."""
    try:
        return dt.dtype_from_name(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise SignatureError(f"constexpr '{name}={text}' is not a Python literal or dtype name") from None
