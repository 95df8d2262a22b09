"""Lane-wise inline assembly -> LLVM `asm` calls, `pack` lanes per call (the op: `ir/asm_ops.py`).

Each call takes `pack` lanes of every operand in one register: side by side
for pack > 1 (lane 0 in the low bits: a `<pack x T>` vector bitcast to an
integer of pack x bits), the value's bits for pack == 1 (f32/f64 as floats
for the `f`/`d` constraints); the result comes back the same way. A thread
whose register count is not a multiple of `pack` pads its last call with
zeros and drops their results.

`problem(op, backend)` is what the validator asks before LLVM sees the
asm: constraint letters the backend knows, and registers as wide as what
they pass. (LLVM does not read PTX asm text; ptxas does, and its complaint
becomes a CompileError at the op. The AMDGPU backend assembles in LLVM, in
a child process whenever a kernel has inline asm, so a rejected
instruction cannot take the user's process down.)
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.asm_ops import parse_constraints
from tessera.ir.types import scalar_dtype

from .codegen_table import codegen_for
from .types import F32, F64, register_type, scalar_type

# constraint letter -> (register widths it holds, whether it holds floats)
REGISTERS = {
    "NVPTX": {"h": ((16,), False), "r": ((32,), False), "l": ((64,), False), "f": ((32,), True), "d": ((64,), True)},
    "AMDGPU": {"v": ((32, 64), False), "s": ((32, 64), False)},
}


def problem(op, backend: str) -> str | None:
    """Why `op` (an inline_asm) cannot go to `backend` (NVPTX, AMDGPU), or None."""
    known = REGISTERS[backend]
    outputs, inputs = parse_constraints(op.attrs["constraints"])
    pack = op.attrs["pack"]
    dtypes = [scalar_dtype(op.result.type), *(scalar_dtype(v.type) for v in op.operands)]
    for letter, dtype in zip([*outputs, *inputs], dtypes):
        if letter not in known:
            return (f"constraint '{letter}' is not a register class of the {backend} backend ({', '.join(known)}): "
                    f"is this asm written for another GPU? Compile it for its own target")
        widths, floats = known[letter]
        width = pack * dtype.bits
        if width not in widths:
            return (f"constraint '{letter}' holds a {' or '.join(map(str, widths))}-bit register, but {pack} "
                    f"{dtype.name} lane(s) per instance make {width} bits; change pack or the constraint")
        if floats and (pack != 1 or not dtype.is_float):
            return f"constraint '{letter}' passes one float, not {pack} {dtype.name} lane(s); use an integer register"
    return None


@codegen_for("inline_asm")
def _inline_asm(lw, op, *operands):
    pack = op.attrs["pack"]
    outputs, inputs = parse_constraints(op.attrs["constraints"])
    out_dtype = scalar_dtype(op.result.type)
    in_dtypes = [scalar_dtype(v.type) for v in op.operands]
    registers = [_register(letter, dtype, pack) for letter, dtype in zip(inputs, in_dtypes)]
    result_register = _register(outputs[0], out_dtype, pack)
    asm = ir.InlineAsm(ir.FunctionType(result_register, registers), op.attrs["asm"], op.attrs["constraints"],
                       side_effect=False)
    result_type = register_type(op.result.type)
    lanes = result_type.count if isinstance(result_type, ir.VectorType) else 1
    values = []
    for start in range(0, lanes, pack):
        packed = [_pack(lw, value, dtype, start, pack, register)
                  for value, dtype, register in zip(operands, in_dtypes, registers)]
        values.extend(_unpack(lw, lw.builder.call(asm, packed), out_dtype, pack))
    if not isinstance(result_type, ir.VectorType):
        return values[0]
    vector = ir.Constant(result_type, ir.Undefined)
    for i in range(lanes):
        vector = lw.builder.insert_element(vector, values[i], ir.Constant(ir.IntType(32), i))
    return vector


def _register(letter: str, dtype: dt.DType, pack: int) -> ir.Type:
    if letter == "f":
        return F32
    if letter == "d":
        return F64
    return ir.IntType(pack * dtype.bits)


def _lane(lw, value: ir.Value, dtype: dt.DType, index: int) -> ir.Value:
    if isinstance(value.type, ir.VectorType):
        if index >= value.type.count:
            return ir.Constant(scalar_type(dtype), 0 if not dtype.is_float else 0.0)
        return lw.builder.extract_element(value, ir.Constant(ir.IntType(32), index))
    return value if index == 0 else ir.Constant(scalar_type(dtype), 0 if not dtype.is_float else 0.0)


def _pack(lw, value: ir.Value, dtype: dt.DType, start: int, pack: int, register: ir.Type) -> ir.Value:
    """Lanes start .. start+pack-1 of `value` in one register of type `register`."""
    lanes = [_lane(lw, value, dtype, start + i) for i in range(pack)]
    if pack == 1:
        lane = lanes[0]
        return lane if lane.type == register else lw.builder.bitcast(lane, register)
    vector = ir.Constant(ir.VectorType(scalar_type(dtype), pack), ir.Undefined)
    for i, lane in enumerate(lanes):
        vector = lw.builder.insert_element(vector, lane, ir.Constant(ir.IntType(32), i))
    return lw.builder.bitcast(vector, register)


def _unpack(lw, register: ir.Value, dtype: dt.DType, pack: int) -> list[ir.Value]:
    element = scalar_type(dtype)
    if pack == 1:
        return [register if register.type == element else lw.builder.bitcast(register, element)]
    vector = lw.builder.bitcast(register, ir.VectorType(element, pack))
    return [lw.builder.extract_element(vector, ir.Constant(ir.IntType(32), i)) for i in range(pack)]
