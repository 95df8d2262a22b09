"""Reading the phase structure of AMDGCN assembly: what each wave does between two `s_barrier`s.

    phases(assembly)            -> [Phase(mfma=8, global_loads=0, lds_reads=4, lds_writes=0, priority=[1, 0]), ...]
    mfmas_outside_priority(asm) -> the v_mfma lines not inside an `s_setprio 1` .. `s_setprio 0` window
    loop_bodies(asm)            -> the instruction lines of each loop (a label .. the branch back to it)

A phase is the text between two consecutive `s_barrier` lines, in the order the assembler laid the code out
(branches included: the two wave groups' loop copies follow each other). Used by the wave-group ping-pong
tests and its report (`bench/attention_amd_pingpong.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MFMA = re.compile(r"^\s*v_mfma_\w+")
GLOBAL_LOAD = re.compile(r"^\s*(global|buffer)_load_\w+")
LDS_READ = re.compile(r"^\s*ds_read\w*")
LDS_WRITE = re.compile(r"^\s*ds_write\w*")
BARRIER = re.compile(r"^\s*s_barrier\b")
SETPRIO = re.compile(r"^\s*s_setprio\s+(\d+)")


@dataclass
class Phase:
    mfma: int = 0
    global_loads: int = 0
    lds_reads: int = 0
    lds_writes: int = 0
    priority: list[int] = field(default_factory=list)     # the s_setprio levels set in it, in order

    def short(self) -> str:
        prio = "".join(f" prio{p}" for p in self.priority)
        return (f"mfma {self.mfma}, global {self.global_loads}, ds_read {self.lds_reads}, "
                f"ds_write {self.lds_writes}{prio}")


def instructions(assembly: str) -> list[str]:
    """The kernel's instruction lines (comments and directives dropped)."""
    lines = []
    for line in assembly.splitlines():
        text = line.split(";")[0].rstrip()
        if text.strip() and not text.strip().startswith(".") and not text.strip().endswith(":"):
            lines.append(text.strip())
    return lines


def phases(assembly: str) -> list[Phase]:
    """The code between consecutive s_barriers (the first phase: before the first one)."""
    out = [Phase()]
    for line in instructions(assembly):
        if BARRIER.match(line):
            out.append(Phase())
            continue
        phase = out[-1]
        if MFMA.match(line):
            phase.mfma += 1
        elif GLOBAL_LOAD.match(line):
            phase.global_loads += 1
        elif LDS_READ.match(line):
            phase.lds_reads += 1
        elif LDS_WRITE.match(line):
            phase.lds_writes += 1
        elif SETPRIO.match(line):
            phase.priority.append(int(SETPRIO.match(line).group(1)))
    return out


def mfmas_outside_priority(assembly: str) -> list[str]:
    """v_mfma lines not between an `s_setprio 1` and the next `s_setprio 0`, and a note for each s_barrier inside
    such a window (a window must stay within one phase)."""
    raised, outside = False, []
    for line in instructions(assembly):
        match = SETPRIO.match(line)
        if match:
            raised = int(match.group(1)) > 0
        elif BARRIER.match(line) and raised:
            outside.append("s_barrier inside an s_setprio 1 window")
        elif MFMA.match(line) and not raised:
            outside.append(line)
    return outside


def barrier_count(assembly: str) -> int:
    return sum(bool(BARRIER.match(line)) for line in instructions(assembly))


def loop_bodies(assembly: str) -> list[list[str]]:
    """The instructions of every loop: from a label to a later conditional branch back to it, in layout order
    (the K loop of a GEMM or the key loop of attention is the longest one)."""
    lines = assembly.splitlines()
    labels, out = {}, []
    for i, line in enumerate(lines):
        label = re.match(r"^(\.LBB\w+):", line)
        if label:
            labels[label.group(1)] = i
        back = re.match(r"^\s*s_cbranch_\w+\s+(\.LBB\w+)", line)
        if back and labels.get(back.group(1), i) < i:
            out.append(instructions("\n".join(lines[labels[back.group(1)]:i + 1])))
    return out


def opcode_counts(lines: list[str]) -> dict[str, int]:
    """How many times each opcode appears in `lines`."""
    counts: dict[str, int] = {}
    for line in lines:
        counts[line.split()[0]] = counts.get(line.split()[0], 0) + 1
    return counts
