"""Thread-level ops: what one thread of a block does, after lowering.

In thread IR every value is per thread. A tile of the tile IR becomes a
`regs<N x T>` value (the N elements this thread holds under the tile's
layout); elementwise ops, loads and stores keep their tile-IR names and
apply register by register. The ops here are the ones that only make sense
per thread: where the thread is, moving registers in and out of register
arrays, talking to other lanes (shuffles, and the warp-wide tensor-core
`mma` and AMD's wave-wide `mfma`), shared memory and barriers.

Registered into the same op table as the tile ops (`ops.OPS`).
"""

from __future__ import annotations

from . import dtypes as dt
from .mfma_layouts import MFMA_F8F6F4_SHAPES, MFMA_FP8_SHAPES, MFMA_SHAPES, WAVE, is_mfma_shape, mfma_accepts
from .mma_layouts import LDMATRIX_ELEMENTS, MMA_SHAPES, WARP as MMA_WARP, mma_accepts
from .ops import READS, SYNCHRONIZES, WRITES, define, require
from .types import PointerType, RegsType, ScalarType

SHUFFLE_MODES = ("bfly", "idx", "up", "down")


def _infer_pack(ts, a):
    first = ts[0]
    require(isinstance(first, (ScalarType, PointerType)), f"pack takes scalars, got {first}")
    require(all(t == first for t in ts), f"pack operands must share one type, got {', '.join(map(str, ts))}")
    return [RegsType(first, len(ts))]


def _infer_extract(ts, a):
    regs = ts[0]
    require(isinstance(regs, RegsType), f"extract needs registers, got {regs}")
    require(0 <= a["index"] < regs.count, f"extract index {a['index']} out of range for {regs}")
    return [regs.element]


def _infer_shuffle(ts, a):
    value, lane = ts
    require(a["mode"] in SHUFFLE_MODES, f"shuffle mode must be one of {SHUFFLE_MODES}, got {a['mode']!r}")
    require(isinstance(value, ScalarType) and value.dtype.bits <= 64,
            f"shuffle moves one scalar of at most 64 bits, got {value}")
    require(lane == ScalarType(dt.i32), f"shuffle lane must be i32, got {lane}")
    width = a.get("width", 0)
    require(width == 0 or (width > 0 and width & (width - 1) == 0), f"shuffle width must be a power of two, got {width}")
    return [value]


def _infer_mma(ts, a):
    x, y, acc = ts
    shape = (a["m"], a["n"], a["k"])
    name = "mma m{}n{}k{}".format(*shape)
    require(shape in MMA_SHAPES, f"mma shape (m, n, k) = {shape} is not one of {list(MMA_SHAPES)}")
    counts = (a["m"] * a["k"] // MMA_WARP, a["k"] * a["n"] // MMA_WARP, a["m"] * a["n"] // MMA_WARP)
    require(all(isinstance(t, RegsType) and isinstance(t.element, ScalarType) for t in ts)
            and (x.count, y.count, acc.count) == counts,
            f"{name} takes regs<{counts[0]}>, regs<{counts[1]}>, regs<{counts[2]}> (the A, B, C fragments), "
            f"got {x}, {y}, {acc}")
    require(mma_accepts(shape, x.element.dtype, y.element.dtype, acc.element.dtype),
            f"{name} has no instruction for {x.element} x {y.element} accumulating in {acc.element} (it takes "
            "f32 (as tf32) -> f32 at k8; f16, bf16 -> f32 at k16; i8, u8 -> i32 and e4m3/e5m2 -> f32 at k32)")
    return [acc]


def _shapes(shapes) -> str:
    return ", ".join("x".join(map(str, shape)) for shape in shapes)


def _infer_mfma(ts, a):
    x, y, acc = ts
    shape = (a["m"], a["n"], a["k"])
    require(is_mfma_shape(shape), f"mfma shape (m, n, k) = {shape} is not one of "
                                  f"{list(MFMA_SHAPES + MFMA_F8F6F4_SHAPES)}")
    count, per_lane = a["m"] * a["n"] // WAVE, a["m"] * a["k"] // WAVE    # per_lane: 4, 8 (wide, fp8), 32 (f8f6f4)
    require(all(isinstance(t, RegsType) for t in ts) and (x.count, y.count, acc.count) == (per_lane, per_lane, count),
            f"mfma {a['m']}x{a['n']}x{a['k']} takes regs<{per_lane}>, regs<{per_lane}>, regs<{count}> (the A, B, C "
            f"fragments), got {x}, {y}, {acc}")
    require(isinstance(x.element, ScalarType) and isinstance(y.element, ScalarType)
            and mfma_accepts(shape, x.element.dtype, y.element.dtype),
            f"mfma {a['m']}x{a['n']}x{a['k']} has no instruction for {x.element} x {y.element} (it multiplies f16 "
            f"or bf16 fragments of one dtype, and e4m3/e5m2 in any mix at {_shapes(MFMA_FP8_SHAPES)})")
    require(acc.element == ScalarType(dt.f32), f"mfma accumulates in f32, got {acc.element}")
    return [acc]


LDS_READ_TR_ROW = 4       # 16-bit elements each lane of ds_read_b64_tr_b16 addresses (and receives)


def _infer_ldmatrix(ts, a):
    (row,) = ts
    require(a["num"] in (1, 2, 4), f"ldmatrix loads 1, 2 or 4 matrices, got num = {a['num']}")
    require(isinstance(row, PointerType) and row.address_space == "shared" and row.pointee in LDMATRIX_ELEMENTS,
            "ldmatrix reads 16-byte rows of shared memory: its operand is a ptr<T, shared> with T one of "
            f"{', '.join(d.name for d in LDMATRIX_ELEMENTS)}, got {row}")
    require(not a["trans"] or row.pointee.bits == 16,
            f"ldmatrix .trans transposes 16-bit elements; {row.pointee.name} rows can only be read plain")
    return [RegsType(ScalarType(row.pointee), a["num"] * 32 // row.pointee.bits)]


def _infer_lds_read_tr(ts, a):
    (row,) = ts
    require(isinstance(row, PointerType) and row.address_space == "shared" and row.pointee.bits == 16,
            "lds_read_tr (ds_read_b64_tr_b16) reads 8-byte rows of 16-bit elements from LDS: its operand is a "
            f"ptr<T, shared> with T a 16-bit type, got {row}")
    return [RegsType(ScalarType(row.pointee), LDS_READ_TR_ROW)]


def _infer_stmatrix(ts, a):
    row, regs = ts
    require(a["num"] in (1, 2, 4), f"stmatrix stores 1, 2 or 4 matrices, got num = {a['num']}")
    require(isinstance(row, PointerType) and row.address_space == "shared" and row.pointee.bits == 16,
            f"stmatrix writes 16-byte rows of 16-bit elements to shared memory: its first operand is a "
            f"ptr<T, shared> with T a 16-bit type, got {row}")
    require(isinstance(regs, RegsType) and regs.element == ScalarType(row.pointee) and regs.count == 2 * a["num"],
            f"stmatrix x{a['num']} stores regs<{2 * a['num']} x {row.pointee.name}> (two elements per matrix), "
            f"got {regs}")
    return []


def _check_shared_alloc(op):
    require(len(op.results) == 1, "shared_alloc has one result")
    t = op.results[0].type
    require(isinstance(t, PointerType) and t.address_space == "shared",
            f"shared_alloc produces a shared-memory pointer, got {t}")
    require(op.attrs["bytes"] > 0, "shared_alloc needs a positive size")
    require(op.attrs["offset"] >= -1, "shared_alloc offset is -1 (unassigned) or a byte offset")


def define_thread_op(name: str, doc: str, operands, **kw):
    return define(name, doc, operands, level="thread", **kw)


define_thread_op("thread_id", "Index of this thread in its block (threadIdx.x), i32; `reread`: read again where it "
                 "stands, never hoisted or merged by LLVM (a volatile read on NVIDIA; `rematerialize_index.py`).", 0,
                 optional_attrs={"reread": "bool"}, infer=lambda ts, a: [ScalarType(dt.i32)])
define_thread_op("pack", "A register array from scalars, in order.", (1, -1), infer=_infer_pack)
define_thread_op("extract", "Register `index` of a register array.", 1, attrs={"index": "int"}, infer=_infer_extract)
define_thread_op("shuffle", "The operand as held by another lane of the warp (shfl.sync: bfly/idx/up/down; "
                           "`width` splits the warp into segments).", 2,
       attrs={"mode": "str"}, optional_attrs={"width": "int"}, infer=_infer_shuffle)
define_thread_op("mma", "D = A @ B + C for one m x k A, k x n B and m x n C, each spread over the 32 lanes of a "
                 "warp in the `mma_layouts.mma_fragments(m, n, k)` fragments (mma.sync.aligned.m{m}n{n}k{k}.row.col; "
                 "the dtypes are the operands': m16n8k8 f32 inputs are read as tf32, rounded to nearest with ties "
                 "away from zero like cvt.rna.tf32.f32; m16n8k16 f16/bf16 -> f32; m16n8k32 i8/u8 -> i32 (wrapping) "
                 "and e4m3/e5m2 (either mix) -> f32); every lane of the warp must execute it together.", 3,
                 attrs={"m": "int", "n": "int", "k": "int"}, infer=_infer_mma)
define_thread_op("mfma", "D = A @ B + C for one m x k A, k x n B and m x n f32 C ((m, n, k) = (32, 32, 8) or (16, 16, "
                 "16); (32, 32, 16) or (16, 16, 32) on targets with \"mfma.wide\" (gfx950)), each spread over the "
                 "64 lanes of a wave in the `mfma_layouts.mfma_fragments(m, n, k)` "
                 "fragments (v_mfma_f32_{m}x{n}x{k}_{f16,bf16}; the input dtype is the operands'; e4m3/e5m2 "
                 "operands, either mix, at 32x32x16 and 16x16x32: v_mfma_f32_{m}x{n}x{k}_{fp8,bf8}_{fp8,bf8}, and at "
                 "32x32x64 and 16x16x128: v_mfma_f32_{m}x{n}x{k}_f8f6f4, on targets with \"mfma.fp8\", gfx950's "
                 "OCP formats); every lane of "
                 "the wave must execute it together.", 3,
                 attrs={"m": "int", "n": "int", "k": "int"}, infer=_infer_mfma)
define_thread_op("ldmatrix", "`num` 8x8 matrices of 16-bit words from shared memory into the `mma_layouts."
                 "ldmatrix_layout(num, trans, bits)` registers (ldmatrix.sync.aligned.m8n8.x{num}[.trans].b16): lanes "
                 "8j..8j+7 each give the address of one 16-byte-aligned row of matrix j (8 16-bit, 16 8-bit or 4 "
                 "32-bit elements; .trans only for 16-bit ones); every lane of the warp must execute it together.", 1,
                 attrs={"num": "int", "trans": "bool"}, infer=_infer_ldmatrix, pure=False, **READS)
define_thread_op("lds_read_tr", "gfx950's LDS transpose read (ds_read_b64_tr_b16, `llvm.amdgcn.ds.read.tr16.b64`): in "
                 "each group of 16 lanes, lane 16h + s gives the 8-byte-aligned address of row s // 4, columns "
                 "4 (s % 4) .. + 3 of a 4 x 16 tile of 16-bit elements, and lane 16h + d receives column d: "
                 "register e is element (e, d), i.e. element d % 4 of the row lane 16h + 4e + d // 4 addressed. "
                 "Every lane of the wave must execute it together (the ISA needs EXEC all ones).", 1,
                 infer=_infer_lds_read_tr, pure=False, **READS)
define_thread_op("stmatrix", "The inverse of `ldmatrix` for 16-bit elements (stmatrix.sync.aligned.m8n8.x{num}[.trans]"
                 ".shared.b16, sm_90+): registers 2j, 2j + 1 of lane l are elements (l // 4, 2 (l % 4) + e) of "
                 "8x8 matrix j (.trans: (2 (l % 4) + e, l // 4)); lanes 8j..8j+7 each give the address of one "
                 "16-byte-aligned row of matrix j; every lane of the warp must execute it together.", 2,
                 attrs={"num": "int", "trans": "bool"}, infer=_infer_stmatrix, pure=False, **WRITES)
define_thread_op("barrier", "Wait for every thread of the block; orders shared-memory accesses around it.", 0,
       infer=lambda ts, a: [], pure=False, **SYNCHRONIZES)
define_thread_op("shared_alloc", "`bytes` bytes of shared memory at byte `offset` (-1 until the allocator assigns it), "
                 "a multiple of `align` (default 16; 1024 for a 128B-swizzled wgmma tile); `whole_kernel`: live "
                 "for the whole kernel, sharing bytes with no other buffer (explicit `tessera.shared` buffers); "
                 "`async_reads`: a TMA store's staging buffer that the store may still read after the loop "
                 "holding it, until a bulk_wait_group_read after that loop (`schedule/tma_store.py`); "
                 "`ring_stages`: the ring of a pipelined loop, that many slots (the allocator's error names them).", 0,
       attrs={"bytes": "int", "offset": "int"},
       optional_attrs={"align": "int", "whole_kernel": "bool", "async_reads": "bool", "ring_stages": "int"},
       check=_check_shared_alloc,
       pure=False)


# -- asynchronous copies (cp.async) ----------------------------------------------

ASYNC_COPY_BYTES = (4, 8, 16)


def _infer_async_copy(ts, a):
    dst, src, pred = ts
    size = a["bytes"]
    require(size in ASYNC_COPY_BYTES, f"async_copy moves 4, 8 or 16 bytes, got bytes = {size}")
    require(isinstance(dst, PointerType) and dst.address_space == "shared",
            f"async_copy writes shared memory: its first operand is a ptr<T, shared>, got {dst}")
    require(isinstance(src, PointerType) and src.address_space != "shared",
            f"async_copy reads global memory: its second operand is a global ptr<T>, got {src}")
    require(src.pointee == dst.pointee, f"async_copy copies between pointers of one element type, got {dst} and {src}")
    require(dst.pointee.bits >= 8 and (size * 8) % dst.pointee.bits == 0,
            f"async_copy of {size} bytes needs whole elements of at least one byte, got {dst.pointee.name}")
    require(pred == ScalarType(dt.bool_), f"async_copy predicate must be bool, got {pred}")
    return []


def _infer_async_wait(ts, a):
    require(a["pending"] >= 0, f"async_wait pending must be >= 0, got {a['pending']}")
    return []


define_thread_op("async_copy", "Copy `bytes` (4, 8 or 16) bytes from global `src` to shared `dst` asynchronously "
                 "(cp.async): when `pred` is false the bytes are zero-filled instead (src-size 0). The copy joins "
                 "this thread's open group; its bytes may be neither read nor written until an `async_wait` "
                 "retires that group. Both addresses must be aligned to `bytes`.", 3,
                 attrs={"bytes": "int"}, infer=_infer_async_copy, pure=False, **READS, **WRITES)
define_thread_op("async_commit", "Close this thread's open group of async_copy ops (cp.async.commit_group).", 0,
                 infer=lambda ts, a: [], pure=False, **SYNCHRONIZES)
define_thread_op("async_wait", "Wait until at most `pending` of this thread's committed async_copy groups are "
                 "still in flight (cp.async.wait_group); the others' bytes are then in shared memory, visible to "
                 "this thread (other threads need a barrier after the wait).", 0,
                 attrs={"pending": "int"}, infer=_infer_async_wait, pure=False, **SYNCHRONIZES)
