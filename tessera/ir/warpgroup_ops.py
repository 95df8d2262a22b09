"""Warpgroup-level thread ops: Hopper's asynchronous wgmma and the fences around it (sm_90a).

A warpgroup is 4 consecutive warps (128 threads, the first a multiple of 128).
`wgmma` multiplies a 64x16 A by a 16xN B, both read from shared memory through
64-bit matrix descriptors (`wgmma_layouts.MatrixDescriptor`, built by
`wgmma_desc`; K-major, or MN-major with `trans_a` / `trans_b`: PTX
imm-trans-a / imm-trans-b = 1, which f16/bf16 allow; an f16/bf16 A may come
from registers instead, 8 per thread in `wgmma_layouts.wgmma_a_fragment()`,
so a product computed in registers feeds the next wgmma without a trip
through shared memory), and adds the product to an f32 accumulator held in the
`wgmma_layouts.wgmma_accumulator(N)` fragment. e4m3 / e5m2 inputs (either mix) run at k = 32,
K-major only. It is asynchronous:

    fence_proxy_async      generic-proxy writes (st.shared, cp.async) to the operands -> visible to wgmma
                           (defined with the other async-proxy ops in `bulk_async_ops`)
    barrier                (every thread's writes, for the whole warpgroup)
    wgmma_fence            order earlier register accesses before the wgmmas below
    %d = wgmma %a, %b, %c  issue; %d may feed only other wgmmas' accumulators until ...
    wgmma_commit           ... the wgmmas issued so far form a group,
    wgmma_wait             and at most `pending` groups remain in flight: %d is ready

Why the fences (PTX ISA 9.7.15.4 "Async Proxy"): wgmma reads shared memory
through the async proxy, so generic-proxy writes to its operands need
`fence.proxy.async` first; and 9.7.15.7.1 (wgmma.fence): a wgmma.fence is
required before the first wgmma of a warpgroup and between other accesses of
its accumulator / A registers and a wgmma using them (chains of same-shape
wgmmas on one accumulator excepted).

The type rules are here; the SIMT semantics are `backends/simt/wgmma.py`
and the PTX `backends/nvptx/warpgroup.py`.
"""

from __future__ import annotations

from . import dtypes as dt
from .layouts import LayoutError
from .ops import READS, SYNCHRONIZES, define, require
from .types import PointerType, RegsType, ScalarType
from .wgmma_layouts import SWIZZLE_MODES, WGMMA_M, WGMMA_NS, MatrixDescriptor, wgmma_k

WGMMA_DTYPES = ("f16", "bf16")              # A and B alike; k16; K- or MN-major
WGMMA_FP8_DTYPES = ("f8e4m3", "f8e5m2")     # A and B in any mix; k32; K-major only
A_REGISTERS = 8                             # elements per thread of a 64 x 16 A slice held in registers
I64 = ScalarType(dt.i64)


def _infer_wgmma(ts, a):
    a_desc, b_desc, acc = ts
    m, n, k = a["m"], a["n"], a["k"]
    x, y = a["dtype"], a.get("dtype_b", a["dtype"])
    fp8 = x in WGMMA_FP8_DTYPES
    require((x in WGMMA_DTYPES and y == x) or (fp8 and y in WGMMA_FP8_DTYPES),
            f"wgmma multiplies f16 x f16, bf16 x bf16 or e4m3/e5m2 x e4m3/e5m2, got dtype = {x!r}, dtype_b = {y!r}")
    want_k = wgmma_k(1 if fp8 else 2)
    require((m, k) == (WGMMA_M, want_k) and n in WGMMA_NS,
            f"wgmma shape is m64nNk{want_k} with N in 8, 16, ..., 256; got m = {m}, n = {n}, k = {k} "
            "(f16/bf16 run at k = 16, e4m3/e5m2 at k = 32)")
    require(not (fp8 and (a.get("trans_a") or a.get("trans_b"))),
            "wgmma transposes only 16-bit operands: e4m3/e5m2 A and B must be K-major (no trans_a / trans_b)")
    a_regs = RegsType(ScalarType(dt.dtype_from_name(x)), A_REGISTERS) if x in WGMMA_DTYPES else None
    require(b_desc == I64 and (a_desc == I64 or a_desc == a_regs),
            f"wgmma reads B through an i64 matrix descriptor (wgmma_desc) and A through one or from registers "
            f"(regs<{A_REGISTERS}x{x}>, f16/bf16 only: the `wgmma_a_fragment()` of a 64 x 16 slice); got "
            f"{a_desc} and {b_desc}")
    require(a_desc == I64 or not a.get("trans_a"), "wgmma with A in registers has no trans_a (the fragment fixes "
                                                   "its layout)")
    offset = a.get("offset")
    if offset is None:
        require(acc == RegsType(ScalarType(dt.f32), n // 2),
                f"wgmma m64n{n}k{k} accumulates into regs<{n // 2}xf32> (the wgmma_accumulator({n}) fragment), "
                f"got {acc}")
    else:       # one fragment of a warpgroup's stack of them, updated in place
        require(isinstance(acc, RegsType) and acc.element == ScalarType(dt.f32) and offset >= 0
                and offset % (n // 2) == 0 and offset + n // 2 <= acc.count,
                f"wgmma with offset = {offset} updates registers {offset}..{offset + n // 2 - 1} of a stack of "
                f"regs<{n // 2}xf32> fragments: the offset must be a multiple of {n // 2} inside the "
                f"accumulator, got {acc}")
    return [acc]


def _infer_desc(ts, a):
    (ptr,) = ts
    require(isinstance(ptr, PointerType) and ptr.address_space == "shared",
            f"wgmma_desc describes a tile in shared memory: its operand is a ptr<T, shared>, got {ptr}")
    require(a["swizzle"] in SWIZZLE_MODES, f"wgmma_desc swizzle is one of {sorted(SWIZZLE_MODES)} bytes, "
                                           f"got {a['swizzle']}")
    try:
        MatrixDescriptor(0, a["lbo"], a["sbo"], a["swizzle"])  # the byte offsets must be encodable
    except LayoutError as e:
        require(False, f"wgmma_desc: {e}")
    return [I64]


def _infer_wait(ts, a):
    require(0 <= a["pending"] <= 7, f"wgmma_wait pending must be in [0, 7], got {a['pending']}")
    return []


def _define(name, doc, operands, **kw):
    return define(name, doc, operands, level="thread", pure=False, **kw)


_define("wgmma_desc", "The 64-bit wgmma matrix descriptor of the tile at shared pointer %p: start address "
        "from %p, leading / stride byte offsets `lbo` / `sbo` and the `swizzle` mode (0, 32, 64 or 128 bytes); "
        "see `wgmma_layouts.WgmmaSmemLayout.descriptor` and `WgmmaTileLayout.descriptor`.", 1,
        attrs={"swizzle": "int", "lbo": "int", "sbo": "int"}, infer=_infer_desc)
_define("wgmma", "D = A @ B + C for a 64xk A and kxN B (in shared memory, read through the i64 descriptors; "
        "K-major, or MN-major where `trans_a` / `trans_b` is set; or, for f16/bf16, A from registers: "
        "regs<8> in the `wgmma_a_fragment()` layout) and the 64xN f32 C held in "
        "`wgmma_accumulator(n)` registers (wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{dtype}.{dtype_b}): "
        "f16 or bf16 at k = 16; e4m3/e5m2 (`dtype_b` for B when it differs, K-major only) at k = 32; every "
        "thread of the warpgroup issues it together. Asynchronous: the result is ready after `wgmma_commit` "
        "and a `wgmma_wait` that retires its group. With `offset`, C is a stack of such fragments and the wgmma "
        "updates the one starting at register `offset`, passing the others through: a warpgroup's several "
        "fragments then stay one value that a loop may carry in flight.", 3,
        attrs={"m": "int", "n": "int", "k": "int", "dtype": "str"},
        optional_attrs={"trans_a": "bool", "trans_b": "bool", "dtype_b": "str", "offset": "int"},
        infer=_infer_wgmma, **READS)
_define("wgmma_fence", "Order this warpgroup's earlier register and shared-memory accesses before the wgmmas that "
        "follow (wgmma.fence.sync.aligned); needed before the first wgmma after the start or a wgmma_wait.", 0,
        infer=lambda ts, a: [], **SYNCHRONIZES)
_define("wgmma_commit", "Close the open group of this warpgroup's wgmmas (wgmma.commit_group.sync.aligned).", 0,
        infer=lambda ts, a: [], **SYNCHRONIZES)
_define("wgmma_wait", "Wait until at most `pending` committed wgmma groups of this warpgroup are in flight "
        "(wgmma.wait_group.sync.aligned); the others' results are then ready.", 0,
        attrs={"pending": "int"}, infer=_infer_wait, **SYNCHRONIZES)
