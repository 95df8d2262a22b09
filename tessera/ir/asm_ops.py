"""Inline assembly applied lane by lane (`tessera.inline_asm_elementwise`).

    %y = inline_asm %a, %b {asm = "add.s32 $0, $1, $2;", constraints = "=r,r,r", pack = 1} : tile<128xi32>

The asm computes `pack` lanes per instance: each operand (and the result)
passes `pack` consecutive values of one thread packed into one register
of pack x bits bits. It must be elementwise -- lane k of an instance's
result depends only on lane k of its operands -- which is what makes it an
`elementwise` op (any lanes may be grouped into an instance). Constraints
are LLVM's: the result's first (`=r`), then one per operand; `$0` names the
result and `$1`.. the operands in the asm text. `emulate` (optional) names
a numpy function registered with the CPU interpreter, which cannot run
assembly. The backends check the constraint letters and register widths
for their target before LLVM sees the asm (`backends/llvm/inline_asm.py`).
"""

from __future__ import annotations

import re

from .ops import define, require
from .types import ScalarType, element_of, scalar_dtype, shape_of

PLACEHOLDER = re.compile(r"\$(\d+)")


def parse_constraints(text: str) -> tuple[list[str], list[str]]:
    """(output constraints, input constraints) of an LLVM constraint string, without the '='; ValueError
    when it is not one output followed by inputs."""
    parts = [p.strip() for p in text.split(",")] if text.strip() else []
    outputs = [p[1:] for p in parts if p.startswith("=")]
    inputs = [p for p in parts if not p.startswith("=")]
    if len(outputs) != 1 or not parts[0].startswith("="):
        raise ValueError(f"constraints {text!r} must start with exactly one output, e.g. '=r,r,r' (an output "
                         f"register, then one per operand)")
    if any(not re.fullmatch(r"[a-z]", p) for p in outputs + inputs):
        raise ValueError(f"constraints {text!r}: each must be one register letter (r, l, h, f, d on NVIDIA; v, s "
                         f"on AMD), outputs prefixed with '='")
    return outputs, inputs


def check_asm_text(asm: str, operands: int) -> None:
    """ValueError when the asm names an operand that does not exist ($0 is the result)."""
    for match in PLACEHOLDER.finditer(asm):
        if int(match.group(1)) > operands:
            raise ValueError(f"the asm names ${match.group(1)}, but there are only $0 (the result) to "
                             f"${operands} (the operands)")


def _check_inline_asm(op):
    result = op.results[0].type
    require(isinstance(element_of(result), ScalarType), f"inline_asm yields numbers, got {result}")
    for v in op.operands:
        require(scalar_dtype(v.type) is not None and shape_of(v.type) == shape_of(result),
                f"inline_asm operands must be numbers of the result's shape {shape_of(result)}, got {v.type}")
    pack = op.attrs["pack"]
    require(pack >= 1 and pack & (pack - 1) == 0, f"inline_asm pack must be a power of two, got {pack}")
    try:
        _, inputs = parse_constraints(op.attrs["constraints"])
        check_asm_text(op.attrs["asm"], len(op.operands))
    except ValueError as exc:
        require(False, str(exc))
    require(len(inputs) == len(op.operands),
            f"inline_asm has {len(op.operands)} operands but {len(inputs)} input constraints")


define("inline_asm", "Lane-wise inline assembly for the target: `asm` with LLVM `constraints`, `pack` lanes "
       "per instance (see ir/asm_ops.py).", (1, -1), attrs={"asm": "str", "constraints": "str", "pack": "int"},
       optional_attrs={"emulate": "str"}, check=_check_inline_asm, elementwise=True)
