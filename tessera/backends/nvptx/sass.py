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
from typing import Callable, Iterator
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


def loops(code: list[SassInstruction]) -> Iterator[list[SassInstruction]]:
    """Each loop's instructions (a backward BRA's range), in the order of their branches. Loops of one uniform
    branch (`BRA.U.ANY`, the elect loops ptxas wraps around one thread's TMA issues) are skipped."""
    for inst in code:
        target = inst.branch_target()
        if target is not None and target < inst.address and ".U.ANY" not in inst.opcode:
            yield [i for i in code if target <= i.address <= inst.address]


def loop_containing(code: list[SassInstruction], holds: str | Callable[[SassInstruction], bool],
                    outermost: bool = False) -> list[SassInstruction]:
    """The instructions of the innermost (or, with `outermost`, the largest) loop holding an instruction whose
    opcode starts with `holds` (e.g. 'HGMMA'), or for which `holds(instruction)` is true; [] when none does."""
    test = holds if callable(holds) else (lambda inst: inst.opcode.startswith(holds))
    bodies = [body for body in loops(code) if any(test(inst) for inst in body)]
    return (max if outermost else min)(bodies, key=len) if bodies else []


# -- where a wgmma's descriptors come from ------------------------------------------------------------------

_GDESC = re.compile(r"gdesc\[UR(\d+)\]")
_REGISTER = re.compile(r"\b(U?R)(\d+)\b")
_IMMEDIATE = re.compile(r"(-?)0x([0-9a-f]+)\b")


def _registers(operand: str) -> set[str]:
    return {f"{kind}{n}" for kind, n in _REGISTER.findall(operand) if n}


def _written(inst: SassInstruction) -> set[str]:
    """The registers an instruction writes: its first operand (and the next one for a 64-bit op)."""
    words = inst.text.split(None, 2 if inst.text.startswith("@") else 1)
    operands = words[-1].split(",") if len(words) > (2 if inst.text.startswith("@") else 1) else []
    if not operands:
        return set()
    if re.fullmatch(r"U?P(T|\d+)", operands[0].strip()) and len(operands) > 1:     # R2UR P0, UR6, R9
        operands = operands[1:]
    found = _REGISTER.fullmatch(operands[0].strip().split(".")[0])
    if not found:
        return set()
    kind, n = found.group(1), int(found.group(2))
    return {f"{kind}{n}", f"{kind}{n + 1}"} if ".64" in inst.opcode or ".WIDE" in inst.opcode else {f"{kind}{n}"}


def descriptor_immediates(code: list[SassInstruction], index: int, register: str) -> set[int] | None:
    """The immediates in the backward slice of `register` as instruction `index` reads it: walking back in
    address order, each instruction that writes a register of the slice adds its sources to it (64-bit ops and
    IMAD.WIDE write a pair). None when no instruction before `index` writes `register` at all (it would be read
    as whatever the register held). A straight-line view: enough for descriptors, which kernels build before
    their loops."""
    wanted, values, found = {register}, set(), False
    for inst in reversed(code[:index]):
        hit = _written(inst) & wanted
        if not hit:
            continue
        found = True
        wanted -= hit
        sources = inst.text.split(",", 1)[1] if "," in inst.text else ""
        for reg in _registers(sources):
            wanted.add(reg)
            if ".64" in inst.opcode:
                kind, n = _REGISTER.fullmatch(reg).groups()
                wanted.add(f"{kind}{int(n) + 1}")
        values |= {(-int(v, 16) if sign else int(v, 16)) % 2**32 for sign, v in _IMMEDIATE.findall(sources)}
        wanted -= {"RZ", "URZ"}
        if not wanted:
            break
    return values if found else None


def unset_descriptor_words(code: list[SassInstruction], high_words: set[int]) -> list[str]:
    """Every wgmma (HGMMA, QGMMA, ...) whose descriptors' high words (SBO, base offset, swizzle:
    `wgmma_layouts.MatrixDescriptor`) are not built from one of `high_words`, the ones the kernel's descriptors
    have: A's when A comes from shared memory, B's always. Such a word is whatever its uniform register held, and
    the wgmma reads its operand at the wrong place or faults. ptxas (12.9 and 13.0) dropped A's when the
    descriptor's start was a `mul.wide` of a shuffled warpgroup index (`passes/lowering/wgmma_dot.py` keeps that
    arithmetic 32-bit)."""
    bad = []
    for i, inst in enumerate(code):
        if "GMMA" not in inst.opcode:
            continue
        operands = [o.strip() for o in inst.text.split(None, 2 if inst.text.startswith("@") else 1)[-1].split(",")]
        desc = next((_GDESC.search(o) for o in operands[1:3] if _GDESC.search(o)), None)
        if desc is None:
            continue
        base = int(desc.group(1))
        a_in_registers = not operands[1].startswith("gdesc")
        for operand, high in (("B", base + 3),) if a_in_registers else (("A", base + 1), ("B", base + 3)):
            values = descriptor_immediates(code, i, f"UR{high}")
            if values is None or not values & high_words:
                where = "never written" if values is None else f"built from {sorted(hex(v) for v in values)}"
                bad.append(f"{inst.address:#06x} {inst.text}: {operand} descriptor high word UR{high} {where}")
    return bad
