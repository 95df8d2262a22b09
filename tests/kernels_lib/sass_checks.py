"""Checks on the SASS ptxas made of a compiled kernel, shared by the library's compile tests (no GPU needed)."""

from __future__ import annotations

import re

from tessera.backends.nvptx.sass import disassemble, find_cuobjdump, unset_descriptor_words
from tessera.ir.wgmma_layouts import MatrixDescriptor

_DESC_FIELDS = re.compile(r"wgmma_desc .*\{lbo = (\d+), sbo = (\d+), swizzle = (\d+)\}")


def assert_wgmma_descriptors_built(compiled) -> None:
    """Every wgmma reading A from shared memory builds its descriptor's high word (SBO, swizzle) from the
    fields the thread IR's `wgmma_desc` ops give, in the SASS ptxas made (`sass.unset_descriptor_words`): on an
    H100 a dropped one read A at the wrong place (wrong attention output, illegal addresses). Does nothing
    without cuobjdump or a cubin."""
    if find_cuobjdump() is None or compiled.binary is None:
        return
    fields = _DESC_FIELDS.findall(compiled.stages["thread_ir"])
    high_words = {MatrixDescriptor(0, int(lbo), int(sbo), int(swizzle)).encode() >> 32 for lbo, sbo, swizzle in fields}
    assert high_words, "no wgmma_desc in the thread IR"
    faults = unset_descriptor_words(disassemble(compiled.binary), high_words)
    assert not faults, faults[:3]
