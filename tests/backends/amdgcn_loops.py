"""The innermost loop of an AMDGCN kernel's assembly: what the loop-shape tests of AMD code read."""

from __future__ import annotations

import re


def loop_body(assembly: str) -> list[str]:
    """The instructions of the kernel's innermost loop: from its label to the branch back to it."""
    lines = [line.strip() for line in assembly.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        back = re.match(r"s_cbranch_\w+ (\.LBB\d+_\d+)", line)
        if back and f"{back.group(1)}:" in lines[:i]:
            return lines[lines.index(f"{back.group(1)}:"):i + 1]
    raise AssertionError("no loop in the kernel")
