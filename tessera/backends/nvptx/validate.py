"""Everything the NVPTX backend checks before LLVM sees a module.

LLVM aborts the whole process on some bad input (an unknown CPU or feature
string, an instruction the GPU cannot select), so the backend hands it only
modules it knows to be fine: a known NVIDIA target, supported dtypes, ops
that have a lowering, and op attributes in range. Every problem raises a
`LoweringError` naming the kernel, the op, its source line and the fix.

What stays for LLVM is the fixed set of instruction patterns the lowerings
produce; `tests/backends/test_nvptx_matrix.py` compiles every op for every
dtype on sm_80 and sm_90a in a child process to keep that set crash-free.
"""

from __future__ import annotations

import re

from tessera.ir import dtypes as dt
from tessera.ir.core import Function, Operation
from tessera.ir.errors import VerifyError
from tessera.ir.ops import MATH_FUNCTIONS, OPS
from tessera.ir.printer import print_op
from tessera.ir.target import TARGETS, Target, get_target
from tessera.ir.types import PointerType, RegsType, ScalarType, Type, element_of, scalar_dtype
from tessera.ir.verifier import verify_function

from .errors import LoweringError
from .llvm_bulk_async import REQUIRED_FEATURES
from .llvm_fp8 import FP8_OPS
from .llvm_ops import math_support
from .llvm_types import FP8, unsupported_dtype_reason
from .llvm_codegen import LOWERINGS  # importing the code generator fills the table

NVPTX_TRIPLE = "nvptx64-nvidia-cuda"
# CPUs and PTX ISA versions LLVM 22 accepts and this backend has been tested with.
SUPPORTED_CPUS = frozenset({"sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a",
                            "sm_120", "sm_120a"})
_PTX_FEATURE = re.compile(r"\+ptx(\d+)")
PTX_VERSIONS = range(70, 91)  # +ptx70 .. +ptx90
TERMINATORS = ("yield", "condition", "return")  # Lowering.region handles these itself
_KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def resolve_target(target: Target | str | None) -> Target:
    """The NVIDIA `Target` to compile for; LoweringError for anything else."""
    if target is None:
        raise LoweringError("no target given: pass target='sm_90a' (or a Target), or set the function's "
                            "`target` attribute")
    if isinstance(target, str):
        try:
            target = get_target(target)
        except ValueError as e:
            raise LoweringError(str(e)) from None
    if not isinstance(target, Target):
        raise LoweringError(f"target must be a tessera.ir.target.Target or its name, got {target!r}")
    if target.vendor != "nvidia":
        nvidia = ", ".join(t for t, d in TARGETS.items() if d.vendor == "nvidia")
        vendor = {"amd": "an AMD"}.get(target.vendor, f"a {target.vendor}")
        raise LoweringError(f"target {target.name} is {vendor} GPU; the NVPTX backend compiles for "
                            f"NVIDIA targets ({nvidia})")
    if target.llvm_triple != NVPTX_TRIPLE:
        raise LoweringError(f"target {target.name} has LLVM triple {target.llvm_triple!r}; expected {NVPTX_TRIPLE!r}")
    if target.llvm_cpu not in SUPPORTED_CPUS:
        raise LoweringError(f"target {target.name}: LLVM CPU {target.llvm_cpu!r} is not one the NVPTX backend "
                            f"supports ({', '.join(sorted(SUPPORTED_CPUS))})")
    for feature in filter(None, target.llvm_features.split(",")):
        match = _PTX_FEATURE.fullmatch(feature)
        if not match or int(match.group(1)) not in PTX_VERSIONS:
            raise LoweringError(f"target {target.name}: LLVM feature {feature!r} is not a PTX ISA version the "
                                f"backend supports (+ptx{PTX_VERSIONS[0]} .. +ptx{PTX_VERSIONS[-1]})")
    return target


def validate_function(fn: Function, target: Target, *, has_libdevice: bool) -> None:
    """Raise LoweringError unless thread-IR kernel `fn` can be lowered for `target`."""
    _Validator(fn, target, has_libdevice).run()


class _Validator:
    def __init__(self, fn: Function, target: Target, has_libdevice: bool):
        self.fn = fn
        self.target = target
        self.has_libdevice = has_libdevice

    def fail(self, message: str, op: Operation | None = None) -> LoweringError:
        if op is None:
            return LoweringError(message, kernel=self.fn.name, loc=self.fn.loc)
        return LoweringError(message, kernel=self.fn.name, op=print_op(op), loc=op.loc)

    def run(self) -> None:
        try:
            verify_function(self.fn)
        except VerifyError as e:
            raise self.fail(f"the thread IR is malformed: {e}") from None
        self.function_attributes()
        for arg in self.fn.args:
            self.argument_type(arg.type)
        for op in self.fn.walk():
            self.op(op)

    # -- the function -------------------------------------------------------------------

    def function_attributes(self) -> None:
        fn, target = self.fn, self.target
        if not _KERNEL_NAME.fullmatch(fn.name):
            raise self.fail(f"kernel name {fn.name!r} is not a valid PTX identifier (letters, digits, _)")
        threads = fn.attrs.get("num_threads")
        if not _is_int(threads) or not 1 <= threads <= target.max_threads_per_block:
            raise self.fail(f"attribute num_threads must be an int in [1, {target.max_threads_per_block}] "
                            f"(threads per block), got {threads!r}")
        warp = fn.attrs.get("warp_size", target.warp_size)
        if warp != target.warp_size:
            raise self.fail(f"attribute warp_size = {warp!r}, but {target.name} has {target.warp_size} threads "
                            f"per warp; lower the function for this target")
        smem = fn.attrs.get("shared_bytes", 0)
        if not _is_int(smem) or not 0 <= smem <= target.shared_memory_bytes:
            raise self.fail(f"attribute shared_bytes must be an int in [0, {target.shared_memory_bytes}] "
                            f"({target.name}'s shared memory per block), got {smem!r}")
        named = fn.attrs.get("target")
        if named is not None and named != target.name:
            raise self.fail(f"the function was lowered for target {named!r} but is being compiled for "
                            f"{target.name}; lower it again for {target.name}")

    def argument_type(self, t: Type) -> None:
        if isinstance(t, PointerType) and t.address_space == "global":
            self.dtype(t.pointee)
        elif isinstance(t, ScalarType):
            self.dtype(t.dtype)
        else:
            raise self.fail(f"kernel parameter of type {t}: parameters must be scalars or global pointers")

    # -- ops --------------------------------------------------------------------------

    def op(self, op: Operation) -> None:
        if op.name in TERMINATORS:
            return
        if op.name not in LOWERINGS:
            level = OPS[op.name].level if op.name in OPS else None
            if level == "tile" and op.name not in ("print", "assert"):
                raise self.fail("this is a tile-level op: lower the function to thread IR before the backend", op)
            raise self.fail(f"op `{op.name}` is not supported by the NVPTX backend yet", op)
        for value in [*op.operands, *op.results]:
            self.value_type(value.type, op)
        feature = REQUIRED_FEATURES.get(op.name)
        if feature is not None and not self.target.has(feature[0]):
            raise self.fail(f"{op.name} needs {feature[1]}, which {self.target.name} lacks; compile for sm_90a or "
                            "lower the kernel for this target without TMA and mbarriers", op)
        check = getattr(self, f"op_{op.name}", None)
        if check is not None:
            check(op)
        if op.name in MATH_FUNCTIONS or op.name == "rem" and scalar_dtype(op.results[0].type).is_float:
            reason = math_support(op.name, scalar_dtype(op.results[0].type), self.has_libdevice)
            if reason:
                raise self.fail(reason, op)

    def value_type(self, t: Type, op: Operation) -> None:
        elem = element_of(t)
        if not isinstance(t, (ScalarType, PointerType, RegsType)):
            raise self.fail(f"value of type {t} in thread IR: tiles and views must be lowered to registers first", op)
        if isinstance(elem, PointerType):
            self.dtype(elem.pointee, op)
        else:
            self.dtype(elem.dtype, op)
            if elem.dtype in FP8 and op.name not in FP8_OPS:
                raise self.fail(f"`{op.name}` on {elem.dtype.name}: fp8 values can only be loaded, stored, moved "
                                f"and cast on the GPU; cast to f32 (or f16/bf16) first", op)

    def dtype(self, d: dt.DType, op: Operation | None = None) -> None:
        reason = unsupported_dtype_reason(d)
        if reason:
            raise self.fail(reason, op)

    def op_load(self, op: Operation) -> None:
        self.vector_access(op)

    def op_store(self, op: Operation) -> None:
        self.vector_access(op)

    def vector_access(self, op: Operation) -> None:
        k = op.attrs.get("vector", 1)
        ptr = op.operands[0].type
        pointee = element_of(ptr).pointee
        if k == 1:
            return
        if k < 1 or k & (k - 1):
            raise self.fail(f"vector = {k} must be a power of two", op)
        if not isinstance(ptr, RegsType) or ptr.count % k:
            raise self.fail(f"vector = {k} needs registers of pointers whose count is a multiple of {k}, got {ptr}",
                            op)
        width = k * max(8, pointee.bits)
        if width > self.target.max_vector_bits:
            raise self.fail(f"vector = {k} of {pointee.name} is a {width}-bit access; {self.target.name} allows at "
                            f"most {self.target.max_vector_bits} bits: use vector = "
                            f"{self.target.max_vector_bits // max(8, pointee.bits)}", op)

    def op_shared_alloc(self, op: Operation) -> None:
        offset, size = op.attrs["offset"], op.attrs["bytes"]
        total = self.fn.attrs.get("shared_bytes", 0)
        if offset < 0:
            raise self.fail("shared memory offset is unassigned (-1): run the shared-memory planner before the "
                            "backend", op)
        if offset + size > total:
            raise self.fail(f"bytes [{offset}, {offset + size}) lie outside the kernel's shared memory "
                            f"(shared_bytes = {total}); raise the function's shared_bytes", op)

    def op_mma_m16n8k16(self, op: Operation) -> None:
        if not self.target.has("mma.sync"):
            raise self.fail(f"mma_m16n8k16 needs mma.sync, which {self.target.name} lacks; lower the kernel for "
                            f"this target (dot then uses FMA)", op)

    def op_ldmatrix(self, op: Operation) -> None:
        if not self.target.has("ldmatrix"):
            raise self.fail(f"ldmatrix needs sm_75+, which {self.target.name} is not; lower the kernel for this "
                            "target (dot operands then go through plain shared-memory loads)", op)

    def op_async_copy(self, op: Operation) -> None:
        self._require_cp_async(op)

    def op_async_commit(self, op: Operation) -> None:
        self._require_cp_async(op)

    def op_async_wait(self, op: Operation) -> None:
        self._require_cp_async(op)

    def _require_cp_async(self, op: Operation) -> None:
        if not self.target.has("cp.async"):
            raise self.fail(f"{op.name} needs cp.async (sm_80+), which {self.target.name} lacks; lower the kernel "
                            "for this target (operands then go through registers)", op)

    def op_shuffle(self, op: Operation) -> None:
        width = op.attrs.get("width", 0)
        if width > self.target.warp_size:
            raise self.fail(f"shuffle width {width} exceeds the warp size {self.target.warp_size}", op)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
