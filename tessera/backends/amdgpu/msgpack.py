"""A small MessagePack decoder: enough to read the AMDGPU metadata note of a code object.

    decode(data) -> dict / list / str / int / float / bytes / bool / None

Code object v3+ stores its metadata (kernels, arguments, register counts)
as one MessagePack map in an ELF note (`elf.py`). This reads every
MessagePack type except extension types and timestamps, which that map
never holds; a malformed or truncated input raises `ValueError`.
"""

from __future__ import annotations

import struct
from typing import Any


def decode(data: bytes) -> Any:
    """The one MessagePack value in `data`."""
    value, end = _value(memoryview(data), 0)
    if end != len(data):
        raise ValueError(f"MessagePack: {len(data) - end} bytes after the value")
    return value


_FIXED = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q",
          0xCA: ">f", 0xCB: ">d"}
_LENGTH = {0xD9: ">B", 0xDA: ">H", 0xDB: ">I", 0xC4: ">B", 0xC5: ">H", 0xC6: ">I",
           0xDC: ">H", 0xDD: ">I", 0xDE: ">H", 0xDF: ">I"}


def _take(data: memoryview, at: int, size: int) -> memoryview:
    if at + size > len(data):
        raise ValueError("MessagePack: truncated input")
    return data[at:at + size]


def _value(data: memoryview, at: int) -> tuple[Any, int]:
    tag = _take(data, at, 1)[0]
    at += 1
    if tag <= 0x7F:
        return tag, at
    if tag >= 0xE0:
        return tag - 0x100, at
    if 0xA0 <= tag <= 0xBF:
        return _string(data, at, tag & 0x1F)
    if 0x90 <= tag <= 0x9F:
        return _array(data, at, tag & 0x0F)
    if 0x80 <= tag <= 0x8F:
        return _map(data, at, tag & 0x0F)
    if tag in (0xC0, 0xC2, 0xC3):
        return {0xC0: None, 0xC2: False, 0xC3: True}[tag], at
    if tag in _FIXED:
        fmt = _FIXED[tag]
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, _take(data, at, size))[0], at + size
    if tag in _LENGTH:
        fmt = _LENGTH[tag]
        size = struct.calcsize(fmt)
        (length,) = struct.unpack(fmt, _take(data, at, size))
        at += size
        if tag in (0xD9, 0xDA, 0xDB):
            return _string(data, at, length)
        if tag in (0xC4, 0xC5, 0xC6):
            return bytes(_take(data, at, length)), at + length
        return (_array if tag in (0xDC, 0xDD) else _map)(data, at, length)
    raise ValueError(f"MessagePack: unsupported type byte 0x{tag:02X}")


def _string(data: memoryview, at: int, length: int) -> tuple[str, int]:
    return bytes(_take(data, at, length)).decode("utf-8"), at + length


def _array(data: memoryview, at: int, count: int) -> tuple[list, int]:
    items = []
    for _ in range(count):
        item, at = _value(data, at)
        items.append(item)
    return items, at


def _map(data: memoryview, at: int, count: int) -> tuple[dict, int]:
    result = {}
    for _ in range(count):
        key, at = _value(data, at)
        value, at = _value(data, at)
        result[key] = value
    return result, at
