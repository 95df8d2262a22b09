"""Reading AMDGPU code objects (ELF64): type, symbols, and the kernel metadata note.

    image = CodeObject(hsaco_bytes)
    image.elf_type                      # "ET_DYN" for a loadable code object, "ET_REL" for an object file
    image.symbols                       # {"add": Symbol(...), "add.kd": Symbol(...), ...}
    image.kernel_metadata("add")        # {".kernarg_segment_size": 28, ".args": [...], ...}

The metadata is the NT_AMDGPU_METADATA note (type 32, owner "AMDGPU"): one
MessagePack map whose "amdhsa.kernels" list describes each kernel -- its
explicit and hidden arguments (offset, size, kind), kernarg segment size and
alignment, LDS size (`.group_segment_fixed_size`), register counts and
wavefront size. `<kernel>.kd` is the kernel descriptor the loader launches.
Pure Python (`struct`), little-endian ELF64 only, which is what AMDGPU emits.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cached_property

from . import msgpack

ELF_TYPES = {0: "ET_NONE", 1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN", 4: "ET_CORE"}
EM_AMDGPU = 224
SHT_SYMTAB, SHT_NOTE, SHT_DYNSYM = 2, 7, 11
NT_AMDGPU_METADATA = 32


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int
    entry_size: int


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int
    binding: int      # 0 local, 1 global, 2 weak
    kind: int         # 1 object, 2 function, ...
    section: int


class CodeObject:
    """A parsed ELF image; `ValueError` if `data` is not a little-endian ELF64."""

    def __init__(self, data: bytes):
        self.data = bytes(data)
        if self.data[:4] != b"\x7fELF" or len(self.data) < 64:
            raise ValueError("not an ELF file")
        if self.data[4] != 2 or self.data[5] != 1:
            raise ValueError("not a little-endian ELF64 file")
        (self.e_type, self.machine) = struct.unpack_from("<HH", self.data, 16)
        (section_offset,) = struct.unpack_from("<Q", self.data, 0x28)
        entry_size, count, names_index = struct.unpack_from("<HHH", self.data, 0x3A)
        raw = [struct.unpack_from("<IIQQQQIIQQ", self.data, section_offset + i * entry_size) for i in range(count)]
        names = raw[names_index] if count else None
        self.sections = [
            Section(self._string(names[4], name) if names else "", kind, offset, size, link, entsize)
            for name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in raw
        ]

    @property
    def elf_type(self) -> str:
        return ELF_TYPES.get(self.e_type, f"0x{self.e_type:x}")

    def _string(self, table_offset: int, index: int) -> str:
        end = self.data.index(b"\0", table_offset + index)
        return self.data[table_offset + index:end].decode("utf-8", errors="replace")

    @cached_property
    def symbols(self) -> dict[str, Symbol]:
        """Named symbols of the symbol tables (.symtab and .dynsym)."""
        found: dict[str, Symbol] = {}
        for section in self.sections:
            if section.type not in (SHT_SYMTAB, SHT_DYNSYM):
                continue
            strings = self.sections[section.link].offset
            for at in range(section.offset, section.offset + section.size, section.entry_size or 24):
                name, info, _other, index, value, size = struct.unpack_from("<IBBHQQ", self.data, at)
                if name:
                    symbol = Symbol(self._string(strings, name), value, size, info >> 4, info & 0xF, index)
                    found.setdefault(symbol.name, symbol)
        return found

    def notes(self) -> list[tuple[str, int, bytes]]:
        """(owner, type, descriptor) of every note in the note sections."""
        notes = []
        for section in self.sections:
            if section.type != SHT_NOTE:
                continue
            at, end = section.offset, section.offset + section.size
            while at + 12 <= end:
                name_size, desc_size, kind = struct.unpack_from("<III", self.data, at)
                at += 12
                owner = self.data[at:at + name_size].rstrip(b"\0").decode("utf-8", errors="replace")
                at += _aligned4(name_size)
                notes.append((owner, kind, self.data[at:at + desc_size]))
                at += _aligned4(desc_size)
        return notes

    @cached_property
    def metadata(self) -> dict:
        """The decoded NT_AMDGPU_METADATA map ({} when the image has none)."""
        for owner, kind, descriptor in self.notes():
            if owner == "AMDGPU" and kind == NT_AMDGPU_METADATA:
                return msgpack.decode(descriptor)
        return {}

    def kernel_metadata(self, kernel: str) -> dict:
        """The "amdhsa.kernels" entry of `kernel`; KeyError naming the kernels there otherwise."""
        kernels = self.metadata.get("amdhsa.kernels", [])
        for entry in kernels:
            if entry.get(".name") == kernel:
                return entry
        raise KeyError(f"no kernel {kernel!r} in the code object's metadata "
                       f"(it has {', '.join(k.get('.name', '?') for k in kernels) or 'none'})")


def _aligned4(n: int) -> int:
    return (n + 3) & ~3


def kernel_summary(entry: dict) -> dict:
    """The facts about one kernel that the compiler reports (metadata names without the dots)."""
    keys = ("kernarg_segment_size", "kernarg_segment_align", "group_segment_fixed_size",
            "private_segment_fixed_size", "sgpr_count", "vgpr_count", "agpr_count", "sgpr_spill_count",
            "vgpr_spill_count", "wavefront_size", "max_flat_workgroup_size")
    summary = {key: entry[f".{key}"] for key in keys if f".{key}" in entry}
    summary["args"] = [{k.lstrip("."): v for k, v in arg.items()} for arg in entry.get(".args", [])]
    return summary
