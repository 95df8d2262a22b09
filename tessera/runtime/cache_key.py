"""The binary cache's key: everything a compiled kernel depends on, hashed.

    key = cache_key(kernel.source.source_hash, callee_hashes, bound.key,
                    {"num_warps": 4}, "sm_90a")

The key is the sha256 of one canonical JSON document holding

* the kernel's source hash and its callees' source hashes (as a set: the
  order they were found in does not matter);
* the specialization (constexpr values, argument dtypes and alignments);
* the compile options (a dict: its insertion order does not matter);
* the target arch;
* the compiler's own identity (`identity.compiler_identity`): tessera's
  version, a hash of its own .py and .lark files, and the LLVM and llvmlite
  versions, so editing the compiler (even without bumping the version) never
  serves a binary it would no longer produce.

Values are serialized explicitly, each tagged with its type, so `1`, `True`
and `1.0` (or `0.0` and `-0.0`) give different keys; a value of a type this
module does not know is an error rather than a silent `repr` that might hold
a memory address. Nothing here imports `tessera.dsl`: the caller passes plain
data.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from typing import Any, Iterable

from .identity import compiler_identity, package_source_hash  # noqa: F401  (package_source_hash: re-exported)

# Bump when the key document's layout changes, so old keys can never collide with new ones.
KEY_FORMAT = 1


def cache_key(kernel_source_hash: str, callee_hashes: Iterable[str], specialization: tuple,
              options: dict[str, Any], target: str) -> str:
    """The sha256 hex digest naming one compiled kernel in the binary cache."""
    if not isinstance(kernel_source_hash, str):
        raise TypeError(f"kernel_source_hash must be a str, got {type(kernel_source_hash).__name__}")
    if not isinstance(target, str):
        raise TypeError(f"target must be a str like 'sm_90a', got {type(target).__name__}")
    if not isinstance(options, dict):
        raise TypeError(f"options must be a dict, got {type(options).__name__}")
    callees = sorted(set(callee_hashes))
    if not all(isinstance(h, str) for h in callees):
        raise TypeError("callee_hashes must be strings")
    document = {
        "format": KEY_FORMAT,
        "compiler": compiler_identity(),
        "kernel": kernel_source_hash,
        "callees": callees,
        "specialization": canonical(specialization),
        "options": canonical(options),
        "target": target,
    }
    return hashlib.sha256(_dump(document).encode("ascii")).hexdigest()


def canonical(value: Any) -> Any:
    """A JSON-ready form of `value` that tags every leaf with its type.

    Supported: None, bool, int, float, str, bytes, tuple, list, dict, set,
    frozenset, enums, dataclass instances (e.g. tessera dtypes), numpy
    scalars/dtypes (by their repr) and objects whose class defines
    `__tessera_key__()` (by that key). Anything else raises TypeError.
    """
    kind = type(value)
    if value is None:
        return ["None"]
    if kind is bool:
        return ["bool", value]
    if kind is int:
        return ["int", str(value)]          # as text: JSON numbers would lose big ints and the int/float split
    if kind is float:
        return ["float", repr(value)]       # repr round-trips exactly and spells nan, inf and -0.0
    if kind is str:
        return ["str", value]
    if kind is bytes:
        return ["bytes", value.hex()]
    if kind in (tuple, list):
        return [kind.__name__, [canonical(v) for v in value]]
    if kind in (set, frozenset):
        return [kind.__name__, sorted((canonical(v) for v in value), key=_dump)]
    if kind is dict:
        items = [[canonical(k), canonical(v)] for k, v in value.items()]
        return ["dict", sorted(items, key=lambda item: _dump(item[0]))]
    if isinstance(value, enum.Enum):
        return [_qualified_name(kind), value.name]
    if hasattr(kind, "__tessera_key__"):        # a compile-time object that names its own identity (@tessera.func)
        return [_qualified_name(kind), canonical(value.__tessera_key__())]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [_qualified_name(kind),
                [[f.name, canonical(getattr(value, f.name))] for f in dataclasses.fields(value)]]
    if kind.__module__.split(".")[0] == "numpy":   # np.float32(1.5), dtype('float32'): reprs are stable
        return [_qualified_name(kind), repr(value)]
    raise TypeError(f"cannot put a value of type {_qualified_name(kind)} ({value!r:.60}) into a cache key; "
                    f"use None, bool, int, float, str, bytes, tuples, dicts, enums or dataclasses of those")


def _qualified_name(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _dump(document: Any) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
