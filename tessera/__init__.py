"""Tessera: a Python DSL and compiler for tile-based GPU kernels; this module is its public API. It may
import every package below it (dsl, ir, backends.interp, runtime, version), and nothing imports it but
kernels_lib, users and the tests.

The public API, in one place:

* `kernel`, `func`, `constexpr`, `static_range`, `pipeline` — writing kernels;
* the language builtins (`program_id`, `arange`, `load`, `store`, `view`,
  `dot`, `sum`, `exp`, ...), each defined once in `tessera/dsl/language/`;
* the data types (`f32`, `bf16`, `f8e4m3`, `u4`, ...) from `tessera/ir/dtypes.py`;
* pointers as values: `pointer_type(dtype)` for `addr.to(...)`, and the host helper
  `addresses(arrays)` for arrays of pointers (`tessera/dsl/language/pointers.py`);
* `inline_asm_elementwise` (PTX / AMDGCN, validated before LLVM) and `asm_emulation`
  (`tessera/dsl/language/asm.py`);
* tile algorithms: `sort`, `topk`, `gather`, `join`, `split`, `interleave`, `histogram`
  (`tessera/dsl/language/algorithms.py`);
* hints the compiler trusts and the interpreter checks (`multiple_of`,
  `max_contiguous`, `assume`; `tessera/dsl/language/hints.py`);
* random numbers (`rand`, `randn`, `randint`, `randint4x`, ...: Philox4x32-10, Triton's
  stream) and `umulhi` (`tessera/dsl/language/random.py`);
* explicit shared memory and async copies (`shared`, `async_copy`,
  `async_commit`, `async_wait`, `barrier`, `mbarriers` and `bars[s].wait`;
  `tessera/dsl/language/shared.py`);
* `fusion()`, which captures kernel launches in a `with` block and runs them fused where the fusion
  pass (`tessera/passes/fusion/`) proves it safe, `writes_whole`, which a library op uses to
  declare that its launch writes a whole output, and `capturing()`, which says whether a capture is
  recording (`tessera/dsl/capture.py`); `launching_directly()`, whether launches run as they are called
  (what a library op that replays prepared launches checks first: `tessera/dsl/fast_launch.py`);
* `layouts`, the register-layout algebra (`tessera/ir/layouts.py`), whose
  values `convert_layout` and the `layout=` keywords pin on tiles;
* `Kernel.compile(...)`, which runs the compile driver (`tessera/dsl/compiler.py`:
  tile passes -> thread passes -> a backend; README's architecture paragraph
  maps the packages);
* `get_target(name)`, the description of a GPU target (`tessera/ir/target.py`: warp size, shared memory /
  LDS per block, features), which library plans read their target's capacities from;
* `CompileError` and friends, which every user mistake raises;
  `InterpreterError`, raised by the CPU interpreter for bad memory accesses
  and failed device asserts; `LaunchError`, for GPU launches that cannot run.
"""
# ruff: noqa: F401  (this module re-exports)

from .version import __version__

from .ir.dtypes import (
    DType, bool_, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64,
    f8e4m3, f8e5m2, f6e2m3, f6e3m2, f4e2m1, e8m0,
    i1, i2, i3, i4, i5, i6, i7, u1, u2, u3, u4, u5, u6, u7,
)
from .dsl.errors import (
    CompileError, ConstexprError, KernelArgumentError, LoopCarriedTypeError, StaticAssertionError,
    TypeMismatchError, UnknownNameError, UnsupportedSyntaxError,
)
from .backends.interp import InterpreterError
from .runtime.errors import LaunchError
from .passes.errors import PipelineWarning
from .dsl.values import constexpr, pipeline, static_range
from .dsl.function import func
from .dsl.kernel import Kernel, kernel
from .dsl.arguments import addresses, reinterpret
from .dsl.language.pointers import pointer_type
from .dsl.stdlib import cdiv, next_power_of_2
from .dsl.language.creation import (
    arange, cast, cluster_dims, cluster_id, cluster_rank, full, num_programs, program_id, zeros,
)
from .dsl.language.memory import (
    atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or, atomic_xchg, atomic_xor,
    load, nanosleep, store, view,
)
from .dsl.language.math import (
    abs, ceil, cos, erf, exp, exp2, floor, log, log2, maximum, minimum, rsqrt, sigmoid, sin, sqrt, tanh, where,
)
from .dsl.language.shape import broadcast_to, expand_dims, permute, reshape, trans
from .dsl.language.reductions import (
    argmax, argmin, cumprod, cumsum, max, min, reduce, scan, sum,
)
from .dsl.language.linalg import dot
from .dsl.language.scaled import dot_scaled
from .dsl.language.debug import device_assert, device_print, static_assert, static_print
from .dsl.language.layouts import convert_layout
from .dsl.language.shared import async_commit, async_copy, async_wait, barrier, mbarriers, shared
from .dsl.language.random import rand, rand4x, randint, randint4x, randn, randn4x, umulhi
from .dsl.language.hints import assume, max_contiguous, multiple_of
from .dsl.language.algorithms import gather, histogram, interleave, join, sort, split, topk
from .dsl.language.asm import asm_emulation, inline_asm_elementwise
from .ir import layouts
from .ir.target import Target, get_target
from .dsl.autotune import Config, autotune
from .dsl.capture import capturing, fusion, writes_whole
from .dsl.fast_launch import launching_directly
from .dsl import tracebacks as _tracebacks

_tracebacks.install()
