"""`sink_vector_cones`: recompute cheap vector values in the blocks that use them (optimized LLVM IR text in, out).

Why (AMDGPU): LLVM's LICM hoists every loop-invariant vector value out of the loops, and a value that crosses
blocks costs one register per element there: a splat of a kernel argument (`<32 x i64>` of a stride) holds 64
SGPRs, a `<32 x i1>` bounds mask 32 SGPR pairs (wave64 lane masks), a `<128 x ptr addrspace(3)>` of LDS
addresses 128 VGPRs. Recomputed next to its use, the code generator folds the same value into an operand (a
splat is the scalar itself, base + constant an instruction's immediate offset, a mask one v_cmp), so the
library kernels that spilled hundreds of SGPRs on gfx942 spill (almost) none (bench/amd_registers.py). It
runs after O3, for a kernel whose code spilled (`optimize.compile_llvm` keeps the version that spills less),
and the code is then generated at `CODE_GEN_LEVEL`: LLVM's AMDGPU code generator runs LICM again above "Less",
which would hoist the copies straight back (and a kernel that does not spill keeps "Aggressive": its
code-generation LICM hoists what AMDGPUCodeGenPrepare expands, which the routing kernels need).

What moves: an instruction in `CHEAP` (pure, one instruction per element: no multiplies, which are four for
64-bit elements) that yields a vector or a boolean (any comparison, and/or/xor of i1: on AMD a divergent
boolean is a lane mask in an SGPR pair), used in a block other than its own and not by a phi. Each using block
gets its own copy of it and, recursively, of such operands from other blocks; other operands (scalars, loads,
phis, products) are used as they are: the original's block dominates the use, so they do too. The caller may
add values it knows to be pure (`also`: `reload_arguments.argument_cones`); with `past_barriers`, the part of a
block after a barrier counts as a block, and the originals left unused go (`BARRIERS`). The pass is
plain text processing of the IR LLVM prints (the caller parses and verifies the result). It imports only the
standard library: the compile worker loads it by path.
"""

from __future__ import annotations

import re

CODE_GEN_LEVEL = 1   # LLVM's CodeGenOptLevel::Less: the AMDGPU code generator's own LICM runs only above it
# Within one block, LLVM's default AMDGPU scheduler may compute every lane of a 32-lane mask before the first
# select reads one (32 SGPR pairs at once: attention's window and softcap masks); its register-minimizing
# scheduler does not. It is the last try for a kernel that still spills (`optimize.compile_llvm`).
LOW_PRESSURE_SCHEDULER = "iterative-minreg"

CHEAP = frozenset({"insertelement", "shufflevector", "add", "sub", "or", "and", "xor", "shl", "lshr", "ashr",
                   "icmp", "fcmp", "sext", "zext", "trunc", "select", "getelementptr"})
# Instructions the AMDGPU code generator does not move others across: a value computed before one and used after
# it is live across it, whatever the scheduler does. A tile of booleans read from LDS before a barrier and used
# after it is 32 lane masks (64 SGPRs) held across the barrier; recomputed after it, its bytes are 32 VGPRs until
# the compare next to the use (`sink_vector_cones(past_barriers=True)`).
BARRIERS = ("fence ", "@llvm.amdgcn.s.barrier")
_NAME = r'%(?:"[^"]*"|[-a-zA-Z$._0-9]+)'
_NAME_RE = re.compile(_NAME)
_DEF_RE = re.compile(r"^\s+(" + _NAME + r") = (\w+) (.*)$")
_LABEL_RE = re.compile(r'^([-a-zA-Z$._0-9]+|"[^"]*"):')


def _is_cheap_vector(opcode: str, rest: str) -> bool:
    """Whether the instruction is in `CHEAP` and yields a vector, or is a boolean (a wave64 lane mask on AMD)."""
    if opcode not in CHEAP:
        return False
    if opcode in ("icmp", "fcmp"):                 # every comparison: its result is a lane mask or a vector of them
        return True
    if opcode == "getelementptr":                  # a vector index makes a vector of addresses
        return "<" in rest
    first = rest.split(",")[0]                     # the first operand's type is the result's
    return "<" in first or (opcode in ("and", "or", "xor") and " i1 " in f" {first} ")


def sink_vector_cones(text: str, kernel: str, also: frozenset[str] = frozenset(),
                      past_barriers: bool = False) -> tuple[str, int]:
    """`text` with kernel `kernel`'s cheap cross-block vector values, and the values named in `also` (the
    caller vouches that they are pure), recomputed where used; with `past_barriers`, the part of a block after
    each barrier counts as a block of its own (`BARRIERS`); and how many copies."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith("define") and f"@{kernel}(" in line), None)
    if start is None:
        return text, 0
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    blocks: list[tuple[str | None, list[str]]] = []
    for line in lines[start + 1:end]:
        label = _LABEL_RE.match(line)
        if label:
            blocks.append((line, []))
        else:
            if not blocks:
                blocks.append((None, []))
            blocks[-1][1].append(line)
            if past_barriers and any(b in line for b in BARRIERS):     # what follows is a segment of its own
                blocks.append((None, []))
    defs: dict[str, tuple[int, str]] = {}           # cheap vector value -> (its block, its right-hand side)
    for index, (_, body) in enumerate(blocks):
        for line in body:
            match = _DEF_RE.match(line)
            if match and (_is_cheap_vector(match.group(2), match.group(3)) or match.group(1) in also):
                defs[match.group(1)] = (index, line.split(" = ", 1)[1])
    copies = 0
    taken = set(_NAME_RE.findall("\n".join(lines[start:end])))
    out = lines[:start + 1]
    for index, (label, body) in enumerate(blocks):
        if label is not None:
            out.append(label)
        copied: dict[str, str] = {}

        def local(name: str, emitted: list[str]) -> str:
            """The name of `name`'s value in this block: a copy (emitted first) if it is a foreign cheap vector."""
            nonlocal copies
            if name not in defs or defs[name][0] == index:
                return name
            if name not in copied:
                rhs = _NAME_RE.sub(lambda m: local(m.group(0), emitted), defs[name][1])
                bare = name[2:-1] if name.endswith('"') else name[1:]   # %18 or %"a b": a prefix keeps it valid
                new = f'%"sunk{index}.{bare}"' if name.endswith('"') else f"%sunk{index}.{bare}"
                while new in taken:                                       # a kernel's own value named so
                    new = new[:-1] + '_"' if new.endswith('"') else new + "_"
                taken.add(new)
                emitted.append(f"  {new} = {rhs}")
                copied[name] = new
                copies += 1
            return copied[name]

        for line in body:
            match = _DEF_RE.match(line)
            if match is None or match.group(2) != "phi":   # a phi's operand is used at the end of its predecessor
                emitted: list[str] = []
                lhs, rhs = line.split(" = ", 1) if match else (None, line)
                rhs = _NAME_RE.sub(lambda m: local(m.group(0), emitted), rhs)
                out.extend(emitted)
                line = rhs if lhs is None else f"{lhs} = {rhs}"
            out.append(line)
    if past_barriers:    # the originals the copies replaced go: DAG ISel would merge a copy with its original
        out[start + 1:] = _without_unused(out[start + 1:], set(defs))
    out.extend(lines[end:])
    return ("\n".join(out), copies) if copies else (text, 0)


def _without_unused(body: list[str], pure: set[str]) -> list[str]:
    """`body` without the definitions of values in `pure` that nothing uses (and then their unused operands).
    Why it matters: instruction selection merges identical values of a block, and the merged one keeps the
    first one's place, so a copy made past a barrier would land where its original was."""
    uses: dict[str, int] = {}
    operands = []
    for line in body:
        match = _DEF_RE.match(line)
        names = _NAME_RE.findall(line.split(" = ", 1)[1] if match else line)
        operands.append(names)
        for name in names:
            uses[name] = uses.get(name, 0) + 1
    dead: set[int] = set()
    for i in range(len(body) - 1, -1, -1):      # one sweep up: a user listed above its operand keeps it (safe)
        match = _DEF_RE.match(body[i])
        if match and match.group(1) in pure and not uses.get(match.group(1)):
            dead.add(i)
            for name in operands[i]:
                uses[name] -= 1
    return [line for i, line in enumerate(body) if i not in dead]


def with_kernel_attribute(text: str, kernel: str, attribute: str) -> str:
    """`text` with function attribute `attribute` (`"name"="value"`) added to kernel `kernel`."""
    define = re.search(r"^define [^\n]*@\"?" + re.escape(kernel) + r"\"?\([^\n]*\)([^\n{]*)\{", text, re.M)
    if define is None:
        return text
    group = re.search(r"#(\d+)", define.group(1))
    if group is None:                              # no attribute group: the attribute goes on the line itself
        return text[:define.start(1)] + define.group(1).rstrip() + f" {attribute} " + text[define.end(1):]
    line = re.search(r"^attributes #" + group.group(1) + r" = \{", text, re.M)
    return text[:line.end()] + f" {attribute}" + text[line.end():]
