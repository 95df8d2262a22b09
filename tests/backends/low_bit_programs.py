"""Low-bit programs every target must compile (`test_low_bit_targets.py` runs them in child processes).

* `roundtrip`: a tile kernel that loads a packed tile, stores it as f32 and
  stores it back packed: the low-bit pass's byte loads and stores, unpacks,
  packs and (on ragged tiles) per-element byte accesses with atomics;
* `register_ops_kernel(dtypes)`: thread IR that puts every op on registers
  of each sub-byte integer and small float: arithmetic (integers), compare
  and select, casts to and from every other type, bitcasts, shuffles, and
  pack_bits / unpack_bits back to it and to 16- and 32-bit floats. Every
  result is folded into one i32 that is stored, so nothing is dead.
"""

from __future__ import annotations

import tessera
from tessera.ir import dtypes as dt
from tessera.ir.thread_ops import SHUFFLE_MODES

from nvptx_programs import SUPPORTED

SMALL_FLOATS = (dt.f8e4m3, dt.f8e5m2, dt.f6e2m3, dt.f6e3m2, dt.f4e2m1, dt.e8m0)
LOW_BIT = tuple(d for d in dt.ALL_DTYPES if d.is_subbyte) + (dt.f8e4m3, dt.f8e5m2, dt.e8m0)
# Every width's own code, but fewer compiles: sm_90a compiles all of LOW_BIT, the other targets these.
REPRESENTATIVES = (dt.u1, dt.i3, dt.u4, dt.i7, dt.f4e2m1, dt.f6e3m2, dt.e8m0)


@tessera.kernel
def roundtrip(w_ptr, out_ptr, copy_ptr, K, N, BK: tessera.constexpr, BN: tessera.constexpr):
    pk, pn = tessera.program_id(0), tessera.program_id(1)
    w = tessera.view(w_ptr, (K, N)).block((BK, BN), (pk, pn)).load()
    tessera.view(out_ptr, (K, N)).block((BK, BN), (pk, pn)).store(w.to(tessera.f32))
    tessera.view(copy_ptr, (K, N)).block((BK, BN), (pk, pn)).store(w)


def roundtrip_signature(dtype: dt.DType, divisible: bool = True) -> str:
    """Sizes known to be multiples of 16 (whole-byte groups: the packed path) or not (the per-element path)."""
    sizes = "i32:16,i32:16" if divisible else "i32,i32"
    return f"*{dtype.name}:16,*f32:16,*{dtype.name}:16,{sizes}"


def register_ops_kernel(dtypes, n: int = 4, warp_size: int = 32) -> str:
    lines, count = [], [0]

    def op(text: str, type_: str) -> str:
        count[0] += 1
        lines.append(f"  %v{count[0]} = {text} : {type_}")
        return f"%v{count[0]}"

    i8s, i32s = f"regs<{n}xi8>", f"regs<{n}xi32>"
    tid = op("thread_id", "i32")
    ptrs = op("splat %p", f"regs<{n}xptr<i8>>")
    where = op("addptr " + ptrs + ", " + op(f"splat {tid}", i32s), f"regs<{n}xptr<i8>>")
    raw = op(f"load {where}", i8s)
    acc = op("constant {value = 0}", i32s)

    def keep(value: str, dtype: dt.DType, scalar: bool = False) -> None:
        nonlocal acc
        if scalar:
            value = op(f"splat {value}", f"regs<{n}x{dtype.name}>")
        wide = op(f"cast {value}", i32s) if dtype != dt.i32 else value
        acc = op(f"xor {acc}, {wide}", i32s)

    for d in dtypes:
        regs = f"regs<{n}x{d.name}>"
        a = op(f"cast {raw}", regs)
        b = op(f"cast {op(f'add {raw}, {raw}', i8s)}", regs)
        if d.is_int:
            for name in ("add", "sub", "mul", "div", "rem", "min", "max", "and", "or", "xor", "shl", "shr"):
                keep(op(f"{name} {a}, {b}", regs), d)
            for name in ("neg", "abs", "not"):
                keep(op(f"{name} {a}", regs), d)
        if d.is_int:
            less = op(f"cmp {a}, {b} {{pred = \"lt\"}}", f"regs<{n}xbool>")
            keep(op(f"select {less}, {a}, {b}", regs), d)
        for other in (*SUPPORTED, *SMALL_FLOATS, dt.i3, dt.u5):
            if other != d:
                keep(op(f"cast {op(f'cast {a}', f'regs<{n}x{other.name}>')}", regs), d)
        for other in (x for x in dt.ALL_DTYPES if x.bits == d.bits and x not in (d, dt.bool_)):
            keep(op(f"bitcast {op(f'bitcast {a}', f'regs<{n}x{other.name}>')}", regs), d)
        x = op(f"extract {a} {{index = 1}}", d.name)
        lane = op("constant {value = 1}", "i32")
        for mode in SHUFFLE_MODES:
            keep(op(f"shuffle {x}, {lane} {{mode = \"{mode}\"}}", d.name), d, scalar=True)
        if (n * d.bits) % 8 == 0:
            data = op(f"pack_bits {a}", f"regs<{n * d.bits // 8}xu8>")
            for to in (d, dt.f16, dt.bf16, dt.f32):
                keep(op(f"unpack_bits {data} {{packed = \"{d.name}\"}}", f"regs<{n}x{to.name}>"), to)
    lines.append(f"  store {where}, {op(f'cast {acc}', i8s)}")
    body = "\n".join(lines)
    return (f"func @register_ops(%p: ptr<i8>) attributes {{num_threads = 128, shared_bytes = 0, "
            f"warp_size = {warp_size}}} {{\n{body}\n  return\n}}\n")
