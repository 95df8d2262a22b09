"""Memory ops -> LLVM: addptr, masked and vectorized loads/stores, atomics.

* `addptr` is a GEP over the pointee's in-memory type (unsigned offsets are
  zero-extended first, so a u32 offset >= 2^31 stays positive); on a bit
  address (a pointer to a sub-byte type) it adds offset * bits; `int_to_ptr`
  and `ptr_to_int` are LLVM's inttoptr / ptrtoint.
* `load`/`store` of registers go in groups: with `vector = k`, each group of
  k registers is one `<k x T>` access aligned to k * sizeof(T) through the
  group's first pointer, guarded by the group's first mask value; without
  it every register is its own group. A masked group is a branch around the
  access (ptxas predicates it); masked-off loads yield `other` (or zero).
* `bool` is one byte in memory: loads compare with 0, stores zero-extend.
* atomics are acquire-release at the op's `scope` (default "gpu", the one
  Triton uses too; the dialect's `syncscope(scope)` names it for LLVM:
  "device" on NVPTX, "agent" on AMDGPU), one per register; masked-off
  registers are not touched and read as 0. NVPTX (LLVM 22) lowers an
  `atomicrmw` to a relaxed `atom` whatever its ordering, so `atomic_rmw` is
  a relaxed atomic between fences at the scope (one release fence before
  the registers, one acquire fence after), which is right on every target;
  the dialect writes the relaxed atomic itself where LLVM would lose its
  scope (`scoped_atomic`). `cmpxchg` keeps its ordering and scope
  (`atom.acq_rel.gpu.cas`). `atomic_cas` compares bits (floats go through
  integers, so NaN can match).
* `load_acquire` / `store_release` are LLVM's `load atomic` / `store
  atomic` with acquire / release ordering at the op's scope, one per
  register, on the integer of the element's width (bitcast to and from the
  register type: no target needs an atomic access of bf16 or fp8):
  `ld.acquire.<scope>` / `st.release.<scope>` on NVPTX (sm_70+), a global
  access with the scope's cache bits (gfx942 at agent scope: `sc1` and a
  cache invalidate / write-back).
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.ops import scope_of
from tessera.ir.types import RegsType, element_of, scalar_dtype

from .codegen_table import codegen_for
from .types import I8, I32, int_constant, memory_type, register_type, scalar_type, with_element

CAS_FAILURE_ORDERING = "acquire"


def _ordering(lw, op, ordering: str) -> str:
    """`ordering` at `op`'s scope (llvmlite prints the ordering verbatim, so it can carry the syncscope)."""
    syncscope = lw.dialect.syncscope(scope_of(op))
    return f'syncscope("{syncscope}") {ordering}' if syncscope else ordering


def _fence(lw, op, ordering: str) -> None:
    lw.builder.fence(ordering, lw.dialect.syncscope(scope_of(op)) or None)


def _index(i: int) -> ir.Constant:
    return ir.Constant(I32, i)


@codegen_for("addptr")
def _addptr(lw, op, ptr, offset):
    bld = lw.builder
    off_dtype = scalar_dtype(op.operands[1].type)
    if off_dtype.kind == "uint" and off_dtype.bits < 64:
        offset = bld.zext(offset, with_element(offset.type, ir.IntType(64)))
    pointee = element_of(op.operands[0].type).pointee
    if pointee.is_subbyte:      # a bit address: offset * bits more
        wide = offset if offset.type == ptr.type else bld.sext(offset, ptr.type)   # unsigned ones are i64 now
        return bld.add(ptr, bld.mul(wide, int_constant(ptr.type, pointee.bits)))
    if isinstance(ptr.type, ir.VectorType) and ptr.type.count == 1:
        # One register: a scalar GEP. LLVM 22's AMDGPU code generation loops forever on a <1 x ptr> GEP whose
        # index was narrowed (`offs % 3` at one element per thread: the DAG combiner turns the v1i64 zero_extend
        # of the index into a BUILD_VECTOR and back, endlessly).
        scalar = bld.gep(_lanes(lw, ptr, 0, 1), [_lanes(lw, offset, 0, 1)], source_etype=memory_type(pointee))
        return bld.insert_element(ir.Constant(ptr.type, None), scalar, _index(0))
    return bld.gep(ptr, [offset], source_etype=memory_type(pointee))


@codegen_for("int_to_ptr")
def _int_to_ptr(lw, op, address):
    return lw.builder.inttoptr(address, register_type(op.result.type))


@codegen_for("ptr_to_int")
def _ptr_to_int(lw, op, pointer):
    return lw.builder.ptrtoint(pointer, register_type(op.result.type))


# -- loads and stores ---------------------------------------------------------------


def _groups(op):
    """(number of groups, registers per group) of a load/store's pointer operand."""
    t = op.operands[0].type
    if not isinstance(t, RegsType):
        return 0, 1
    k = op.attrs.get("vector", 1)
    return t.count // k, k


def _lanes(lw, vector, start: int, k: int):
    """Registers [start, start + k) of `vector`: one lane as a scalar, several as a vector."""
    bld = lw.builder
    if k == 1:
        return bld.extract_element(vector, _index(start))
    if k == vector.type.count:
        return vector
    mask = ir.Constant(ir.VectorType(I32, k), [_index(start + i) for i in range(k)])
    return bld.shuffle_vector(vector, ir.Constant(vector.type, ir.Undefined), mask)


def _from_memory(lw, value, dtype: dt.DType):
    if dtype.is_bool:
        return lw.builder.icmp_unsigned("!=", value, ir.Constant(value.type, None))
    return value


def _to_memory(lw, value, dtype: dt.DType):
    if dtype.is_bool:
        return lw.builder.zext(value, with_element(value.type, I8))
    return value


def _access_type(dtype: dt.DType, k: int) -> ir.Type:
    mem = memory_type(dtype)
    return mem if k == 1 else ir.VectorType(mem, k)


def _alignment(dtype: dt.DType, k: int) -> int:
    return max(1, dtype.bits // 8) * k


@codegen_for("load")
def _load(lw, op, ptr, mask=None, other=None):
    dtype = element_of(op.operands[0].type).pointee
    result_type = register_type(op.result.type)
    if other is None:
        other = ir.Constant(result_type, None)
    groups, k = _groups(op)
    if not groups:  # one scalar pointer
        return _load_group(lw, ptr, mask, other, dtype, 1)
    if groups == 1 and k > 1:  # the whole register array is one access
        return _load_group(lw, _lanes(lw, ptr, 0, 1), _maybe_lane(lw, mask, 0), other, dtype, k)
    # Every group's address, mask and fill are taken out of their vectors before the first guarded load, and
    # the result is assembled after the last: no vector lives across the chain of branches (LLVM's code
    # generation copies such a vector whole into every block that uses it: quadratic in the registers).
    operands = [(_lanes(lw, ptr, g * k, 1), _maybe_lane(lw, mask, g * k), _lanes(lw, other, g * k, k))
                for g in range(groups)]
    values = [_load_group(lw, address, m, fill, dtype, k) for address, m, fill in operands]
    bld = lw.builder
    result = ir.Constant(result_type, ir.Undefined)
    for g, value in enumerate(values):
        for i in range(k):
            lane = value if k == 1 else bld.extract_element(value, _index(i))
            result = bld.insert_element(result, lane, _index(g * k + i))
    return result


def _maybe_lane(lw, mask, i: int):
    return None if mask is None else _lanes(lw, mask, i, 1)


def _load_group(lw, address, mask, other, dtype: dt.DType, k: int):
    """Load k registers from `address` where the scalar `mask` holds (always if None), `other` elsewhere."""
    def load():
        value = lw.builder.load(address, typ=_access_type(dtype, k), align=_alignment(dtype, k))
        return _from_memory(lw, value, dtype)

    if mask is None:
        return load()
    return lw.guarded(mask, load, other, name="load")


@codegen_for("store")
def _store(lw, op, ptr, value, mask=None):
    dtype = element_of(op.operands[0].type).pointee
    groups, k = _groups(op)
    if not groups:
        _store_group(lw, ptr, value, mask, dtype, 1)
        return None
    # Unlike loads, each group's operands are taken in the chain: taking them all out first made a library
    # kernel spill (attention decode on sm_80) for little compile time (a masked f16 copy of 512 elements a
    # thread: 4.1 s against 7.7 s; no store showed the loads' minutes).
    for g in range(groups):
        start = g * k
        _store_group(lw, _lanes(lw, ptr, start, 1), _lanes(lw, value, start, k), _maybe_lane(lw, mask, start), dtype, k)
    return None


def _store_group(lw, address, value, mask, dtype: dt.DType, k: int):
    def store():
        lw.builder.store(_to_memory(lw, value, dtype), address, align=_alignment(dtype, k))

    if mask is None:
        store()
    else:
        lw.guarded(mask, store, name="store")


# -- ordered accesses ------------------------------------------------------------------------


def _bits_type(dtype: dt.DType) -> ir.IntType:
    return ir.IntType(max(8, dtype.bits))


@codegen_for("load_acquire")
def _load_acquire(lw, op, ptr, mask=None, other=None):
    dtype = scalar_dtype(op.result.type)
    bld = lw.builder

    def one(address, fill, m):
        def load():
            word = bld.load_atomic(address, _ordering(lw, op, "acquire"), _alignment(dtype, 1), typ=_bits_type(dtype))
            if dtype.is_bool:
                return bld.icmp_unsigned("!=", word, ir.Constant(word.type, 0))
            return word if dtype.is_int else bld.bitcast(word, scalar_type(dtype))

        if m is None:
            return load()
        return lw.guarded(m, load, fill, name="load_acquire")

    if other is None:
        other = ir.Constant(register_type(op.result.type), None)
    return _per_register(lw, one, ptr, other, mask)


@codegen_for("store_release")
def _store_release(lw, op, ptr, value, mask=None):
    dtype = element_of(op.operands[0].type).pointee
    bld = lw.builder

    def one(address, v, m):
        def store():
            if dtype.is_bool:
                word = bld.zext(v, I8)
            else:
                word = v if dtype.is_int else bld.bitcast(v, _bits_type(dtype))
            # llvmlite's store_atomic compares the typed pointee, which opaque pointers lack: insert it directly
            bld._insert(ir.instructions.StoreAtomicInstr(bld.block, word, address, _ordering(lw, op, "release"),
                                                         _alignment(dtype, 1)))

        if m is None:
            store()
        else:
            lw.guarded(m, store, name="store_release")
        return None

    _per_register(lw, one, ptr, value, mask)
    return None


# -- atomics -------------------------------------------------------------------------------


def _rmw_operation(kind: str, dtype: dt.DType) -> str:
    if kind == "xchg":
        return "xchg"
    if dtype.is_float:
        return {"add": "fadd", "max": "fmax", "min": "fmin"}[kind]
    if kind in ("max", "min") and dtype.kind != "int":
        return "u" + kind
    return kind


@codegen_for("atomic_rmw")
def _atomic_rmw(lw, op, ptr, value, mask=None):
    dtype = scalar_dtype(op.result.type)
    kind, scope = op.attrs["kind"], scope_of(op)
    operation = _rmw_operation(kind, dtype)

    def one(address, v, m):
        def rmw():
            word = _to_memory(lw, v, dtype)
            old = lw.dialect.scoped_atomic(lw, kind, dtype, address, word, scope)
            if old is None:
                old = lw.builder.atomic_rmw(operation, address, word, _ordering(lw, op, "monotonic"))
            return _from_memory(lw, old, dtype)

        if m is None:
            return rmw()
        return lw.guarded(m, rmw, ir.Constant(scalar_type(dtype), None), name="atomic")

    _fence(lw, op, "release")
    result = _per_register(lw, one, ptr, value, mask)
    _fence(lw, op, "acquire")
    return result


@codegen_for("atomic_cas")
def _atomic_cas(lw, op, ptr, compare, value):
    dtype = scalar_dtype(op.result.type)
    bld = lw.builder
    bits = ir.IntType(dtype.bits)

    def as_bits(v):
        if dtype.is_bool:
            return bld.zext(v, bits)
        return bld.bitcast(v, bits) if dtype.is_float else v

    def one(address, expected, new, _mask):
        pair = bld.cmpxchg(address, as_bits(expected), as_bits(new), _ordering(lw, op, "acq_rel"),
                             CAS_FAILURE_ORDERING)
        old = bld.extract_value(pair, 0)
        if dtype.is_bool:
            return bld.icmp_unsigned("!=", old, ir.Constant(bits, 0))
        return bld.bitcast(old, scalar_type(dtype)) if dtype.is_float else old

    return _per_register(lw, one, ptr, compare, value, None)


def _per_register(lw, one, ptr, *operands):
    """`one(pointer, *scalar operands)` for a scalar access, or register by register for vectors."""
    *values, mask = operands
    if not isinstance(ptr.type, ir.VectorType):
        return one(ptr, *values, mask)
    bld = lw.builder
    result = None
    for i in range(ptr.type.count):
        lane = one(*[bld.extract_element(v, _index(i)) for v in (ptr, *values)],
                   None if mask is None else bld.extract_element(mask, _index(i)))
        if lane is None:        # a store: nothing to collect
            continue
        if result is None:
            result = ir.Constant(ir.VectorType(lane.type, ptr.type.count), ir.Undefined)
        result = bld.insert_element(result, lane, _index(i))
    return result
