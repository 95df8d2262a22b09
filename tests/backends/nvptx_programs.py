"""Thread-IR text for the NVPTX tests: one kernel per dtype that uses every op the dtype allows.

`every_op_kernel(dtype)` loads registers and a scalar of `dtype`, applies
every elementwise op, math function, comparison, cast (to every supported
dtype and back), bitcast, atomic and shuffle that the type rules allow,
and stores every result at its own address, so none of it is optimized
away before LLVM selects instructions for it.
"""

from __future__ import annotations

from tessera.backends.nvptx.math import math_support as nvptx_math_support
from tessera.ir import dtypes as dt
from tessera.ir.ops import COMPARE_PREDICATES, MATH_FUNCTIONS
from tessera.ir.thread_ops import SHUFFLE_MODES

SUPPORTED = (dt.bool_, dt.i8, dt.i16, dt.i32, dt.i64, dt.u8, dt.u16, dt.u32, dt.u64, dt.f16, dt.bf16, dt.f32, dt.f64)
FP8 = (dt.f8e4m3, dt.f8e5m2)  # loaded, stored and cast only: every other op computes after a cast to f32
ATTRS = "attributes {num_threads = 128, shared_bytes = 0, warp_size = 32}"


class _Text:
    def __init__(self):
        self.lines: list[str] = []
        self.count = 0

    def op(self, text: str, result_type: str | None = None) -> str:
        if result_type is None:
            self.lines.append(f"  {text}")
            return ""
        self.count += 1
        name = f"%v{self.count}"
        self.lines.append(f"  {name} = {text} : {result_type}")
        return name


def every_op_kernel(dtype: dt.DType, n: int = 4, libdevice: bool = True, math_support=None,
                    warp_size: int = 32) -> str:
    """The kernel for `dtype` with `n` registers; without `libdevice`, only the
    math the backend can lower without it (see `nvptx.math.math_support`).
    Another backend passes its own `math_support(name, dtype)` and warp size."""
    d = dtype.name
    regs = f"regs<{n}x{d}>"
    ptrs = f"regs<{n}xptr<{d}>>"
    k = max(1, min(n, 16 // max(1, dtype.bits // 8)))
    t = _Text()
    tid = t.op("thread_id", "i32")
    offsets = t.op(f"pack {', '.join([tid] * n)}", f"regs<{n}xi32>")
    limit = t.op("splat %n", f"regs<{n}xi32>")
    mask = t.op(f"cmp {offsets}, {limit} {{pred = \"lt\"}}", f"regs<{n}xbool>")
    base = t.op("splat %p", ptrs)
    addr = t.op(f"addptr {base}, {offsets}", ptrs)
    a = t.op(f"load {addr}, {mask} {{vector = {k}}}", regs)
    b = t.op(f"load {addr}", regs)
    s = t.op("load %p", d)
    results: list[tuple[str, str]] = [(a, regs), (b, regs)]

    def keep(value: str, type_: str = regs) -> None:
        results.append((value, type_))

    def lowerable(name: str) -> bool:
        if math_support is not None:
            return not dtype.is_float or math_support(name, dtype) is None
        return not dtype.is_float or nvptx_math_support(name, dtype, libdevice) is None

    if not dtype.is_bool:
        for name in ("add", "sub", "mul", "div", "rem", "min", "max"):
            if name != "rem" or lowerable(name):
                keep(t.op(f"{name} {a}, {b}", regs))
        for name in ("neg", "abs"):
            keep(t.op(f"{name} {a}", regs))
        keep(t.op(f"add {s}, %s", d), d)
    if dtype.is_int or dtype.is_bool:
        for name in ("and", "or", "xor"):
            keep(t.op(f"{name} {a}, {b}", regs))
        keep(t.op(f"not {a}", regs))
    if dtype.is_int:
        for name in ("shl", "shr"):
            keep(t.op(f"{name} {a}, {b}", regs))
    if dtype.is_float:  # on the scalar: libdevice code is large, and registers only repeat it per lane
        for name in filter(lowerable, MATH_FUNCTIONS):
            keep(t.op(f"{name} {s}", d), d)
        keep(t.op(f"{'exp' if lowerable('exp') else 'sqrt'} {a}", regs))  # calls lane by lane
    for pred in COMPARE_PREDICATES:
        c = t.op(f"cmp {a}, {b} {{pred = \"{pred}\"}}", f"regs<{n}xbool>")
        keep(t.op(f"select {c}, {a}, {b}", regs))
    for other in SUPPORTED + FP8:
        if other != dtype:
            there = t.op(f"cast {a}", f"regs<{n}x{other.name}>")
            keep(t.op(f"cast {there}", regs))
        if other.bits == dtype.bits and other != dtype:
            there = t.op(f"bitcast {a}", f"regs<{n}x{other.name}>")
            keep(t.op(f"bitcast {there}", regs))
    kinds = ["xchg", "max", "min"] + (["and", "or", "xor"] if not dtype.is_float else [])
    kinds += ["add"] if not dtype.is_bool else []
    for kind in kinds:  # on the scalar pointer; registers only repeat it per lane (with a mask)
        keep(t.op(f"atomic_rmw %p, {s} {{kind = \"{kind}\"}}", d), d)
    keep(t.op(f"atomic_rmw {addr}, {a}, {mask} {{kind = \"{kinds[-1]}\"}}", regs))
    keep(t.op(f"atomic_cas %p, {s}, {s}", d), d)
    keep(t.op(f"atomic_cas {addr}, {a}, {b}", regs))
    keep(t.op("load_acquire %p", d), d)                     # ordered accesses: one register each, any dtype
    keep(t.op(f"load_acquire {addr}, {mask}, {b}", regs))
    t.op(f"store_release %p, {s}")
    t.op(f"store_release {addr}, {a}, {mask}")
    t.op("nanosleep %n")                                   # a run-time value (AMD: a loop of s_sleep)
    t.op(f"nanosleep {t.op('constant {value = 100}', 'i32')}")
    lane = t.op("constant {value = 1}", "i32")
    x = t.op(f"extract {a} {{index = 0}}", d)
    for mode in SHUFFLE_MODES:
        keep(t.op(f"shuffle {x}, {lane} {{mode = \"{mode}\"}}", d), d)
    keep(t.op(f"shuffle {x}, {lane} {{mode = \"bfly\", width = 8}}", d), d)
    # Each result to its own address, so dead-store elimination keeps them all.
    for i, (value, type_) in enumerate(results):
        if type_ == regs:
            shift = t.op(f"constant {{value = {i * n}}}", f"regs<{n}xi32>")
            where = t.op(f"addptr {addr}, {shift}", ptrs)
            t.op(f"store {where}, {value}, {mask} {{vector = {k}}}")
        else:
            where = t.op(f"addptr %p, {t.op(f'constant {{value = {i}}}', 'i32')}", f"ptr<{d}>")
            t.op(f"store {where}, {value}")
    t.op("return")
    attrs = ATTRS.replace("warp_size = 32", f"warp_size = {warp_size}")
    header = f"func @every_op_{d}(%p: ptr<{d}>, %s: {d}, %n: i32) {attrs} {{"
    return "\n".join([header, *t.lines, "}"]) + "\n"
