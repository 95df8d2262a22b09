"""Unusual but valid kernels: the language's corners, generated from templates with random parameters.

Families: elementwise arithmetic and math on every dtype (1-D and 2-D tiles, (1, N) and (N, 1) shapes, one
element to 16K elements, masked or not, 1 to 32 warps), reductions and scans on every axis, dots on every
operand type the targets have (and some they do not), casts and bitcasts between every pair of dtypes (sub-byte
included), atomics, index arithmetic with odd divisors (`arange % 3`), view blocks with odd shapes and strides,
and loops carrying tiles. Most compile; the rest must be refused as tessera errors. `unusual(rng, name, target)`
is deterministic in `rng`.
"""

from __future__ import annotations

import random

from .cases import Case

FLOATS = ["f16", "bf16", "f32", "f64"]
INTEGERS = ["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"]
SMALL = ["f8e4m3", "f8e5m2", "f6e2m3", "f6e3m2", "f4e2m1", "e8m0", "i1", "i4", "u2", "u4", "u7"]
ALL = FLOATS + INTEGERS + SMALL + ["bool"]
SHAPES = [(1,), (2,), (16,), (32,), (128,), (512,), (1024,), (4096,), (16384,), (1, 1), (1, 64), (64, 1),
          (2, 8), (16, 16), (1, 4096), (4096, 1), (64, 64), (128, 32), (8, 512)]
WARPS = [1, 1, 2, 4, 4, 8, 16, 32]
FLOAT_EXPRESSIONS = ["x + y", "x * y - x", "x / (y + 3.0)", "tessera.maximum(x, y)", "tessera.where(x > y, x, y)",
                     "tessera.exp(x)", "x % (y + 1.0)", "tessera.sqrt(tessera.abs(x))", "-x", "x ** 2",
                     "tessera.tanh(x) * tessera.sigmoid(y)", "tessera.log(tessera.abs(x) + 1.0)", "x // (y + 1.0)"]
INTEGER_EXPRESSIONS = ["x + y", "x * y", "x // (y | 1)", "x % (y | 1)", "x << (y & 7)", "x >> 1", "x ^ y",
                       "x & y", "-x", "tessera.maximum(x, y)", "tessera.where(x > y, x, y)", "tessera.abs(x)", "~x"]
HEADER = "import tessera\n\n\n@tessera.kernel\n"
MAX_ARRAY_ELEMENTS = 1 << 22    # the interpreter's arrays (per pointer): a harness that allocates GiBs fails itself


def unusual(rng: random.Random, name: str, target: str) -> Case:
    """One unusual kernel for `target` (a GPU target, or the interpreter)."""
    family = rng.choice(FAMILIES)
    case = family(rng)
    case.name, case.target = name, target
    case.num_warps = case.num_warps or rng.choice(WARPS)
    assert case.array_elements <= MAX_ARRAY_ELEMENTS, f"{family.__name__}: the harness's arrays would be too big"
    return case


def _offsets(shape: tuple[int, ...]) -> tuple[str, dict, int]:
    """Source lines computing `offs` (row-major offsets of a tile of `shape`), its constexprs, its size."""
    if len(shape) == 1:
        return "    offs = tessera.arange(0, R)\n", {"R": shape[0]}, shape[0]
    return ("    offs = tessera.arange(0, R)[:, None] * C + tessera.arange(0, C)[None, :]\n",
            {"R": shape[0], "C": shape[1]}, shape[0] * shape[1])


def _params(constexprs: dict) -> str:
    return "".join(f", {k}: tessera.constexpr" for k in constexprs)


def elementwise(rng: random.Random) -> Case:
    shape = rng.choice(SHAPES)
    dtype = rng.choice(FLOATS + INTEGERS + ["bool"] + SMALL[:2])
    out = rng.choice([dtype, dtype, rng.choice(ALL)])
    pool = FLOAT_EXPRESSIONS if dtype in FLOATS + SMALL else INTEGER_EXPRESSIONS
    expression = rng.choice(["x & y", "x | y", "x ^ y"]) if dtype == "bool" else rng.choice(pool)
    masked = rng.random() < 0.5
    lines, constexprs, size = _offsets(shape)
    mask = ", mask=offs < n" if masked else ""
    source = (HEADER + f"def k(x_ptr, y_ptr, out_ptr, n{_params(constexprs)}):\n" + lines
              + f"    x = tessera.load(x_ptr + offs{mask})\n    y = tessera.load(y_ptr + offs{mask})\n"
              + f"    tessera.store(out_ptr + offs, ({expression}).to(tessera.{_attr(out)}){mask})\n")
    return Case("", source, "k", f"*{dtype}:16,*{dtype}:16,*{out}:16,i32", constexprs, array_elements=size,
                scalars={3: max(1, size - 3)}, num_warps=0)


def reduction(rng: random.Random) -> Case:
    shape = rng.choice([s for s in SHAPES if len(s) == 2] + [(4, 4), (32, 8)])
    dtype = rng.choice(FLOATS + INTEGERS + ["bool"])
    op = rng.choice(["sum", "max", "min", "argmax", "argmin", "cumsum", "cumprod", "xor_sum"])
    op = "sum" if op == "xor_sum" else op
    axis = rng.choice([0, 1, -1])
    keep = rng.random() < 0.3 and not op.startswith("cum")
    lines, constexprs, size = _offsets(shape)
    keyword = ", keep_dims=True" if keep else ""
    if op.startswith("cum"):
        store = f"    tessera.store(out_ptr + offs, tessera.{op}(x, axis={axis}))\n"
    elif keep or axis in (0,):
        store = (f"    r = tessera.{op}(x, axis={axis}{keyword})\n"
                 + f"    tessera.store(out_ptr + tessera.arange(0, {'C' if axis == 0 else 'R'}), "
                 + f"tessera.reshape(r, ({'C' if axis == 0 else 'R'},)))\n")
    else:
        store = f"    tessera.store(out_ptr + tessera.arange(0, R), tessera.{op}(x, axis={axis}))\n"
    source = (HEADER + f"def k(x_ptr, out_ptr{_params(constexprs)}):\n" + lines
              + "    x = tessera.load(x_ptr + offs)\n" + store)
    out = "i32" if op.startswith("arg") else ("i32" if dtype == "bool" and op != "max" else dtype)
    return Case("", source, "k", f"*{dtype}:16,*{out}:16", constexprs, array_elements=size, num_warps=0)


DOT_TYPES = [("f16", "f32"), ("bf16", "f32"), ("f16", "f16"), ("f32", "f32"), ("i8", "i32"), ("f8e4m3", "f32"),
             ("f8e5m2", "f32"), ("f64", "f64"), ("u8", "i32"), ("f32", "f64")]


def dot(rng: random.Random) -> Case:
    m, n, k = (rng.choice([1, 8, 16, 32, 64, 128]) for _ in range(3))
    operand, accumulator = rng.choice(DOT_TYPES)
    precision = rng.choice(["", "", ", input_precision='tf32'", ", input_precision='ieee'"])
    constexprs = {"M": m, "N": n, "K": k}
    source = (HEADER + f"def k(a_ptr, b_ptr, c_ptr{_params(constexprs)}):\n"
              + "    rm = tessera.arange(0, M)\n    rn = tessera.arange(0, N)\n    rk = tessera.arange(0, K)\n"
              + "    a = tessera.load(a_ptr + rm[:, None] * K + rk[None, :])\n"
              + "    b = tessera.load(b_ptr + rk[:, None] * N + rn[None, :])\n"
              + f"    acc = tessera.zeros((M, N), tessera.{_attr(accumulator)})\n"
              + f"    acc = tessera.dot(a, b, acc{precision})\n"
              + "    tessera.store(c_ptr + rm[:, None] * N + rn[None, :], acc)\n")
    return Case("", source, "k", f"*{operand}:16,*{operand}:16,*{accumulator}:16", constexprs,
                array_elements=max(m, n, k) ** 2, num_warps=0)


def cast(rng: random.Random) -> Case:
    source_type, target_type = rng.choice(ALL), rng.choice(ALL)
    bitcast = rng.random() < 0.3
    shape = rng.choice([(16,), (128,), (1024,), (8, 32)])
    lines, constexprs, size = _offsets(shape)
    call = (f"tessera.cast(x, tessera.{_attr(target_type)}, bitcast=True)" if bitcast
            else f"x.to(tessera.{_attr(target_type)})")
    source = (HEADER + f"def k(x_ptr, out_ptr{_params(constexprs)}):\n" + lines
              + f"    x = tessera.load(x_ptr + offs)\n    tessera.store(out_ptr + offs, {call})\n")
    return Case("", source, "k", f"*{source_type}:16,*{target_type}:16", constexprs, array_elements=size,
                num_warps=0)


def atomic(rng: random.Random) -> Case:
    op = rng.choice(["atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor",
                     "atomic_xchg", "atomic_cas"])
    dtype = rng.choice(["i32", "u32", "i64", "u64", "f32", "f64", "f16", "bf16", "i8"])
    size = rng.choice([1, 16, 128, 1024])
    where = rng.choice(["x_ptr + offs", "x_ptr + offs % 3", "x_ptr"])
    value = "tessera.load(y_ptr + offs)" if where != "x_ptr" else "tessera.sum(tessera.load(y_ptr + offs), axis=0)"
    call = (f"tessera.atomic_cas({where}, {value}, {value})" if op == "atomic_cas"
            else f"tessera.{op}({where}, {value}{', mask=offs < n' if rng.random() < 0.5 and where != 'x_ptr' else ''})")
    source = (HEADER + "def k(x_ptr, y_ptr, out_ptr, n, R: tessera.constexpr):\n"
              + f"    offs = tessera.arange(0, R)\n    old = {call}\n"
              + f"    tessera.store(out_ptr + {'offs' if where != 'x_ptr' else '0'}, old)\n")
    return Case("", source, "k", f"*{dtype}:16,*{dtype}:16,*{dtype}:16,i32", {"R": size}, array_elements=size,
                scalars={3: max(1, size // 2)}, num_warps=0)


def index_arithmetic(rng: random.Random) -> Case:
    divisor = rng.choice([1, 2, 3, 5, 7, 12, 1000, 65537])
    dtype = rng.choice(["i32", "f32", "f16", "i64", "u8", "bf16"])
    size = rng.choice([1, 16, 128, 1024, 4096])
    pattern = rng.choice([f"offs % {divisor}", f"offs // {divisor}", f"(offs * {divisor}) % R",
                          f"R - 1 - offs", f"offs ^ {divisor % 64}", f"(offs >> 2) * {divisor} % R"])
    source = (HEADER + "def k(x_ptr, out_ptr, R: tessera.constexpr):\n    offs = tessera.arange(0, R)\n"
              + f"    x = tessera.load(x_ptr + ({pattern}))\n    tessera.store(out_ptr + ({pattern}), x + x)\n")
    return Case("", source, "k", f"*{dtype}:16,*{dtype}:16", {"R": size}, array_elements=size + 64,
                num_warps=0)        # every pattern stays below R + 64 (the xor flips at most 6 bits)


def view_block(rng: random.Random) -> Case:
    bm, bn = rng.choice([1, 2, 16, 32, 64]), rng.choice([1, 8, 16, 128])
    dtype = rng.choice(FLOATS + INTEGERS + ["f8e4m3", "u4"])
    m, n = rng.choice([1, 7, 33, 64, 100]), rng.choice([1, 9, 64, 130])
    strided = rng.random() < 0.4
    strides = ", (1, M)" if strided else ""
    source = (HEADER + "def k(x_ptr, out_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):\n"
              + "    i = tessera.program_id(0)\n"
              + f"    x = tessera.view(x_ptr, (M, N){strides}).block((BM, BN), (i, 1)).load()\n"
              + "    tessera.view(out_ptr, (M, N)).block((BM, BN), (0, i)).store(x)\n")
    return Case("", source, "k", f"*{dtype}:16,*{dtype}:16,i32,i32", {"BM": bm, "BN": bn},
                array_elements=m * n + 256, scalars={2: m, 3: n}, grid=(2,), num_warps=0)


def loop(rng: random.Random) -> Case:
    size = rng.choice([1, 16, 256, 2048])
    dtype = rng.choice(["f32", "i32", "f16", "f64", "i64"])
    kind = rng.choice(["for", "while", "static"])
    header = {"for": "    for i in range(0, steps):\n", "while": "    i = 0\n    while tessera.sum(acc, axis=0) < steps:\n",
              "static": "    for i in tessera.static_range(4):\n"}[kind]
    step = "        acc = acc + x\n" + ("        i += 1\n" if kind == "while" else "")
    source = (HEADER + "def k(x_ptr, out_ptr, steps, R: tessera.constexpr):\n    offs = tessera.arange(0, R)\n"
              + f"    x = tessera.load(x_ptr + offs)\n    acc = tessera.zeros((R,), tessera.{_attr(dtype)})\n"
              + header + step + "    tessera.store(out_ptr + offs, acc)\n")
    return Case("", source, "k", f"*{dtype}:16,*{dtype}:16,i32", {"R": size}, array_elements=size,
                scalars={2: rng.choice([0, 1, 5])}, num_warps=0)


FAMILIES = [elementwise, elementwise, reduction, dot, cast, atomic, index_arithmetic, view_block, loop]


def _attr(dtype: str) -> str:
    """The tessera attribute that names `dtype` (`bool` is tessera.bool_)."""
    return "bool_" if dtype == "bool" else dtype
