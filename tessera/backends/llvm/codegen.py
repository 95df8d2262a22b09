"""Thread IR function -> an LLVM module (llvmlite.ir), for any target through its dialect.

    lowered = codegen_function(fn, NvptxDialect(target, use_libdevice=True))
    text = str(lowered.module)

The kernel becomes one function, which the dialect makes a kernel
(`TargetDialect.configure_kernel`: calling convention, launch bounds):

* parameters: pointers are `ptr addrspace(1)`, and `noalias` where the
  function's `noalias` attribute lists them (the launch found their memory
  disjoint from every other pointer argument's; it lets read-only inputs use
  non-coherent loads) and no acquire load reads through them (memory that
  another program of the launch writes is not read-only; LLVM 22's NVPTX
  aborts selecting an acquire load as a non-coherent one), and a pointer to a sub-byte type becomes its bit
  address (i64) on entry; scalars keep their type, except `bool`, which is
  passed as one byte (i8, 0 or 1) like numpy and torch store it; a
  `tensormap` is the address of a by-value parameter, in the form the dialect
  gives it (`TargetDialect.tensor_map_parameter`);
* shared memory is one byte buffer in addrspace(3) that the dialect
  declares on first use (`shared_memory`); `shared_alloc` is a byte offset
  into it.

Values: see `types.py` (regs<N x T> are LLVM vectors, so elementwise
ops apply to them unchanged; a sub-byte integer lives in an i8, and
`emit` wraps the result of every elementwise op that produces one).
Structured control flow becomes basic blocks: `for`/`while` a header with
one phi per carried value, `if` a diamond with one phi per result.

`codegen_function` expects a function that `validate.validate_function` has
accepted; it does not re-check what the validator checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.ops import OPS
from tessera.ir.types import PointerType, ScalarType, TensorMapType, element_of, scalar_dtype

from . import inline_asm, low_bit, memory, ops, thread  # noqa: F401  (register the common codegen)
from .dialect import TargetDialect
from .codegen_table import COMMON as COMMON_CODEGEN
from .codegen_table import codegen_for
from .types import I8, I64, int_constant, is_bit_address, parameter_type, register_type, wrap_sub_byte


@dataclass
class GeneratedModule:
    module: ir.Module
    kernel: str
    library_functions: frozenset[str]   # bitcode-library functions the module calls (libdevice's __nv_*)


def codegen_function(fn: Function, dialect: TargetDialect, *, fp_fusion: bool = False) -> GeneratedModule:
    """The LLVM module of thread-IR kernel `fn` for the dialect's target (validated beforehand)."""
    lw = Codegen(fn, dialect, fp_fusion=fp_fusion)
    lw.lower()
    return GeneratedModule(lw.module, fn.name, frozenset(lw.library_functions))


class Codegen:
    """The state of generating one function's LLVM IR: module, builder, value map and helpers for codegen."""

    def __init__(self, fn: Function, dialect: TargetDialect, *, fp_fusion: bool = False):
        self.fn = fn
        self.dialect = dialect
        self.target = dialect.target
        self.codegen_table = dialect.codegen_table
        # `contract` lets LLVM fuse a*b+c into one fma (one rounding instead of two); a fast-math kernel
        # (`@tessera.kernel(fast_math=True)`) also allows approximate functions and reciprocals (`afn`, `arcp`),
        # and its dialect picks the hardware approximations of math functions (`self.fast_math`).
        self.fast_math = bool(fn.attrs.get("fast_math"))
        self.float_flags = ("contract", "afn", "arcp") if self.fast_math else ("contract",) if fp_fusion else ()
        self.library_functions: set[str] = set()
        self.values: dict[Value, ir.Value] = {}
        self.module = ir.Module(name=fn.name)
        self.module.triple = self.target.llvm_triple
        self.function = self._declare_kernel()
        self.builder = ir.IRBuilder(self.function.append_basic_block("entry"))
        self._shared_memory: ir.GlobalVariable | None = None

    # -- the kernel ------------------------------------------------------------------

    def _declare_kernel(self) -> ir.Function:
        params = [parameter_type(a.type) for a in self.fn.args]
        function = ir.Function(self.module, ir.FunctionType(ir.VoidType(), params), name=self.fn.name)
        self.dialect.configure_kernel(function, self.fn)
        noalias = set(self.fn.attrs.get("noalias", ()))
        acquired = acquired_parameters(self.fn)
        noalias = set() if acquired is None else noalias - acquired
        for index, (arg, param) in enumerate(zip(self.fn.args, function.args)):
            param.name = _llvm_name(arg.name_hint) or "arg"
            if isinstance(arg.type, PointerType) and index in noalias:
                param.add_attribute("noalias")
            if isinstance(arg.type, TensorMapType):
                self.dialect.tensor_map_parameter(param)
        return function

    def lower(self) -> None:
        entry_values = []
        for arg, param in zip(self.fn.args, self.function.args):
            if _is_bool(arg.type):  # bools arrive as a byte
                param = self.builder.icmp_unsigned("!=", param, ir.Constant(I8, 0), name=param.name)
            elif is_bit_address(arg.type):  # a pointer to packed sub-byte elements: its bit address
                param = self.builder.shl(self.builder.ptrtoint(param, I64), ir.Constant(I64, 3), name=param.name)
            entry_values.append(param)
        self.region(self.fn.body, entry_values)
        self.dialect.finish_kernel(self)

    @property
    def shared_memory(self) -> ir.GlobalVariable:
        """The kernel's shared-memory buffer (raw bytes), declared by the dialect on first use."""
        if self._shared_memory is None:
            self._shared_memory = self.dialect.declare_shared_memory(self.module, self.fn)
        return self._shared_memory

    # -- regions and ops ---------------------------------------------------------------

    def region(self, block: Block, args: list[ir.Value]) -> list[ir.Value]:
        """Emit `block` at the builder's position with its arguments bound to `args`;
        returns the LLVM values its terminator (yield / condition) passes on."""
        for arg, value in zip(block.args, args):
            self.values[arg] = value
        for op in block.ops:
            if op.name in ("yield", "condition"):
                return [self.values[v] for v in op.operands]
            if op.name == "return":
                self.builder.ret_void()
                return []
            self.emit(op)
        return []

    def emit(self, op: Operation) -> None:
        result = generate_op(self, op, [self.values[v] for v in op.operands])
        results = result if isinstance(result, list) else [] if result is None else [result]
        for value, llvm_value in zip(op.results, results):
            name = _llvm_name(value.name_hint)
            if name and isinstance(llvm_value, ir.Instruction) and _unnamed(llvm_value):
                llvm_value.name = name
            self.values[value] = llvm_value

    # -- helpers for codegen --------------------------------------------------------------

    def new_block(self, name: str) -> ir.Block:
        return self.function.append_basic_block(name)

    def guarded(self, cond: ir.Value, then: Callable[[], ir.Value | None], default: ir.Value | None = None,
                name: str = "guard") -> ir.Value | None:
        """Run `then` only where the scalar `cond` holds; its value there, `default` otherwise."""
        b = self.builder
        start = b.block
        then_bb, end_bb = self.new_block(f"{name}.then"), self.new_block(f"{name}.end")
        b.cbranch(cond, then_bb, end_bb)
        b.position_at_end(then_bb)
        value = then()
        then_end = b.block
        b.branch(end_bb)
        b.position_at_end(end_bb)
        if value is None:
            return None
        phi = b.phi(value.type)
        phi.add_incoming(value, then_end)
        phi.add_incoming(default, start)
        return phi

    def intrinsic(self, name: str, args, overloads: tuple[ir.Type, ...] = ()) -> ir.Value:
        """Call entry `name` of the target's intrinsics table (with `overloads` for a family)."""
        return self.dialect.intrinsics.call(self.builder, name, args, overloads)

    def call_library(self, function: ir.Function, args) -> ir.Value:
        """Call `function` of a bitcode library that the LLVM optimizer links in (libdevice)."""
        self.library_functions.add(function.name)
        return self.builder.call(function, list(args))

    def map_lanes(self, fn: Callable[..., ir.Value], *operands: ir.Value) -> ir.Value:
        """`fn` applied lane by lane to scalar or vector operands (for scalar-only calls)."""
        first = operands[0]
        if not isinstance(first.type, ir.VectorType):
            return fn(*operands)
        b = self.builder
        result = None
        for i in range(first.type.count):
            index = ir.Constant(ir.IntType(32), i)
            lane = fn(*[b.extract_element(v, index) for v in operands])
            if result is None:
                result = ir.Constant(ir.VectorType(lane.type, first.type.count), ir.Undefined)
            result = b.insert_element(result, lane, index)
        return result


# -- structured control flow --------------------------------------------------------------


@codegen_for("for")
def _for(lw: Codegen, op: Operation, lb, ub, step, *inits):
    b = lw.builder
    signed = scalar_dtype(op.operands[0].type).kind == "int"
    preheader = b.block
    header, body, exit_bb = lw.new_block("for.header"), lw.new_block("for.body"), lw.new_block("for.exit")
    b.branch(header)
    b.position_at_end(header)
    iv = b.phi(lb.type, name="iv")
    carried = [b.phi(v.type) for v in inits]
    for phi, init in zip([iv, *carried], [lb, *inits]):
        phi.add_incoming(init, preheader)
    if signed:  # range(): count up while iv < ub for step > 0, down while iv > ub otherwise
        going_up = b.icmp_signed(">", step, int_constant(step.type, 0))
        cond = b.select(going_up, b.icmp_signed("<", iv, ub), b.icmp_signed(">", iv, ub))
    else:
        cond = b.icmp_unsigned("<", iv, ub)
    b.cbranch(cond, body, exit_bb)
    b.position_at_end(body)
    yielded = lw.region(op.regions[0], [iv, *carried])
    # nsw: the induction variable must not overflow its type (as in C), which
    # lets LLVM widen it and compute trip counts.
    next_iv = b.add(iv, step, name="iv.next", flags=("nsw",) if signed else ())
    latch = b.block
    b.branch(header)
    for phi, value in zip([iv, *carried], [next_iv, *yielded]):
        phi.add_incoming(value, latch)
    b.position_at_end(exit_bb)
    return list(carried)


@codegen_for("if")
def _if(lw: Codegen, op: Operation, cond):
    b = lw.builder
    then_bb, else_bb, merge = lw.new_block("if.then"), lw.new_block("if.else"), lw.new_block("if.end")
    b.cbranch(cond, then_bb, else_bb)
    arms = []
    for bb, region in ((then_bb, op.regions[0]), (else_bb, op.regions[1])):
        b.position_at_end(bb)
        values = lw.region(region, [])
        arms.append((values, b.block))
        b.branch(merge)
    b.position_at_end(merge)
    results = []
    for i, result in enumerate(op.results):
        phi = b.phi(register_type(result.type))
        for values, end in arms:
            phi.add_incoming(values[i], end)
        results.append(phi)
    return results


@codegen_for("while")
def _while(lw: Codegen, op: Operation, *inits):
    b = lw.builder
    before, after = op.regions
    preheader = b.block
    cond_bb, body_bb, exit_bb = lw.new_block("while.cond"), lw.new_block("while.body"), lw.new_block("while.exit")
    b.branch(cond_bb)
    b.position_at_end(cond_bb)
    carried = [b.phi(v.type) for v in inits]
    for phi, init in zip(carried, inits):
        phi.add_incoming(init, preheader)
    flag, *passed = lw.region(before, carried)
    b.cbranch(flag, body_bb, exit_bb)
    b.position_at_end(body_bb)
    yielded = lw.region(after, passed)
    latch = b.block
    b.branch(cond_bb)
    for phi, value in zip(carried, yielded):
        phi.add_incoming(value, latch)
    b.position_at_end(exit_bb)
    return passed  # defined in the block that branches here, so they dominate the exit


# -- small helpers --------------------------------------------------------------------------


def generate_op(lw, op: Operation, operands: list[ir.Value]):
    """The LLVM value(s) of `op` on `operands`: its entry of the target's codegen table, and for an
    elementwise op with a sub-byte integer result (computed on the i8 that holds it) the wrap to its bits."""
    result = lw.codegen_table[op.name](lw, op, *operands)
    wrap = _sub_byte_result(op)
    return result if wrap is None else wrap_sub_byte(lw.builder, result, wrap)


def _sub_byte_result(op: Operation) -> dt.DType | None:
    """The sub-byte integer type of an elementwise op's result (held in an i8 that may need wrapping), else None."""
    if not OPS[op.name].elementwise:
        return None
    d = scalar_dtype(op.results[0].type)
    return d if d is not None and d.is_int and d.is_subbyte else None


def _is_bool(t) -> bool:
    return isinstance(t, ScalarType) and t.dtype == dt.bool_


def _unnamed(value: ir.Instruction) -> bool:
    """llvmlite numbers values created without a name: ".12"."""
    return not value.name or value.name.lstrip(".").isdigit()


def acquired_parameters(fn: Function) -> set[int] | None:
    """Indices of the parameters the pointers of `fn`'s acquire loads derive from, following pointer values only
    (offsets do not change which memory is read); None: any of them, when a pointer comes through a region's
    result or a block argument."""
    params = {arg: i for i, arg in enumerate(fn.args)}
    roots: set[int] = set()
    work = [op.operands[0] for op in fn.walk() if op.name == "load_acquire"]
    seen: set[Value] = set()
    while work:
        value = work.pop()
        if value in seen or not isinstance(element_of(value.type), PointerType):
            continue
        seen.add(value)
        if value in params:
            roots.add(params[value])
            continue
        owner = value.owner
        if not isinstance(owner, Operation) or owner.regions:
            return None
        work.extend(owner.operands)
    return roots


def _llvm_name(hint: str) -> str:
    """A readable LLVM value name from an IR name hint ('' when there is none)."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", hint or "")
