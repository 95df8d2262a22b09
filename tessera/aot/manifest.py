"""One compiled specialization as the C generators see it: read from a `tessera compile` manifest.

The manifest (`KERNEL.json`) lists the runtime parameters in order with their types and the
facts the specialization assumed (`hint`: "16" for a 16-byte-aligned pointer or an integer
that is a multiple of 16, "1" for an integer equal to 1), the launch shape, and the hidden
tensor-map parameters' recipes. `Specialization.load` reads it with its binary.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..ir import dtypes as dt

__all__ = ["AotError", "Parameter", "Specialization"]

# C type of a scalar parameter, by dtype: what the kernel ABI reads (runtime/packing.py's table)
_SCALAR_C_TYPES = {
    "bool": "bool", "i8": "int8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t",
    "u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t", "u64": "uint64_t",
    "f16": "uint16_t", "bf16": "uint16_t", "f32": "float", "f64": "double",
    "f8e4m3": "uint8_t", "f8e5m2": "uint8_t", "e8m0": "uint8_t",
}  # fmt: skip


class AotError(ValueError):
    """A manifest the C generators cannot turn into a launcher; the message says which and why."""


@dataclass(frozen=True)
class Parameter:
    """One runtime parameter: its name, type text (`*f32`, `i32`) and specialization hint ("", "16" or "1")."""

    name: str
    type: str
    hint: str = ""

    @property
    def is_pointer(self) -> bool:
        return self.type.startswith("*")

    @property
    def dtype(self) -> dt.DType:
        return dt.dtype_from_name(self.type.lstrip("*"))

    def c_type(self, vendor: str) -> str:
        if self.is_pointer:
            return "CUdeviceptr" if vendor == "nvidia" else "hipDeviceptr_t"
        name = self.dtype.name
        if name not in _SCALAR_C_TYPES:
            raise AotError(f"parameter {self.name!r}: a scalar of type {name} has no C launch type")
        return _SCALAR_C_TYPES[name]

    def condition(self) -> str | None:
        """The C test that this specialization's hint holds for the argument, or None without a hint."""
        if not self.hint:
            return None
        if self.hint == "1":
            return f"{self.name} == 1"
        if self.is_pointer:
            return f"((uintptr_t){self.name} % 16 == 0)"
        return f"({self.name} % 16 == 0)"


@dataclass(frozen=True)
class Specialization:
    """Everything a C launcher needs of one compiled specialization."""

    kernel: str
    entry: str                     # the kernel's symbol in the binary
    target: str
    vendor: str                    # "nvidia" or "amd"
    num_warps: int
    threads_per_block: int
    shared_bytes: int
    parameters: tuple[Parameter, ...]
    tensor_maps: tuple[dict, ...]
    binary: bytes                  # cubin or hsaco; NUL-terminated PTX text when there is no cubin
    binary_kind: str               # "cubin", "ptx" or "hsaco"
    constexprs: dict
    cluster_dims: tuple[int, int, int] | None = None   # launched in clusters (cuLaunchKernelEx), or not
    programs_per_block: int = 1    # programs along grid axis 0 one block runs (AMD's wave-group ping-pong: 2)

    @classmethod
    def load(cls, manifest_path: str | Path) -> "Specialization":
        path = Path(manifest_path)
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise AotError(f"cannot read the manifest {path}: {exc}") from None
        return cls.from_manifest(manifest, path.parent)

    @classmethod
    def from_manifest(cls, manifest: dict, folder: Path) -> "Specialization":
        if "parameters" not in manifest:
            raise AotError(f"the manifest of {manifest.get('kernel')!r} predates AOT launchers (no 'parameters'): "
                           f"compile it again with this tessera")
        vendor = "amd" if manifest["target"].startswith("gfx") else "nvidia"
        kind, name = _binary_file(manifest, vendor)
        data = (folder / name).read_bytes()
        if kind == "ptx":
            data += b"\0"
        return cls(kernel=manifest["kernel"], entry=manifest.get("entry", manifest["kernel"]),
                   target=manifest["target"], vendor=vendor, num_warps=manifest["num_warps"],
                   threads_per_block=int(manifest["threads_per_block"]),
                   shared_bytes=int(manifest.get("dynamic_shared_memory_bytes",
                                                 manifest.get("shared_memory_bytes", 0)) or 0),
                   parameters=tuple(Parameter(**p) for p in manifest["parameters"]),
                   tensor_maps=tuple(manifest.get("tensor_maps", ())), binary=data, binary_kind=kind,
                   constexprs=dict(manifest.get("constexprs", {})),
                   cluster_dims=tuple(manifest["cluster_dims"]) if manifest.get("cluster_dims") else None,
                   programs_per_block=int(manifest.get("programs_per_block", 1)))

    @property
    def symbol(self) -> str:
        """A C identifier for the kernel."""
        return re.sub(r"\W", "_", self.kernel)


def _binary_file(manifest: dict, vendor: str) -> tuple[str, str]:
    if vendor == "amd":
        if not manifest.get("hsaco"):
            raise AotError(f"kernel {manifest['kernel']!r} has no hsaco (ld.lld was not found when it was compiled): "
                           f"an AMD launcher needs the linked code object; pip install ziglang and compile again")
        return "hsaco", manifest["hsaco"]
    if manifest.get("cubin"):
        return "cubin", manifest["cubin"]
    return "ptx", manifest["ptx"]
