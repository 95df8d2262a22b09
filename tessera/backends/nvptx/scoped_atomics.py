"""Atomics at a scope other than the GPU's: `atom.relaxed.<scope>.global.<op>.<type>` as inline PTX.

LLVM 22's NVPTX backend selects a native `atomicrmw` as a bare `atom.global.<op>` (relaxed, GPU scope)
whatever its syncscope, while the compare-and-swap loop it expands the other atomics into keeps the
syncscope (`atom.relaxed.cta.global.cas.b32`). The GPU scope's atomics are fine that way; a "cta" or
"cluster" one would merely be stronger than asked, but a "sys" one would not be atomic against the host
or a peer GPU. So for the scopes other than "gpu" the instructions PTX has natively (`native_op`) are
written here, one register each, between the fences the LLVM core puts around every `atomic_rmw`
(`fence.acq_rel.<scope>`); an 8- or 16-bit and/or/xor, which LLVM widens to the 32-bit word holding it,
is widened the same way (the word's other bytes or-ed / xor-ed with 0, and-ed with 1s); the rest go to
LLVM. Shared memory is never reached by another block, so its atomics keep LLVM's (GPU-scope) form.
PTX ISA 9.0, "atom": `.sem` and `.scope` need sm_70, `.cluster` sm_90; `.add.noftz.f16` sm_70,
`.add.noftz.bf16` sm_90.
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.target import Target

from ..llvm.types import GLOBAL_ADDRSPACE, memory_type

PTX_SCOPES = {"cta": "cta", "cluster": "cluster", "gpu": "gpu", "sys": "sys"}
_REGISTER = {16: "h", 32: "r", 64: "l"}      # inline-asm constraint of an integer register of these bits


def sm_version(target: Target) -> int:
    """90 for sm_90 and sm_90a: the compute capability the CPU name gives."""
    return int("".join(c for c in target.llvm_cpu[3:] if c.isdigit()))


def native_op(kind: str, dtype: dt.DType, target: Target) -> str | None:
    """The `<op>.<type>` of PTX's own `atom` for atomic `kind` on `dtype`, or None where LLVM expands one."""
    bits = dtype.bits
    if dtype.is_int and bits in (32, 64):
        if kind == "add":
            return f"add.u{bits}"                   # two's complement: the same bits for signed integers
        if kind in ("max", "min"):
            return f"{kind}.{'s' if dtype.kind == 'int' else 'u'}{bits}"
        if kind in ("and", "or", "xor"):
            return f"{kind}.b{bits}"
    if kind == "xchg" and bits in (32, 64) and not dtype.is_bool:
        return f"exch.b{bits}"
    if kind == "add" and dtype in (dt.f32, dt.f64):
        return f"add.f{bits}"
    if kind == "add" and dtype == dt.f16:
        return "add.noftz.f16"
    if kind == "add" and dtype == dt.bf16 and sm_version(target) >= 90:
        return "add.noftz.bf16"
    return None


def scoped_atomic(lw, target: Target, kind: str, dtype: dt.DType, address: ir.Value, value: ir.Value,
                  scope: str) -> ir.Value | None:
    """`atom.relaxed.<scope>.global.<op>` on one register (the old value, in memory form), or None where
    LLVM's `atomicrmw` already has the scope right (GPU scope, shared memory, ops LLVM expands)."""
    if scope == "gpu" or address.type.addrspace != GLOBAL_ADDRSPACE:
        return None
    if kind in ("and", "or", "xor") and dtype.bits < 32:
        return _partword_bitwise(lw, kind, address, value, scope)
    op = native_op(kind, dtype, target)
    if op is None:
        return None
    bld = lw.builder
    word = ir.IntType(dtype.bits)
    letter = _REGISTER[dtype.bits]
    asm = ir.InlineAsm(ir.FunctionType(word, [ir.IntType(64), word]),
                       f"atom.relaxed.{PTX_SCOPES[scope]}.global.{op} $0, [$1], $2;",
                       f"={letter},l,{letter},~{{memory}}", side_effect=True)
    bits = value if dtype.is_int else bld.bitcast(value, word)
    old = bld.call(asm, [bld.ptrtoint(address, ir.IntType(64)), bits])
    return old if dtype.is_int else bld.bitcast(old, memory_type(dtype))


def _partword_bitwise(lw, kind: str, address: ir.Value, value: ir.Value, scope: str) -> ir.Value:
    """An 8- or 16-bit and/or/xor as the 32-bit one on the aligned word that holds it (little-endian)."""
    bld, i32, i64 = lw.builder, ir.IntType(32), ir.IntType(64)
    narrow = value.type
    at = bld.ptrtoint(address, i64)
    word = bld.and_(at, ir.Constant(i64, ~3))
    shift = bld.trunc(bld.shl(bld.and_(at, ir.Constant(i64, 3)), ir.Constant(i64, 3)), i32)
    bits = bld.shl(bld.zext(value, i32), shift)
    if kind == "and":       # every other byte of the word and-ed with 1s
        field = bld.shl(ir.Constant(i32, (1 << narrow.width) - 1), shift)
        bits = bld.or_(bits, bld.xor(field, ir.Constant(i32, -1)))
    asm = ir.InlineAsm(ir.FunctionType(i32, [i64, i32]), f"atom.relaxed.{PTX_SCOPES[scope]}.global.{kind}.b32 $0, "
                       "[$1], $2;", "=r,l,r,~{memory}", side_effect=True)
    old = bld.call(asm, [word, bits])
    return bld.trunc(bld.lshr(old, shift), narrow)
