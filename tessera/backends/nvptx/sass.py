"""SASS of a cubin, as instructions, for tests and reports that check what the machine code does.

PTX says what Tessera asked for; SASS says what ptxas made of it (HGMMA
shapes, FFMA, where the barriers and TMA issues fall in the K loop, how many
instructions the loop runs). `cuobjdump -sass` is found like ptxas
(`toolkit.cuda_roots`: PATH, CUDA roots, NVIDIA's pip wheels, e.g.
`nvidia-cuda-cuobjdump`); `TESSERA_CUOBJDUMP` overrides. None of this is
needed to compile or run a kernel.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .toolkit import cuda_roots

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH_TARGET = re.compile(r"\bBRA(?:\.\S+)?\s+(?:`\()?(?:\.L_x_\d+|0x([0-9a-f]+))")


@dataclass(frozen=True)
class SassInstruction:
    """One SASS instruction: its byte address and its text (predicate, opcode and operands, no `;`)."""

    address: int
    text: str

    @property
    def opcode(self) -> str:
        """The opcode with its modifiers ('HGMMA.64x128x16.F32.BF16'), without a predicate."""
        words = self.text.split()
        return words[1] if words[0].startswith("@") else words[0]

    def branch_target(self) -> int | None:
        """Where a BRA jumps to (None for anything else)."""
        found = _BRANCH_TARGET.search(self.text)
        return int(found.group(1), 16) if found and found.group(1) else None


def find_cuobjdump() -> Path | None:
    """Path of a cuobjdump executable, or None."""
    override = os.environ.get("TESSERA_CUOBJDUMP")
    if override:
        return Path(override) if Path(override).is_file() else None
    for root in cuda_roots():
        candidate = root / "bin" / "cuobjdump"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def disassemble(cubin: bytes) -> list[SassInstruction]:
    """The SASS instructions of a cubin's kernels, in address order (cuobjdump must exist)."""
    tool = find_cuobjdump()
    if tool is None:
        raise FileNotFoundError("cuobjdump not found: install the nvidia-cuda-cuobjdump wheel or a CUDA toolkit")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        text = subprocess.run([str(tool), "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    return [SassInstruction(int(m.group(1), 16), m.group(2)) for m in _LINE.finditer(text)]


def loop_containing(code: list[SassInstruction], opcode_prefix: str) -> list[SassInstruction]:
    """The instructions of the innermost loop (a backward BRA's range) holding an instruction whose opcode starts
    with `opcode_prefix` (e.g. 'HGMMA'); [] when none does. Loops of one uniform branch (`BRA.U.ANY`, the
    elect loops ptxas wraps around one thread's TMA issues) are skipped."""
    best: list[SassInstruction] = []
    for inst in code:
        target = inst.branch_target()
        if target is None or target >= inst.address or ".U.ANY" in inst.opcode:
            continue
        body = [i for i in code if target <= i.address <= inst.address]
        if any(i.opcode.startswith(opcode_prefix) for i in body) and (not best or len(body) < len(best)):
            best = body
    return best
