"""Device-side print and assert on NVIDIA GPUs: the driver's `vprintf`, and `llvm.trap` after a failed assert.

* `print` is one vprintf per thread: "pid (x, y, z) thread t: <prefix> v0 v1 ...", every register of
  every operand (a tile prints, thread by thread, the lanes each holds). Integers print with %d / %u
  (%lld / %llu when 64-bit), bool as 0 / 1, floats as %g of their value, pointers as hex addresses.
* `assert`: a thread where any register of the condition is false prints "pid (x, y, z) thread t:
  device assertion failed at file:line: <message>" and traps, which ends the launch with an error the
  host sees.

vprintf takes the format string and a buffer of the arguments laid out as C varargs (ints widened to 32
bits, floats to double); the buffer is an alloca of the kernel's entry block.
"""

from __future__ import annotations

import itertools

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.types import PointerType, element_of

from ..llvm import small_floats
from ..llvm.intrinsics import get_or_declare
from ..llvm.types import F32, FP8, I8, I32, I64
from .codegen_table import codegen_for

F64 = ir.DoubleType()
_NAMES = itertools.count()


@codegen_for("print")
def _print(lw, op, *values):
    text, args = _header(lw)
    if op.attrs["prefix"]:
        text += " " + op.attrs["prefix"].replace("%", "%%")
    for value, operand in zip(values, op.operands):
        for lane in _lanes(lw, value):
            spec, arg = _printf_argument(lw, lane, element_of(operand.type))
            text += " " + spec
            args.append(arg)
    _vprintf(lw, text + "\n", args)


@codegen_for("assert")
def _assert(lw, op, cond):
    failed = None
    for lane in _lanes(lw, cond):
        false = lw.builder.not_(lane)
        failed = false if failed is None else lw.builder.or_(failed, false)
    where = f" at {op.loc.file}:{op.loc.line}" if op.loc is not None else ""
    message = op.attrs["message"].replace("%", "%%")

    def report() -> None:
        text, args = _header(lw)
        _vprintf(lw, f"{text}: device assertion failed{where}: {message}\n", args)
        lw.intrinsic("llvm.trap", [])
    lw.guarded(failed, report, name="assert")


def _header(lw) -> tuple[str, list[ir.Value]]:
    ids = [lw.intrinsic(f"llvm.nvvm.read.ptx.sreg.ctaid.{axis}", []) for axis in "xyz"]
    return "pid (%d, %d, %d) thread %d", [*ids, lw.intrinsic("llvm.nvvm.read.ptx.sreg.tid.x", [])]


def _lanes(lw, value: ir.Value) -> list[ir.Value]:
    if not isinstance(value.type, ir.VectorType):
        return [value]
    return [lw.builder.extract_element(value, ir.Constant(I32, i)) for i in range(value.type.count)]


def _printf_argument(lw, lane: ir.Value, element) -> tuple[str, ir.Value]:
    """(the printf conversion, the vararg) of one register of type `element`."""
    b = lw.builder
    if isinstance(element, PointerType):
        return "%#llx", b.ptrtoint(lane, I64)
    dtype = element.dtype
    if dtype.is_bool:
        return "%d", b.zext(lane, I32)
    if dtype in FP8:
        return "%g", b.fpext(small_floats.decode(b, lane, dtype), F64)
    if dtype.is_float:
        return "%g", lane if dtype == dt.f64 else b.fpext(lane if dtype != dt.bf16 else b.fpext(lane, F32), F64)
    signed = dtype.kind == "int"
    if dtype.bits == 64:
        return ("%lld" if signed else "%llu"), lane
    if dtype.bits < 32:
        lane = b.sext(lane, I32) if signed else b.zext(lane, I32)
    return ("%d" if signed else "%u"), lane


def _vprintf(lw, text: str, args: list[ir.Value]) -> None:
    module = lw.module
    data = bytearray(text.encode("utf-8") + b"\0")
    string = ir.GlobalVariable(module, ir.ArrayType(I8, len(data)), name=f".tessera.fmt.{next(_NAMES)}")
    string.global_constant, string.linkage, string.initializer = True, "private", ir.Constant(
        ir.ArrayType(I8, len(data)), data)
    vprintf = get_or_declare(module, "vprintf", I32, (ir.PointerType(), ir.PointerType()))
    buffer = ir.Constant(ir.PointerType(), None)
    if args:
        layout = ir.LiteralStructType([a.type for a in args])
        here = lw.builder.block            # codegen appends at the end of the current block
        lw.builder.position_at_start(lw.function.entry_basic_block)
        buffer = lw.builder.alloca(layout)
        lw.builder.position_at_end(here)
        for i, arg in enumerate(args):
            slot = lw.builder.gep(buffer, [ir.Constant(I32, 0), ir.Constant(I32, i)])
            lw.builder.store(arg, slot)
    lw.builder.call(vprintf, [string, buffer])
