"""Intrinsic tables: every LLVM intrinsic a backend may call, with its signature.

LLVM does not reject an unknown intrinsic name: it becomes an external
function that only the assembler or linker notices, and an intrinsic the
GPU lacks aborts the process ("Cannot select"). So codegen calls nothing
that is not in its target's `IntrinsicTable` (`call` checks), and each
backend's tests compile every entry, with every overload the backend uses.

* `fixed`: intrinsics with one signature (per target: `llvm.nvvm.*`, `llvm.amdgcn.*`).
* `overloaded`: families whose name takes type suffixes (`llvm.minnum.v4f32`),
  with the overloads the backend instantiates (`examples`). `COMMON_OVERLOADED`
  holds the target-neutral families every backend selects for every dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from llvmlite import ir

from .types import F32, F64, I1, I8, I16, I32, I64, BFloatType, mangle

VOID = ir.VoidType()
F16 = ir.HalfType()
BF16 = BFloatType()
FLOAT_TYPES = (F16, BF16, F32, F64)
INT_TYPES = (I8, I16, I32, I64)


@dataclass(frozen=True)
class Family:
    """Intrinsics named `<name>.<suffix of each overload type>`."""

    signature: Callable[..., tuple[ir.Type, tuple[ir.Type, ...]]]  # overload types -> (return, args)
    examples: tuple[tuple[ir.Type, ...], ...]                      # overloads the backend may use


def vectors(types) -> tuple[tuple[ir.Type], ...]:
    """Each of `types` as a scalar, plus a 4-vector of the last and a 2-vector of the first."""
    return tuple((t,) for t in types) + ((ir.VectorType(types[-1], 4),), (ir.VectorType(types[0], 2),))


def unary(t):
    return t, (t,)


def binary(t):
    return t, (t, t)


def _saturating(r, a):
    return r, (a,)


_SAT_EXAMPLES = tuple((r, a) for r in INT_TYPES for a in FLOAT_TYPES) + (
    (ir.VectorType(I8, 4), ir.VectorType(F32, 4)), (ir.VectorType(I64, 2), ir.VectorType(BF16, 2)))

COMMON_OVERLOADED: dict[str, Family] = {
    # IEEE minNum/maxNum: a NaN operand yields the other one.
    "llvm.minnum": Family(binary, vectors(FLOAT_TYPES)),
    "llvm.maxnum": Family(binary, vectors(FLOAT_TYPES)),
    "llvm.smin": Family(binary, vectors(INT_TYPES)),
    "llvm.smax": Family(binary, vectors(INT_TYPES)),
    "llvm.umin": Family(binary, vectors(INT_TYPES)),
    "llvm.umax": Family(binary, vectors(INT_TYPES)),
    "llvm.abs": Family(lambda t: (t, (t, I1)), vectors(INT_TYPES)),  # i1 false: abs(MIN) = MIN, not poison
    "llvm.fabs": Family(unary, vectors(FLOAT_TYPES)),
    # Correctly rounded sqrt and exact rounding functions; f32/f64 only
    # (narrow floats compute in f32, as the interpreter does).
    "llvm.sqrt": Family(unary, vectors((F32, F64))),
    "llvm.floor": Family(unary, vectors((F32, F64))),
    "llvm.ceil": Family(unary, vectors((F32, F64))),
    # float -> int: NaN -> 0, truncate, saturate.
    "llvm.fptosi.sat": Family(_saturating, _SAT_EXAMPLES),
    "llvm.fptoui.sat": Family(_saturating, _SAT_EXAMPLES),
}


class IntrinsicTable:
    """One target's intrinsics: `fixed` names and `overloaded` families (the common ones included)."""

    def __init__(self, name: str, fixed: dict[str, tuple[ir.Type, tuple[ir.Type, ...]]],
                 overloaded: dict[str, Family]):
        self.name = name
        self.fixed = fixed
        self.overloaded = overloaded

    def declare(self, module: ir.Module, name: str, overloads: tuple[ir.Type, ...] = ()) -> ir.Function:
        """The declaration of entry `name` (a family when `overloads` are given) in `module`."""
        if overloads:
            if name not in self.overloaded:
                raise KeyError(f"{name} is not an overloaded intrinsic in the {self.name} intrinsics table")
            ret, args = self.overloaded[name].signature(*overloads)
            name = overloaded_name(name, overloads)
        elif name in self.fixed:
            ret, args = self.fixed[name]
        else:
            raise KeyError(f"{name} is not in the intrinsics table of {self.name}")
        return get_or_declare(module, name, ret, args)

    def call(self, builder: ir.IRBuilder, name: str, args, overloads: tuple[ir.Type, ...] = (),
             result_name: str = ""):
        """Call entry `name` (with `overloads` for a family)."""
        return builder.call(self.declare(builder.module, name, overloads), list(args), name=result_name)


def overloaded_name(family: str, overloads: tuple[ir.Type, ...]) -> str:
    return ".".join([family, *(mangle(t) for t in overloads)])


def get_or_declare(module: ir.Module, name: str, ret: ir.Type, args: tuple[ir.Type, ...]) -> ir.Function:
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(ret, args), name=name)
