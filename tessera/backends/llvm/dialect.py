"""`TargetDialect`: what one GPU target's LLVM IR differs in, as hooks the common codegen calls.

The LLVM core lowers every target-neutral op itself (`codegen_table.COMMON`);
where the instruction depends on the GPU it asks the function's dialect:

| hook                      | NVPTX                                  | AMDGPU                                        |
| ------------------------- | -------------------------------------- | --------------------------------------------- |
| `configure_kernel`        | `ptx_kernel`, `"nvvm.maxntid"`         | `amdgpu_kernel`, flat work-group size, COv5   |
| `declare_shared_memory`   | dynamic `extern [0 x i8]` addrspace(3) | static LDS `[shared_bytes x i8]` addrspace(3) |
| `thread_id` / `program_id` / `num_programs` | `%tid`, `%ctaid`, `%nctaid` | workitem/workgroup ids, dispatch packet |
| `barrier`                 | `bar.sync 0`                           | fence + `s_barrier` + fence                   |
| `nanosleep`               | `nanosleep.u32`                        | `s_sleep` (64 clocks a unit), or a loop of them |
| `shuffle_word`            | `shfl.sync` (32-bit)                   | `ds_bpermute` (32-bit)                        |
| `math`, `float_rem`       | libdevice or MUFU approximations       | LLVM intrinsics and expansions                |
| `syncscopes`              | `"block"`, `"cluster"`, `"device"`, `""` | `"workgroup"`, `"agent"`, `""` (no cluster)   |
| `scoped_atomic`           | `atom.relaxed.<scope>` (inline PTX)    | none: LLVM's `atomicrmw` keeps its syncscope  |

A dialect also names its `codegen_table` (the common table plus its own ops),
its `intrinsics` table, and the checks the validator runs for it
(`math_support`, `check_op`, `unsupported_ops`). One instance serves one
compile: it may carry options (NVPTX: whether libdevice is linked).
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.core import Function, Operation
from tessera.ir.op_table import OpTable
from tessera.ir.target import Target

from .intrinsics import IntrinsicTable
from .types import BFloatType

_BF16 = BFloatType()


class TargetDialect:
    """Base class of the per-target hooks; subclasses implement every method that raises here."""

    name: str = "?"                     # "NVPTX", "AMDGPU": how messages name the backend
    codegen_table: OpTable
    intrinsics: IntrinsicTable
    syncscopes: dict[str, str] = {}     # scope (tessera.ir.ops.SCOPES) -> LLVM syncscope ("": system); a scope
                                        # missing here is one the target lacks (`scope_problem` says why)
    unsupported_ops: dict[str, str] = {}  # op name -> why this target has no codegen for it and what to do

    def __init__(self, target: Target):
        self.target = target

    # -- the kernel ----------------------------------------------------------------------

    def configure_kernel(self, function: ir.Function, fn: Function) -> None:
        """Calling convention, attributes and module flags of kernel `function` (lowered from `fn`)."""
        raise NotImplementedError

    def declare_shared_memory(self, module: ir.Module, fn: Function) -> ir.GlobalVariable:
        """The kernel's shared-memory buffer (`shared_alloc` offsets index it as bytes)."""
        raise NotImplementedError

    def tensor_map_parameter(self, param: ir.Argument) -> None:
        """Make `param` (an opaque pointer) a by-value tensor-map parameter; only targets with TMA have one
        (the validator refuses `tensormap` parameters elsewhere)."""
        raise NotImplementedError

    # -- memory scopes -------------------------------------------------------------------

    def syncscope(self, scope: str) -> str:
        """The LLVM syncscope of `scope` ("" is the system's); the validator has refused scopes the target lacks."""
        return self.syncscopes[scope]

    def scope_problem(self, scope: str) -> str | None:
        """Why this target has no `scope` (an ordered access's or atomic's), with the fix; None when it has it."""
        if scope in self.syncscopes:
            return None
        return (f"scope={scope!r} has no meaning on {self.target.name}; use one of "
                f"{', '.join(map(repr, self.syncscopes))}")

    def scoped_atomic(self, lw, kind: str, dtype: dt.DType, address: ir.Value, value: ir.Value,
                      scope: str) -> ir.Value | None:
        """One register's relaxed read-modify-write at `scope` where LLVM's `atomicrmw` would lose the scope
        (the old value, in memory form); None to let `atomicrmw` with the scope's syncscope do it."""
        return None

    # -- thread ops ------------------------------------------------------------------------

    def finish_kernel(self, lw) -> None:
        """Called once the whole kernel is emitted (AMDGPU tags its LDS accesses here); nothing by default."""

    def thread_id(self, lw, reread: bool = False) -> ir.Value:
        """threadIdx.x; `reread`: a read LLVM may not hoist or merge with another, where the target has one."""
        raise NotImplementedError

    def program_id(self, lw, axis: int) -> ir.Value:
        raise NotImplementedError

    def num_programs(self, lw, axis: int) -> ir.Value:
        raise NotImplementedError

    def barrier(self, lw) -> None:
        raise NotImplementedError

    def nanosleep(self, lw, ns: ir.Value) -> None:
        """Sleep about `ns` (an i32) nanoseconds: a hint, never a synchronization."""
        raise NotImplementedError

    def shuffle_word(self, lw, mode: str, word: ir.Value, lane: ir.Value, width: int) -> ir.Value:
        """The i32 `word` of the lane that shuffle `mode` (bfly/idx/up/down) with operand `lane`
        selects, within segments of `width` lanes (the caller splits and joins other widths)."""
        raise NotImplementedError

    # -- math --------------------------------------------------------------------------------

    def math(self, lw, name: str, x: ir.Value) -> ir.Value:
        """Math function `name` (exp, exp2, log, log2, rsqrt, sin, cos, tanh, erf) of f32 or f64 `x`."""
        raise NotImplementedError

    def float_rem(self, lw, a: ir.Value, b: ir.Value) -> ir.Value:
        """fmod(a, b) of f32 or f64 values: the result has a's sign and |result| < |b|, exactly."""
        raise NotImplementedError

    def math_support(self, name: str, dtype: dt.DType) -> str | None:
        """Why math op `name` on `dtype` cannot be lowered for this target (None when it can)."""
        raise NotImplementedError

    def wide_int_to_bf16(self, lw, x: ir.Value, src: dt.DType) -> ir.Value:
        """A 32/64-bit int -> bf16, rounded once (LLVM's `sitofp` promises that; a target overrides
        this where its backend rounds twice)."""
        to = ir.VectorType(_BF16, x.type.count) if isinstance(x.type, ir.VectorType) else _BF16
        return lw.builder.sitofp(x, to) if src.kind == "int" else lw.builder.uitofp(x, to)

    # -- validation ----------------------------------------------------------------------------

    def check_op(self, op: Operation) -> str | None:
        """A target-specific reason `op` cannot be lowered (attributes, features), or None."""
        return None



def add_string_attribute(function: ir.Function, attribute: str) -> None:
    """A `"key"="value"` function attribute (llvmlite accepts only its fixed list unless extended)."""
    function.attributes._known = function.attributes._known | {attribute}
    function.attributes.add(attribute)
