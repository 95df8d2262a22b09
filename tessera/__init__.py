from tessera.ir.dtypes import (
    DType, bool_, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64,
    f8e4m3, f8e5m2, f6e2m3, f6e3m2, f4e2m1, e8m0,
    i1, i2, i3, i4, i5, i6, i7, u1, u2, u3, u4, u5, u6, u7,
)
from tessera.dsl.errors import (
    CompileError, ConstexprError, KernelArgumentError, LoopCarriedTypeError, StaticAssertionError,
    TypeMismatchError, UnknownNameError, UnsupportedSyntaxError,
)
from tessera.dsl.values import constexpr, static_range
from tessera.dsl.function import func
from tessera.dsl.kernel import Kernel, kernel
from tessera.dsl.arguments import reinterpret
from tessera.dsl.stdlib import cdiv, next_power_of_2
from tessera.dsl.language.creation import arange, cast, full, num_programs, program_id, zeros
from tessera.dsl.language.memory import (
    atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or, atomic_xchg, atomic_xor,
    load, store, view,
)
from tessera.dsl.language.math import (
    abs, ceil, cos, erf, exp, exp2, floor, log, log2, maximum, minimum, rsqrt, sigmoid, sin, sqrt, tanh, where,
)
from tessera.dsl.language.shape import broadcast_to, expand_dims, permute, reshape, trans
from tessera.dsl.language.reductions import (
    argmax, argmin, cumprod, cumsum, max, min, reduce, scan, sum,
)
from tessera.dsl.language.linalg import dot
from tessera.dsl.language.debug import device_assert, device_print, static_assert, static_print
