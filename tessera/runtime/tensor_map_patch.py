"""`AddressPatcher`: a tensor map at a new address from the driver's map of the same tensor elsewhere.

A launch whose output is a fresh tensor each call needs its TMA map encoded
again: a `cuTensorMapEncodeTiled` call through cuda-python per launch (about
2 µs of the stub driver's Python alone; the real call is measured on a GPU by
bench/launch_overhead.py).
The driver documents `CUtensorMap` as opaque, so nothing here assumes its
layout. For one description (all but the address fixed) the patcher watches
the driver encode it and tests one hypothesis: a single 64-bit word holds
`rest XOR ((address >> s) << p)` (s <= 4: the address is 16-byte aligned)
and no other byte depends on the address. Two encodes propose s, p and rest;
a third must then be predicted exactly. After that it builds maps itself,
but only at addresses that differ from the ones it saw in bits the driver's
own maps showed varying, per alignment class (lowest set bit, up to 4 KiB,
in case the driver looks at alignment); an address outside that span is
encoded by the driver and checked against the patch, which widens the span
or, on a miss, ends patching for the description. Every `SPOT_CHECK`-th
patched map is compared with the driver's too; a miss there ends patching
with a warning.

Off unless $TESSERA_TMA_ADDRESS_PATCH is "1": no GPU has confirmed the
hypothesis on a real driver yet (tests/runtime/test_tensor_map_patch.py's
GPU test compares patched maps with the driver's; flip the default once it
passes).
"""

from __future__ import annotations

import os
import warnings
from typing import Callable, Optional

ENV = "TESSERA_TMA_ADDRESS_PATCH"
SPOT_CHECK = 64            # every 64th patched map is also encoded by the driver and compared
PROPOSALS = 2              # failed proposals (per alignment class) before a description stops learning
_WORDS = 16                 # a CUtensorMap is 16 little-endian 64-bit words
_ALIGNMENT_CLASS = 4096    # addresses are classed by their lowest set bit up to 4 KiB: one learned patch per class


def enabled() -> bool:
    """Whether tensor maps may be patched rather than encoded ($TESSERA_TMA_ADDRESS_PATCH=1)."""
    return os.environ.get(ENV, "0") == "1"


def _alignment(address: int) -> int:
    """The alignment class of `address`: its lowest set bit, at most `_ALIGNMENT_CLASS` (0 is in the last)."""
    low = address & -address
    return low if 0 < low < _ALIGNMENT_CLASS else _ALIGNMENT_CLASS


def _bits(address: int, shift: int, position: int) -> Optional[int]:
    """`(address >> shift) << position`, or None when that loses bits of the address or overflows the word."""
    value = address >> shift
    if value << shift != address or (value << position) >> 64:
        return None
    return value << position


class _Field:
    """Where an address lives in a map: word `word` is `rest ^ ((address >> shift) << position)`, the other
    words those of the map it was learned from."""

    __slots__ = ("shift", "position", "rest", "prefix", "suffix")

    def __init__(self, word: int, shift: int, position: int, rest: int, template: bytes):
        self.shift, self.position, self.rest = shift, position, rest
        self.prefix, self.suffix = template[:8 * word], template[8 * word + 8:]

    def patch(self, address: int) -> Optional[bytes]:
        """The map at `address` (None when the field cannot hold it); inlined `_bits`: it runs per launch."""
        value = address >> self.shift
        if value << self.shift != address or (value << self.position) >> 64:
            return None
        return self.prefix + (self.rest ^ (value << self.position)).to_bytes(8, "little") + self.suffix


def _learn(first: tuple[int, bytes], second: tuple[int, bytes]) -> Optional[_Field]:
    """The field that explains both (address, map) samples, or None when the hypothesis does not."""
    (a1, m1), (a2, m2) = first, second
    if len(m1) != 8 * _WORDS or len(m2) != 8 * _WORDS or a1 == a2:
        return None
    differ = [i for i in range(_WORDS) if m1[8 * i:8 * i + 8] != m2[8 * i:8 * i + 8]]
    if len(differ) != 1:
        return None
    word = differ[0]
    w1, w2 = (int.from_bytes(m[8 * word:8 * word + 8], "little") for m in (m1, m2))
    # (a1 ^ a2) >> shift << position == w1 ^ w2 fixes position - shift by the lowest set bits
    offset = ((w1 ^ w2) & -(w1 ^ w2)).bit_length() - ((a1 ^ a2) & -(a1 ^ a2)).bit_length()
    for shift in range(5):
        position = offset + shift
        if not 0 <= position < 64:
            continue
        b1, b2 = _bits(a1, shift, position), _bits(a2, shift, position)
        if b1 is not None and b2 is not None and w1 ^ b1 == w2 ^ b2:
            return _Field(word, shift, position, w1 ^ b1, m1)
    return None


class AddressPatcher:
    """`patcher(address)`: the map of one description at `address`, patched once learned, else `encode(address)`
    (the driver's; see the module docstring). Learned separately per alignment class of the address."""

    def __init__(self, encode: Callable[[int], bytes], what: str = "tensor map"):
        self.encode, self.what = encode, what
        self.fields: dict[int, _Field] = {}                     # alignment class -> verified field
        self.spans: dict[int, tuple[int, int]] = {}             # alignment class -> (an address, bits verified)
        self.samples: dict[int, list[tuple[int, bytes]]] = {}   # alignment class -> driver encodes seen
        self.failed: dict[int, int] = {}                        # alignment class -> failed proposals
        self.patched = 0
        self.broken = False

    def __call__(self, address: int) -> bytes:
        kind = _alignment(address)
        field = self.fields.get(kind)
        if field is not None:
            anchor, verified = self.spans[kind]
            if not (address ^ anchor) & ~verified:      # only bits the driver's own maps showed varying
                blob = field.patch(address)
                if blob is not None:
                    self.patched += 1
                    return self._checked(address, blob) if self.patched % SPOT_CHECK == 0 else blob
        blob = self.encode(address)
        if not self.broken:
            self._observe(kind, address, blob)
        return blob

    def _checked(self, address: int, blob: bytes) -> bytes:
        """The driver's map at `address`; patching stops if `blob` (the patch) differs from it."""
        driver = self.encode(address)
        if driver != blob:
            self._stop()
            warnings.warn(f"{self.what}: a patched tensor map differed from the driver's at {address:#x}; "
                          f"encoding every map with the driver from now on (unset ${ENV} to silence this)",
                          RuntimeWarning, stacklevel=3)
        return driver

    def _stop(self) -> None:
        self.broken = True
        self.fields.clear()

    def _observe(self, kind: int, address: int, blob: bytes) -> None:
        """Learn from a driver encode: two samples of a class propose a field, a third must match it; once
        learned, an encode at an address with bits not seen varying checks the field on them (and widens what
        is patched), or ends patching when it does not match."""
        field = self.fields.get(kind)
        if field is not None:
            anchor, verified = self.spans[kind]
            if field.patch(address) == blob:
                self.spans[kind] = (anchor, verified | (address ^ anchor))
            else:
                self._stop()            # (no patched map went out: nothing to warn about)
            return
        if self.failed.get(kind, 0) >= PROPOSALS:
            return
        samples = self.samples.setdefault(kind, [])
        if any(seen == address for seen, _ in samples):
            return
        samples.append((address, blob))
        if len(samples) < 3:
            return
        field = _learn(samples[0], samples[1])
        if field is not None and all(field.patch(a) == m for a, m in samples[2:]):
            self.fields[kind] = field
            anchor = samples[0][0]
            verified = 0
            for seen, _ in samples:
                verified |= seen ^ anchor
            self.spans[kind] = (anchor, verified)
        else:
            self.failed[kind] = self.failed.get(kind, 0) + 1
        samples.clear()             # (a failed proposal starts over from the next two encodes)
