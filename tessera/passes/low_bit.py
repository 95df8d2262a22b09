"""Low-bit unpacking: loads and stores of packed sub-byte tensors become byte accesses and register bit work.

A sub-byte tensor (i1..i7, u1..u7, fp4, fp6) is a little-endian bit stream:
element k occupies bits [k*bits, (k+1)*bits). No GPU loads a bit address, so
this pass, run on thread IR right after `lower_to_threads`, rewrites every
load and store through a pointer to a sub-byte type (`unpack_low_bit`):

* a load whose `vector = k` groups are whole bytes (k * bits % 8 == 0:
  the alignment analysis proved each group aligned to k elements) reads
  the group's bytes instead, in the widest aligned accesses that divide
  them (up to 16 bytes), and `unpack_bits` turns the bytes into the
  registers the load made, in the same register order, so the values land
  in the layout the lowering chose for the tile's consumer. When every use
  of the loaded registers is a `cast` to one type, `unpack_bits` produces
  that type itself (the backends' fast conversions: magic numbers, byte
  permutes) and the casts go. A load issued a step ahead -- a `for`
  carries it (init and yield both such loads) to casts in the body -- is
  carried as its bytes and unpacked there, so the fused conversion stays;
* any other load reads, per register, the byte holding the element's
  first bit (and, where a 3-, 5-, 6- or 7-bit element straddles two bytes,
  the next one) and shifts the element out;
* a store of whole-byte groups packs them (`pack_bits`) and stores the
  bytes; any other store updates its elements' bits with atomic and/or on
  their bytes, since other threads may own the other bits of a byte;
* atomics on sub-byte elements, and sub-byte shared memory, are errors.

Masked-off groups read zero bytes; a `select` restores the load's `other`
where zero bytes would not decode to it. After the pass no value of the
function is an access through a sub-byte pointer, which is what the
backends require; the SIMT simulator runs the function before and after
and computes the same.
"""

from __future__ import annotations

from tessera.ir import dtypes as dt
from tessera.ir.builder import Builder
from tessera.ir.core import Block, Function, Module, Operation, Value
from tessera.ir.types import PointerType, RegsType, ScalarType, Type, element_of, scalar_dtype, with_element

from .errors import LoweringError
from .rewrite import replace_uses, splice

MAX_ACCESS_BYTES = 16


def unpack_low_bit(module_or_fn: Module | Function, max_vector_bits: int = 128) -> None:
    """Rewrite, in place, every sub-byte load and store of the thread-IR function(s) (see the module docstring)."""
    functions = module_or_fn.functions if isinstance(module_or_fn, Module) else [module_or_fn]
    for fn in functions:
        _LowBit(fn, max_vector_bits // 8).run()


def is_sub_byte_access(op: Operation) -> bool:
    """A load, store or atomic through a pointer (or registers of pointers) to a sub-byte type."""
    if op.name not in ("load", "store", "atomic_rmw", "atomic_cas"):
        return False
    elem = element_of(op.operands[0].type)
    return isinstance(elem, PointerType) and elem.pointee.is_subbyte


class _LowBit:
    def __init__(self, fn: Function, max_access_bytes: int):
        self.fn = fn
        self.max_access_bytes = min(max_access_bytes, MAX_ACCESS_BYTES)
        self.b = Builder()
        self.replaced: dict[Value, Value] = {}
        self.users: dict[Value, list[Operation]] = {}
        self.unpacked: set[tuple[Operation, int]] = set()     # (for, carried index) now carrying packed bytes

    def run(self) -> None:
        accesses = [op for op in self.fn.walk() if is_sub_byte_access(op)]
        if not accesses:
            return
        for op in self.fn.walk():
            for v in op.operands:
                self.users.setdefault(v, []).append(op)
        for op in accesses:
            self.rewrite(op)
        replace_uses(self.fn, self.replaced)

    def fail(self, op: Operation, message: str) -> LoweringError:
        return LoweringError(message, op, kernel=self.fn.name)

    def rewrite(self, op: Operation) -> None:
        ptr_type = op.operands[0].type
        pointee = element_of(ptr_type).pointee
        if element_of(ptr_type).address_space != "global":
            raise self.fail(op, f"{pointee.name} in shared memory: sub-byte types are kept a byte wide there")
        if op.name.startswith("atomic"):
            wider = "f16" if pointee.is_float else "i8" if pointee.is_signed else "u8"
            raise self.fail(op, f"atomics on packed {pointee.name} elements are not supported; keep the "
                                f"values in a type of 8 bits or more (e.g. {wider}) for atomics")
        new_ops = Block()
        self.b.loc = op.loc
        with self.b.at(new_ops):
            if op.name == "load":
                self.load(op, pointee)
            else:
                self.store(op, pointee)
        splice(op, new_ops.ops)

    # -- loads ------------------------------------------------------------------------------

    def load(self, op: Operation, dtype: dt.DType) -> None:
        ptr, mask, other = (op.operands + [None, None])[:3]
        k = op.attrs.get("vector", 1)
        carried = self.carried_to_casts(op, dtype)
        if carried is not None:
            data = self.load_bytes(ptr, mask, k, dtype)
            self.replaced[op.result] = data
            self.unpack_in_body(*carried, data.type, dtype)
            return
        casts = self.fused_casts(op.result)
        if isinstance(ptr.type, RegsType) and k * dtype.bits % 8 == 0:
            result_dtype = scalar_dtype(casts[0].result.type) if casts else dtype
            data = self.load_bytes(ptr, mask, k, dtype)
            value = self.create("unpack_bits", [data], {"packed": dtype.name},
                                RegsType(ScalarType(result_dtype), ptr.type.count), op.result.name_hint)
            for cast in casts:
                self.replaced[cast.result] = value
                splice(cast, [])
        else:
            result_dtype, value = dtype, self.load_elements(ptr, mask, dtype, op.result.name_hint)
        if mask is not None and other is not None and not _decodes_zero_bytes(other, dtype):
            value = self.create("select", [mask, value, self.converted(other, dtype, result_dtype)])
        self.replaced[op.result] = value

    def carried_to_casts(self, op: Operation, dtype: dt.DType):
        """(for, index) when `op`'s whole-byte groups are loop-carried value `index` of a `for` -- its init or
        its yield, the other one a load like it -- whose block argument is only cast to one type, directly in
        the body, and whose result is unused: a load issued a step ahead. The loop then carries the packed
        bytes and unpacks them where they are used, into the casts' type (`unpack_in_body`), so that the
        conversion stays the fast fused one (a carried u4 register would be converted one by one); else None."""
        users = self.users.get(op.result, [])
        if len(users) != 1 or not isinstance(op.operands[0].type, RegsType) or not _zero_filled(op, dtype):
            return None
        k = op.attrs.get("vector", 1)
        if k * dtype.bits % 8:
            return None
        user = users[0]
        loop = user if user.name == "for" else user.parent.parent if user.name == "yield" else None
        if not isinstance(loop, Operation) or loop.name != "for" or loop.regions[0].ops[-1] is not user and \
                user is not loop:
            return None
        body = loop.regions[0]
        operands = loop.operands[3:] if user is loop else user.operands
        if operands.count(op.result) != 1:
            return None
        index = operands.index(op.result)
        init, step = loop.operands[3 + index], body.ops[-1].operands[index]
        if not all(_same_load(v, op) for v in (init, step)) or self.users.get(loop.results[index]):
            return None
        if (loop, index) in self.unpacked:         # its partner load came first
            return loop, index, []
        casts = self.users.get(body.args[1 + index], [])
        if not casts or not all(c.name == "cast" and c.parent is body for c in casts) or \
                len({scalar_dtype(c.result.type) for c in casts}) != 1:
            return None
        return loop, index, casts

    def unpack_in_body(self, loop: Operation, index: int, casts: list[Operation], data_type: Type,
                       dtype: dt.DType) -> None:
        """Retype carried value `index` of `loop` to the packed bytes and unpack them at the first cast (once)."""
        if (loop, index) in self.unpacked:
            return
        self.unpacked.add((loop, index))
        arg = loop.regions[0].args[1 + index]
        count, to = arg.type.count, scalar_dtype(casts[0].result.type)
        arg.type = loop.results[index].type = data_type
        body = loop.regions[0]
        first = min(casts, key=body.ops.index)
        new_ops = Block()
        with self.b.at(new_ops):
            value = self.create("unpack_bits", [arg], {"packed": dtype.name}, RegsType(ScalarType(to), count))
        splice(first, new_ops.ops)
        for cast in casts:
            self.replaced[cast.result] = value
            if cast is not first:
                splice(cast, [])

    def fused_casts(self, loaded: Value) -> list[Operation]:
        """The `cast` ops that are all the uses of `loaded`, when they convert to one dtype (else [])."""
        users = self.users.get(loaded, [])
        targets = {scalar_dtype(u.result.type) for u in users if u.name == "cast"}
        if users and len(targets) == 1 and all(u.name == "cast" for u in users):
            return users
        return []

    def load_bytes(self, ptr: Value, mask: Value | None, k: int, dtype: dt.DType) -> Value:
        """The bytes that hold registers of `ptr` in groups of k (whole bytes each), group-masked."""
        addresses, group_mask, vector = self.byte_groups(ptr, mask, k, dtype)
        operands = [addresses] + ([group_mask] if group_mask is not None else [])
        count = addresses.type.count
        return self.create("load", operands, {"vector": vector} if vector > 1 else None,
                           RegsType(ScalarType(dt.u8), count))

    def byte_groups(self, ptr: Value, mask: Value | None, k: int, dtype: dt.DType):
        """(byte addresses, byte mask or None, access width) of the whole-byte groups of k registers of `ptr`:
        the bytes of group g are byte_address(ptr[g * k]) + 0, 1, ..., k * bits / 8 - 1."""
        groups, per_group = ptr.type.count // k, k * dtype.bits // 8
        firsts = self.create("byte_address", [ptr])
        addresses = self.repeat_groups(firsts, groups, k, per_group)
        if per_group > 1:
            steps = [self.create("constant", [], {"value": i}, ScalarType(dt.i32)) for i in range(per_group)]
            addresses = self.create("addptr", [addresses, self.create("pack", steps * groups)])
        group_mask = None if mask is None else self.repeat_groups(mask, groups, k, per_group)
        return addresses, group_mask, _access_width(per_group, self.max_access_bytes)

    def repeat_groups(self, regs: Value, groups: int, k: int, times: int) -> Value:
        """Registers made of each group's first register of `regs` (groups of k), repeated `times` times."""
        if groups == 1:
            first = self.create("extract", [regs], {"index": 0})
            return self.create("splat", [first], None, RegsType(first.type, times))
        firsts = [self.create("extract", [regs], {"index": g * k}) for g in range(groups)]
        return self.create("pack", [f for f in firsts for _ in range(times)])

    def load_elements(self, ptr: Value, mask: Value | None, dtype: dt.DType, name: str) -> Value:
        """Register by register: the byte(s) holding each element, shifted and masked down to it."""
        t = ptr.type
        address = self.create("byte_address", [ptr])
        low = self.create("load", [address] + ([mask] if mask is not None else []), None, _like(t, dt.u8))
        shift = self.create("bit_offset", [ptr])
        if 8 % dtype.bits == 0:     # never straddles a byte
            pattern = self.create("shr", [low, self.cast(shift, dt.u8)])
        else:
            end = self.create("add", [shift, self.const(t, dtype.bits, dt.i32)])
            straddles = self.create("cmp", [end, self.const(t, 8, dt.i32)], {"pred": "gt"})
            high_mask = straddles if mask is None else self.create("and", [straddles, mask])
            next_byte = self.create("addptr", [address, self.const(t, 1, dt.i32)])
            high = self.create("load", [next_byte, high_mask], None, _like(t, dt.u8))
            high = self.create("shl", [self.cast(high, dt.u16), self.const(t, 8, dt.u16)])
            word = self.create("or", [self.cast(low, dt.u16), high])
            pattern = self.create("shr", [word, self.cast(shift, dt.u16)])
        return self.from_pattern(pattern, dtype, name)

    def from_pattern(self, pattern: Value, dtype: dt.DType, name: str = "") -> Value:
        """Registers whose low `bits` bits are bit patterns -> those elements of `dtype` (ints wrap to them)."""
        if dtype.is_int:
            return self.create("cast", [pattern], None, _like(pattern.type, dtype), name)
        bits = self.create("cast", [pattern], None, _like(pattern.type, _container(dtype, signed=False)))
        return self.create("bitcast", [bits], None, _like(pattern.type, dtype), name)

    def converted(self, other: Value, dtype: dt.DType, to: dt.DType) -> Value:
        """`other` (of `dtype`) as `to`: a new constant for a constant, else a cast."""
        if to == dtype:
            return other
        producer = other.owner
        if isinstance(producer, Operation) and producer.name == "constant":
            value = to.quantize(dtype.quantize(producer.attrs["value"])).item()
            return self.create("constant", [], {"value": value}, _like(other.type, to))
        return self.cast(other, to)

    # -- stores -----------------------------------------------------------------------------

    def store(self, op: Operation, dtype: dt.DType) -> None:
        ptr, value, mask = (op.operands + [None])[:3]
        k = op.attrs.get("vector", 1)
        if isinstance(ptr.type, RegsType) and k * dtype.bits % 8 == 0:
            addresses, group_mask, vector = self.byte_groups(ptr, mask, k, dtype)
            data = self.create("pack_bits", [value])
            operands = [addresses, data] + ([group_mask] if group_mask is not None else [])
            self.create("store", operands, {"vector": vector} if vector > 1 else None, [])
        else:
            self.store_elements(ptr, value, mask, dtype)

    def store_elements(self, ptr: Value, value: Value, mask: Value | None, dtype: dt.DType) -> None:
        """Register by register: clear the element's bits in its byte(s), then set them, each with an atomic
        (other threads may update the byte's other bits at the same time)."""
        t = ptr.type
        address = self.create("byte_address", [ptr])
        shift = self.cast(self.create("bit_offset", [ptr]), dt.u16)
        if dtype.is_int:
            pattern = self.create("cast", [value], None, _like(t, _container(dtype, signed=False)))
        else:
            pattern = self.create("bitcast", [value], None, _like(t, _container(dtype, signed=False)))
        bits = self.create("shl", [self.cast(pattern, dt.u16), shift])
        field = self.create("shl", [self.const(t, (1 << dtype.bits) - 1, dt.u16), shift])
        self.update_byte(address, self.cast(field, dt.u8), self.cast(bits, dt.u8), mask)
        if 8 % dtype.bits:          # the element may straddle into the next byte
            eight = self.const(t, 8, dt.u16)
            high_field = self.cast(self.create("shr", [field, eight]), dt.u8)
            straddles = self.create("cmp", [high_field, self.const(t, 0, dt.u8)], {"pred": "ne"})
            high_mask = straddles if mask is None else self.create("and", [straddles, mask])
            next_byte = self.create("addptr", [address, self.const(t, 1, dt.i32)])
            self.update_byte(next_byte, high_field, self.cast(self.create("shr", [bits, eight]), dt.u8), high_mask)

    def update_byte(self, address: Value, field: Value, bits: Value, mask: Value | None) -> None:
        masks = [mask] if mask is not None else []
        self.create("atomic_rmw", [address, self.create("not", [field])] + masks, {"kind": "and"})
        self.create("atomic_rmw", [address, bits] + masks, {"kind": "or"})

    # -- small helpers ------------------------------------------------------------------------

    def create(self, name: str, operands, attrs=None, result_type: Type | list | None = None, hint: str = ""):
        types = result_type if isinstance(result_type, list) or result_type is None else [result_type]
        op = self.b.create(name, list(operands), attrs, types, None, [hint] if hint else ())
        return op.results[0] if op.results else None

    def cast(self, value: Value, dtype: dt.DType) -> Value:
        return self.create("cast", [value], None, _like(value.type, dtype))

    def const(self, like: Type, value: int, dtype: dt.DType) -> Value:
        return self.create("constant", [], {"value": value}, _like(like, dtype))


def _like(t: Type, dtype: dt.DType) -> Type:
    """A scalar or registers of `dtype`, shaped like `t`."""
    return with_element(t, ScalarType(dtype))


def _container(dtype: dt.DType, signed: bool | None = None) -> dt.DType:
    """The integer type of `dtype`'s width: u4 for u4, i3 for i3, u4 (unsigned) for fp4, u8 for an 8-bit type."""
    signed = dtype.kind == "int" if signed is None else signed
    return dt.dtype_from_name(f"{'i' if signed else 'u'}{dtype.bits}")


def _same_load(value: Value, op: Operation) -> bool:
    """Whether `value` is the result of a load like `op` (pointee, register count, vector width, no fill)."""
    other = value.owner
    return (isinstance(other, Operation) and other.name == "load" and _zero_filled(other, other.operands[0].type.element.pointee) and
            other.operands[0].type == op.operands[0].type and other.attrs.get("vector", 1) == op.attrs.get("vector", 1))


def _zero_filled(op: Operation, dtype: dt.DType) -> bool:
    """Whether a load's masked-off registers are what zero bytes decode to (no `other`, or one that is)."""
    return len(op.operands) < 3 or _decodes_zero_bytes(op.operands[2], dtype)


def _access_width(nbytes: int, widest: int) -> int:
    """The widest power-of-two access (at most `widest` bytes) that divides a group of `nbytes` bytes, which
    starts aligned to that power of two (its first element is aligned to the whole group)."""
    return min(nbytes & -nbytes, widest)


def _decodes_zero_bytes(other: Value, dtype: dt.DType) -> bool:
    """Whether `other` is a constant whose bit pattern is 0, which is what masked-off zero bytes decode to."""
    producer = other.owner
    if not isinstance(producer, Operation) or producer.name != "constant":
        return False
    return int(dtype.encode(producer.attrs["value"])) == 0
