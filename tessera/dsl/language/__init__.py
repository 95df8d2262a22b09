"""The kernel language's builtins (`tessera.load`, `tessera.dot`, ...), one module per family. They may
import `tessera.ir` and the rest of `tessera.dsl`.

Importing this package registers every builtin in `values.BUILTINS`:

    creation     program_id, num_programs, cluster_dims, cluster_rank, cluster_id, arange, zeros, full, cast
    memory       load, store (and their sem=), view (and view.block), atomic_*, nanosleep
    math         exp, exp2, log, log2, sqrt, rsqrt, sin, cos, tanh, erf, sigmoid,
                 floor, ceil, abs, minimum, maximum, where
    shape        reshape, permute, trans, expand_dims, broadcast_to
    reductions   sum, max, min, argmax, argmin, reduce, cumsum, cumprod, scan
    linalg       dot
    scaled       dot_scaled (block-scaled: MXFP8/6/4, NVFP4)
    debug        static_assert, static_print, device_print, device_assert
    layouts      convert_layout (and the `layout=` keyword of zeros, full, load)
    shared       shared (and buf[s], .load, .store), async_copy, async_commit, async_wait, barrier,
                 mbarriers (and bars[s].wait)
    random       rand, randn, randint, randint4x, rand4x, randn4x (Philox4x32-10), umulhi
    hints        multiple_of, max_contiguous, assume
    pointers     pointer_type (for x.to(...): pointers read from memory as i64 addresses)
    algorithms   sort, topk, gather, join, split, interleave, histogram
    asm          inline_asm_elementwise (and asm_emulation, its CPU stand-in)

Each builtin is defined once, with its docstring (the user documentation)
and its typing rules; operators (`a + b`, `x[None, :]`, `x.sum()`) live in
`tessera/dsl/operators.py`.
"""

from . import creation, debug, layouts, linalg, math, memory, reductions, shape  # noqa: F401
from . import algorithms, asm, hints, pointers, random, scaled, shared  # noqa: F401
