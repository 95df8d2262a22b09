"""`reload_kernel_arguments`: read an AMDGPU kernel's arguments again where they are used; `argument_cones`: the
values computed from them alone, to recompute where used (LLVM IR text).

Why: the AMDGPU code generator loads every kernel argument from the kernarg segment once, at the entry, and keeps
it in SGPRs until its last use, and LICM hoists what is computed from the arguments alone (bounds like `T + 63`,
`cdiv`s, an argument's address plus a constant, sign extensions) to the entry too. A persistent kernel (the
one-launch MoE layer: 18 buffers and 9 scalars, each phase of its ticket loop using a few) holds all of it across
the loop, more than the ~100 SGPRs a wave has: each spilled one is a v_writelane at the entry and a v_readlane at
every use. Neither LLVM nor the code generator rematerializes such values across blocks; these passes do, at the
IR level: `sink_vectors.sink_vector_cones(also=argument_cones(...))` recomputes each cone in the blocks using it,
then each block other than the entry gets its own invariant `load` of each argument it uses from the kernarg
segment (a scalar load, served by the scalar cache), and the entry's values are live only in the entry.
`optimize.compile_llvm` tries this last, for a kernel that still spills SGPRs after `sink_vectors`, and keeps it
if it spills less and needs no more scratch; like the sunk code it is generated at `sink_vectors.CODE_GEN_LEVEL`
(no code-generation LICM to hoist the loads back).

Scalars matter as much as pointers: the entry loads four i32 arguments with one s_load_dwordx4, a 128-bit SGPR
range live across the kernel if any of them is. With only the pointers reread, the greedy allocator split and
spilled that range on qwen3's decode plan, rematerialized every use, yet kept the split piece's dead bundled
sub-register copies, so InlineSpiller gave it a 16-byte stack slot nothing reads or writes: with the register
scavenger's emergency slot, 20 bytes of scratch a lane for nothing.

The kernarg layout is the explicit arguments in order, each at its ABI alignment (AMDGPULowerKernelArguments):
pointers of address space 1 take 8 bytes, i32 and float 4, i64 and double 8. A kernel with any other parameter
type (byref, vectors, structs) is left as it is. It imports only the standard library (the compile worker loads
it by path).
"""

from __future__ import annotations

import re

SIZES = {"ptr addrspace(1)": 8, "i32": 4, "float": 4, "i64": 8, "double": 8}
_PARAM_RE = re.compile(r'^(ptr addrspace\(1\)|i32|float|i64|double)(?=\s)[^%]*(%"[^"]*"|%[-a-zA-Z$._0-9]+)$')
_LABEL_RE = re.compile(r'^([-a-zA-Z$._0-9]+|"[^"]*"):')
KERNARG = "%kernarg.segment"


def _parameters(define: str) -> list[str]:
    """The parameters of a `define` line, split at the commas of its parameter list's own level."""
    begin = define.index("(", define.index("@"))
    params, depth, current = [], 0, []
    for char in define[begin + 1:]:
        if char in "([{<":
            depth += 1
        elif char in ")]}>":
            if depth == 0:
                break
            depth -= 1
        if char == "," and depth == 0:
            params.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    last = "".join(current).strip()
    return params + [last] if last else params


def kernarg_layout(define: str) -> dict[str, tuple[str, int]] | None:
    """Parameter name -> (type, byte offset in the kernarg segment) of a kernel's `define` line; None where a
    parameter's type is not one this pass lays out."""
    layout, offset = {}, 0
    for param in _parameters(define):
        match = _PARAM_RE.match(param)
        if match is None or "byref" in param:
            return None
        kind, name = match.groups()
        size = SIZES[kind]
        offset = (offset + size - 1) // size * size
        layout[name] = (kind, offset)
        offset += size
    return layout


# Scalar instructions the code generator emits as one SALU instruction on uniform operands (or folds into an
# address's immediate offset): worth recomputing next to each use rather than keeping their result in an SGPR.
UNIFORM_CHEAP = frozenset({"add", "sub", "mul", "or", "and", "xor", "shl", "lshr", "ashr", "icmp", "sext", "zext",
                           "trunc", "select", "getelementptr"})
DIVISIONS = frozenset({"sdiv", "udiv", "srem", "urem"})    # cheap by a constant (shifts, or a multiply-high)
_NAME = r'%(?:"[^"]*"|[-a-zA-Z$._0-9]+)'
_DEF_RE = re.compile(r"^\s+(" + _NAME + r") = (\w+) (.*)$")
_I64_MUL = re.compile(r"^(?:nuw |nsw )*i64 ")
_CONSTANT_DIVISOR = re.compile(r"^(?:exact )?i32 [^,]+, -?[1-9][0-9]*$")


def _kernel_lines(text: str, kernel: str) -> tuple[list[str], int, int] | None:
    """The lines of `text`, and the indices of kernel `kernel`'s `define` line and closing brace (None if absent)."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines)
                  if line.startswith("define amdgpu_kernel") and re.search(r'@"?' + re.escape(kernel) + r'"?\(', line)),
                 None)
    if start is None:
        return None
    return lines, start, next(i for i in range(start, len(lines)) if lines[i] == "}")


def argument_cones(text: str, kernel: str) -> frozenset[str]:
    """The values of kernel `kernel` computed from its arguments and constants only, by `UNIFORM_CHEAP`
    instructions (scalar ones: a vector's elements are sink_vectors' business), directly or through other such
    values: uniform across the launch, so the code generator keeps each in SGPRs wherever it is live. LICM hoists
    them to the entry (loop bounds, `T + 63`, an argument's address plus an offset, a stride's sign extension);
    recomputed in each block that uses them (`sink_vectors.sink_vector_cones(also=...)`) from reloaded arguments,
    each lives only within its block. A 64-bit multiply (four instructions) is not cheap."""
    found = _kernel_lines(text, kernel)
    if found is None:
        return frozenset()
    lines, start, end = found
    layout = kernarg_layout(lines[start])
    if not layout:
        return frozenset()
    candidates: dict[str, set[str]] = {}
    for line in lines[start + 1:end]:
        match = _DEF_RE.match(line)
        if match is None or match.group(2) not in UNIFORM_CHEAP | DIVISIONS:
            continue
        opcode, rest = match.group(2), match.group(3)
        if "<" in rest or (opcode == "mul" and _I64_MUL.match(rest)) or \
                (opcode in DIVISIONS and not _CONSTANT_DIVISOR.search(rest)):
            continue
        candidates[match.group(1)] = set(re.findall(_NAME, rest))
    cones = set(layout)          # the arguments themselves are the leaves
    grew = True
    while grew:                  # to a fixed point: the text need not list a definition before its uses
        grew = False
        for name, operands in candidates.items():
            if name not in cones and operands <= cones:
                cones.add(name)
                grew = True
    return frozenset(cones - set(layout))


def reload_kernel_arguments(text: str, kernel: str) -> tuple[str, int]:
    """`text` with kernel `kernel`'s arguments loaded from the kernarg segment in each non-entry block that uses
    them; and how many loads it added ((text, 0) if none)."""
    found = _kernel_lines(text, kernel)
    if found is None or KERNARG in text or "@llvm.amdgcn.kernarg.segment.ptr" in text:
        return text, 0
    lines, start, end = found
    layout = kernarg_layout(lines[start])
    if not layout:
        return text, 0
    uses = re.compile("|".join(re.escape(n) + r'(?![-a-zA-Z$._0-9"])' for n in sorted(layout, key=len,
                                                                                     reverse=True)))
    out, loads, entry, local = lines[:start + 1], 0, True, {}
    if not _LABEL_RE.match(lines[start + 1]):
        out.append(f"  {KERNARG} = call ptr addrspace(4) @llvm.amdgcn.kernarg.segment.ptr()")
    for line in lines[start + 1:end]:
        if _LABEL_RE.match(line):
            out.append(line)
            if entry and len(out) == start + 2:       # the entry block's label: the segment pointer goes first
                out.append(f"  {KERNARG} = call ptr addrspace(4) @llvm.amdgcn.kernarg.segment.ptr()")
            else:
                entry, local = False, {}
            continue
        if entry or " = phi " in line or not uses.search(line):
            out.append(line)
            continue

        def reloaded(match: re.Match) -> str:
            nonlocal loads
            name = match.group(0)
            if name not in local:
                kind, offset = layout[name]
                loads += 1
                local[name] = f"%kernarg.reload{loads}"
                out.append(f"  %kernarg.addr{loads} = getelementptr inbounds i8, ptr addrspace(4) {KERNARG}, "
                           f"i64 {offset}")
                out.append(f"  {local[name]} = load {kind}, ptr addrspace(4) %kernarg.addr{loads}, "
                           f"align {SIZES[kind]}, !invariant.load !{{}}")
            return local[name]

        out.append(uses.sub(reloaded, line))
    if not loads:
        return text, 0
    out.extend(lines[end:])
    out.append("declare ptr addrspace(4) @llvm.amdgcn.kernarg.segment.ptr()")
    return "\n".join(out), loads
