"""Everything an LLVM backend checks before LLVM sees a module.

LLVM aborts the whole process on some bad input (an unknown CPU or feature
string, an instruction the GPU cannot select), so a backend hands it only
modules it knows to be fine: a known target of its vendor, supported
dtypes, ops that have codegen in the target's table, and op attributes
in range. Every problem raises a `CodegenError` naming the kernel, the op,
its source line and the fix.

The checks common to every target live here; the dialect adds its own
(`TargetDialect.unsupported_ops`, `check_op`, `math_support`), and each
backend resolves its targets (`resolve_target` with its vendor). What stays
for LLVM is the fixed set of instruction patterns the codegen produces;
the backends' matrix tests compile every op for every dtype in a child
process to keep that set crash-free.
"""

from __future__ import annotations

import math

import re

from tessera.ir.core import Function, Operation
from tessera.ir.errors import VerifyError
from tessera.ir.ops import OPS, scope_of
from tessera.ir.printer import print_op
from tessera.ir.target import TARGETS, Target, get_target
from tessera.ir.types import PointerType, RegsType, ScalarType, TensorMapType, Type, element_of, scalar_dtype
from tessera.ir.verifier import verify_function

from . import inline_asm
from .dialect import TargetDialect
from .errors import CodegenError
from .small_floats import SMALL_FLOAT_OPS
from .types import SMALL_FLOATS

TERMINATORS = ("yield", "condition", "return")  # Codegen.region handles these itself
_KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VENDOR_NAMES = {"nvidia": ("an NVIDIA", "NVIDIA"), "amd": ("an AMD", "AMD")}


def resolve_target(target: Target | str | None, vendor: str, backend: str, example: str, *, triple: str,
                   cpus: frozenset[str]) -> Target:
    """The `Target` called `target` (or `target` itself), which must be a `vendor` GPU with LLVM `triple` and a
    CPU in `cpus` (the ones the backend has been tested with); CodegenError otherwise."""
    if target is None:
        raise CodegenError(f"no target given: pass target='{example}' (or a Target), or set the function's "
                            "`target` attribute")
    if isinstance(target, str):
        try:
            target = get_target(target)
        except ValueError as e:
            raise CodegenError(str(e)) from None
    if not isinstance(target, Target):
        raise CodegenError(f"target must be a tessera.ir.target.Target or its name, got {target!r}")
    if target.vendor != vendor:
        ours = ", ".join(t for t, d in TARGETS.items() if d.vendor == vendor)
        theirs = _VENDOR_NAMES.get(target.vendor, (f"a {target.vendor}",))[0]
        raise CodegenError(f"target {target.name} is {theirs} GPU; the {backend} backend compiles for "
                            f"{_VENDOR_NAMES[vendor][1]} targets ({ours})")
    if target.llvm_triple != triple:
        raise CodegenError(f"target {target.name} has LLVM triple {target.llvm_triple!r}; expected {triple!r}")
    if target.llvm_cpu not in cpus:
        raise CodegenError(f"target {target.name}: LLVM CPU {target.llvm_cpu!r} is not one the {backend} backend "
                            f"supports ({', '.join(sorted(cpus))})")
    return target


def validate_function(fn: Function, dialect: TargetDialect) -> None:
    """Raise CodegenError unless thread-IR kernel `fn` can be lowered for the dialect's target."""
    _Validator(fn, dialect).run()


class _Validator:
    def __init__(self, fn: Function, dialect: TargetDialect):
        self.fn = fn
        self.dialect = dialect
        self.target = dialect.target

    def fail(self, message: str, op: Operation | None = None) -> CodegenError:
        if op is None:
            return CodegenError(message, kernel=self.fn.name, loc=self.fn.loc)
        return CodegenError(message, kernel=self.fn.name, op=print_op(op), loc=op.loc, op_name=op.name)

    def first_use(self, value) -> Operation | None:
        """The first op reading `value` (a kernel argument): where a refusal of its type is reported, since
        the user can change that line and not the signature's."""
        return next((op for op in self.fn.walk() if any(v is value for v in op.operands)), None)

    def fail_argument(self, message: str, arg) -> CodegenError:
        """A refusal of kernel argument `arg`, located at its first use."""
        use = self.first_use(arg)
        return CodegenError(message, kernel=self.fn.name, loc=use.loc if use is not None else self.fn.loc)

    def run(self) -> None:
        try:
            verify_function(self.fn)
        except VerifyError as e:
            raise self.fail(f"the thread IR is malformed: {e}") from None
        self.function_attributes()
        for arg in self.fn.args:
            self.argument_type(arg)
        for op in self.fn.walk():
            self.op(op)

    # -- the function -------------------------------------------------------------------

    def function_attributes(self) -> None:
        fn, target = self.fn, self.target
        if not _KERNEL_NAME.fullmatch(fn.name):
            raise self.fail(f"kernel name {fn.name!r} is not a valid {self.dialect.name} symbol name (letters, digits, _)")
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
        self.cluster_attribute()
        named = fn.attrs.get("target")
        if named is not None and named != target.name:
            raise self.fail(f"the function was lowered for target {named!r} but is being compiled for "
                            f"{target.name}; lower it again for {target.name}")

    def cluster_attribute(self) -> None:
        """`cluster_dims` (`tessera/ir/cluster_ops.py`): up to three positive ints, at most 16 blocks, on a target
        with clusters; and cluster ops only in a kernel that has one."""
        dims = self.fn.attrs.get("cluster_dims")
        size = 1
        if dims is not None:
            if not isinstance(dims, (tuple, list)) or not 1 <= len(dims) <= 3 or \
                    not all(_is_int(d) and d >= 1 for d in dims):
                raise self.fail(f"attribute cluster_dims must be 1 to 3 positive ints (blocks per cluster along x, "
                                f"y, z), got {dims!r}")
            size = math.prod(dims)
            if size > 16:
                raise self.fail(f"a cluster of {size} blocks ({dims}) is more than the 16 a GPU runs; use smaller "
                                "cluster_dims")
            if size > 1 and not self.target.has("cluster"):
                raise self.fail(f"cluster_dims {tuple(dims)}: {self.target.name} has no thread-block clusters "
                                "(sm_90+); compile for sm_90a, or with cluster_dims (1, 1, 1)")
        if size == 1:
            for op in self.fn.walk():
                if op.name in ("cluster_arrive", "cluster_wait", "mbarrier_arrive_cluster") or \
                        (op.name == "tma_load" and op.attrs.get("multicast")):
                    raise self.fail(f"{op.name} needs a cluster, but the kernel has no cluster_dims (or 1 x 1 x 1): "
                                    "give it cluster_dims", op)

    def argument_type(self, arg) -> None:
        t = arg.type
        if isinstance(t, PointerType) and t.address_space == "global":
            pass                                # every dtype, sub-byte included (passes/low_bit.py)
        elif isinstance(t, ScalarType):
            if t.dtype.is_subbyte:
                named = f" '{arg.name_hint}'" if arg.name_hint else ""
                raise self.fail_argument(f"kernel parameter{named} of sub-byte type {t}: scalars of fewer than 8 bits "
                                         f"have no kernel ABI; pass it as an 8-bit integer and cast it inside the "
                                         f"kernel", arg)
        elif isinstance(t, TensorMapType):
            if not self.target.has("tma"):
                raise self.fail(f"a tensormap parameter needs the Tensor Memory Accelerator (sm_90+), which "
                                f"{self.target.name} lacks; compile for sm_90 or sm_90a")
        else:
            raise self.fail(f"kernel parameter of type {t}: parameters must be scalars or global pointers (or "
                            "tensor maps, on targets with TMA)")

    # -- ops --------------------------------------------------------------------------

    def op(self, op: Operation) -> None:
        if op.name in TERMINATORS:
            return
        dialect = self.dialect
        if op.name in dialect.unsupported_ops:
            raise self.fail(dialect.unsupported_ops[op.name], op)
        if op.name not in dialect.codegen_table:
            level = OPS[op.name].level if op.name in OPS else None
            if level == "tile" and op.name not in ("print", "assert"):
                raise self.fail("this is a tile-level op: lower the function to thread IR before the backend", op)
            raise self.fail(f"op `{op.name}` is not supported by the {dialect.name} backend yet", op)
        for value in [*op.operands, *op.results]:
            self.value_type(value.type, op)
        check = getattr(self, f"op_{op.name}", None)
        if check is not None:
            check(op)
        reason = dialect.check_op(op)
        if reason:
            raise self.fail(reason, op)
        if op.name in OPS and OPS[op.name].numerics == "math" or op.name == "rem" and scalar_dtype(op.results[0].type).is_float:
            reason = dialect.math_support(op.name, scalar_dtype(op.results[0].type))
            if reason:
                raise self.fail(reason, op)

    def value_type(self, t: Type, op: Operation) -> None:
        if isinstance(t, TensorMapType):
            return                      # a parameter (the verifier allows no other); argument_type checked it
        elem = element_of(t)
        if not isinstance(t, (ScalarType, PointerType, RegsType)):
            raise self.fail(f"value of type {t} in thread IR: tiles and views must be lowered to registers first", op)
        if isinstance(elem, ScalarType) and elem.dtype in SMALL_FLOATS and op.name not in SMALL_FLOAT_OPS:
            raise self.fail(f"`{op.name}` on {elem.dtype.name}: {elem.dtype.name} values can only be loaded, "
                            f"stored, moved and cast on the GPU; cast to f32 (or f16/bf16) first", op)

    def op_load(self, op: Operation) -> None:
        self.packed_access(op)
        self.vector_access(op)

    def op_store(self, op: Operation) -> None:
        self.packed_access(op)
        self.vector_access(op)

    def op_atomic_rmw(self, op: Operation) -> None:
        self.packed_access(op)
        self.scope(op)

    def op_load_acquire(self, op: Operation) -> None:
        self.packed_access(op)
        self.scope(op)

    def op_store_release(self, op: Operation) -> None:
        self.packed_access(op)
        self.scope(op)

    def op_atomic_cas(self, op: Operation) -> None:
        self.packed_access(op)
        self.scope(op)

    def scope(self, op: Operation) -> None:
        """An ordered access's or atomic's scope must be one the target has (no clusters before sm_90, none on
        AMD): LLVM would take an unknown syncscope and the assembler refuse it far from the user's line."""
        reason = self.dialect.scope_problem(scope_of(op))
        if reason:
            raise self.fail(reason, op)

    def packed_access(self, op: Operation) -> None:
        pointee = element_of(op.operands[0].type).pointee
        if pointee.is_subbyte:
            raise self.fail(f"`{op.name}` through a pointer to packed {pointee.name} elements: the low-bit pass "
                            f"(tessera.passes.low_bit.unpack_low_bit, part of thread_passes.lower) turns these "
                            f"into byte accesses; run it before the backend", op)

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

    def op_inline_asm(self, op: Operation) -> None:
        reason = inline_asm.problem(op, self.dialect.name)
        if reason:
            raise self.fail(reason, op)

    def op_shuffle(self, op: Operation) -> None:
        width = op.attrs.get("width", 0)
        if width > self.target.warp_size:
            raise self.fail(f"shuffle width {width} exceeds the warp size {self.target.warp_size}", op)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
