"""Reading and writing global memory: views and blocks, raw pointers, atomics, ordered accesses.

Two ways in:

* views (the safe default): `a = tessera.view(a_ptr, (M, K), (stride_m, 1))`
  describes a strided tensor, `a.block((BM, BK), (i, k))` names its block
  (i, k), and `.load()` / `.store(tile)` move it. Lanes outside the tensor
  read the fill value and are never written: bounds-checked by construction.
* raw pointers (for experts): `tessera.load(ptr + offs, mask=offs < n)`.
  Masked-off lanes are neither read nor written.

Programs of one launch hand data to each other through ordered memory:
atomics (acquire-release), `load(..., sem="acquire")` and
`store(..., sem="release")`; a spin-wait backs off with `nanosleep(ns)`.
Each takes `scope=`, the threads it orders against: "cta" (this program's
block), "cluster" (its thread-block cluster, sm_90+), "gpu" (every program
of the launch: the default) or "sys" (the host and peer GPUs too). A release
and an acquire synchronize only when each one's scope holds the other's
thread, so a "cta" pair between two programs hands nothing over (the SIMT
simulator reports it); a narrower scope is cheaper where it suffices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...ir.dtypes import DType, bool_, i32
from ...ir.ops import BITWISE_KINDS, DEFAULT_SCOPE, SCOPES
from ...ir.types import element_of
from .. import operators
from ..constexpr_args import describe, require_constexpr, static_shape
from ..errors import TypeMismatchError
from ..values import Context, Tensor, builtin
from .layouts import pin_layout

# ---------------------------------------------------------------------------
# Argument checks shared by the builtins below


def _pointer(ctx: Context, pointer: Any, what: str) -> Tensor:
    if not operators.is_pointer(pointer):
        hint = ""
        if isinstance(pointer, Tensor) and pointer.is_view:
            hint = "; a view is read and written by blocks: v.block(shape, index).load() / .store(tile)"
        ctx.error(f"{what} needs a pointer or a tile of pointers, got {describe(pointer)}{hint}", TypeMismatchError)
    return pointer


def _pointee(pointer: Tensor) -> DType:
    return element_of(pointer.type).pointee


def _fit(ctx: Context, value: Any, dtype: DType, shape: tuple[int, ...], what: str) -> Tensor:
    """`value` converted to `dtype` and broadcast to `shape` (a store's value, a load's `other`, ...)."""
    if isinstance(value, Tensor) and value.dtype is None:
        ctx.error(f"{what} must be numbers, got {value.type}", TypeMismatchError)
    source = operators.shape_of_operand(value)
    if operators.broadcast_shape(source, shape) != tuple(shape):
        ctx.error(f"{what} has shape {source}, which does not broadcast to the shape {tuple(shape)} "
                  f"it is used with", TypeMismatchError)
    return operators.fit(ctx, value, dtype, shape)


def _mask(ctx: Context, mask: Any, shape: tuple[int, ...], what: str) -> Tensor:
    if isinstance(mask, Tensor) and mask.dtype != bool_:
        ctx.error(f"{what}'s mask must be bool, got {mask.type}; make one with a comparison, e.g. offs < n",
                  TypeMismatchError)
    if not isinstance(mask, (Tensor, bool)):
        ctx.error(f"{what}'s mask must be bool, got {describe(mask)}", TypeMismatchError)
    return _fit(ctx, mask, bool_, shape, f"{what}'s mask")


# ---------------------------------------------------------------------------
# Pointer loads and stores


@builtin
def load(ctx: Context, pointer, mask=None, other=None, layout=None, sem=None, scope=None) -> Tensor:
    """load(pointer, mask=None, other=None, layout=None, sem=None, scope=None) -> the values `pointer` points to.

    `pointer` is a pointer or a tile of pointers; the result has its shape
    and its element type. Where the bool `mask` is false, memory is not read
    and the lane is `other` (0 when absent). `mask` and `other` broadcast to
    the pointer's shape; `other` is converted to the element type. `layout`
    pins the result's register layout (see `tessera.convert_layout`).

    `sem="acquire"` makes it an acquire load at GPU scope (`ld.acquire.gpu`;
    AMD: an agent-scope atomic load): once it reads what another program
    stored with `sem="release"` or an atomic, this program sees everything
    that program wrote before. A scalar one is read by one thread and handed
    to the others through shared memory, so the whole program acquires; poll
    with it, not with `atomic_add(ptr, 0)`:

        while tessera.load(flag_ptr, sem="acquire") < target:
            tessera.nanosleep(100)

    `scope` (with `sem` only) narrows or widens whom it acquires from:
    "cta" (this program's threads), "cluster" (its thread-block cluster,
    sm_90+), "gpu" (every program; None means this) or "sys" (the host and
    peer GPUs too): `ld.acquire.<scope>`; AMD: the "workgroup", "agent" or
    system syncscope. A release and an acquire synchronize only when each
    one's scope holds the other's thread: a "cta" pair between two programs
    hands nothing over (the SIMT simulator reports it).
    """
    _check_sem(ctx, "load", sem, "acquire")
    scope = _check_scope(ctx, "load", scope, sem)
    pointer = _pointer(ctx, pointer, "load")
    shape = pointer.shape
    operands = [pointer]
    if mask is None:
        if other is not None:
            ctx.error("load's `other` is the value of masked-off lanes, so it needs a mask: "
                      "tessera.load(ptr, mask=..., other=...)")
    else:
        operands.append(_mask(ctx, mask, shape, "load"))
        if other is not None:
            operands.append(_fit(ctx, other, _pointee(pointer), shape, "load's `other`"))
    _check_whole_elements(ctx, pointer, "load", sem)
    if sem is None:
        return pin_layout(ctx, operators.emit(ctx, "load", *operands), layout, "load's layout")
    return pin_layout(ctx, operators.emit(ctx, "load_acquire", *operands, **_scope_attrs(scope)), layout,
                      "load's layout")


@builtin
def store(ctx: Context, pointer, value, mask=None, sem=None, scope=None) -> None:
    """store(pointer, value, mask=None, sem=None, scope=None): write `value` where `pointer` points.

    `value` is converted to the pointer's element type and broadcast to its
    shape (a scalar fills every lane). Lanes where the bool `mask` is false
    are not written.

    `sem="release"` makes it a release store at GPU scope (`st.release.gpu`;
    AMD: an agent-scope atomic store): a program whose acquire (`load(...,
    sem="acquire")`, an atomic) reads the value sees everything this program
    wrote before it. A scalar one is made by one thread after a barrier, so
    it publishes the whole program's writes.

    `scope` (with `sem` only) narrows or widens whom it releases to, as for
    `load`: "cta", "cluster" (sm_90+), "gpu" (None means this) or "sys"
    (`st.release.<scope>`; AMD: the scope's syncscope).
    """
    _check_sem(ctx, "store", sem, "release")
    scope = _check_scope(ctx, "store", scope, sem)
    pointer = _pointer(ctx, pointer, "store")
    shape = pointer.shape
    operands = [pointer, _fit(ctx, value, _pointee(pointer), shape, "store's value")]
    if mask is not None:
        operands.append(_mask(ctx, mask, shape, "store"))
    _check_whole_elements(ctx, pointer, "store", sem)
    if sem is None:
        operators.emit(ctx, "store", *operands)
    else:
        operators.emit(ctx, "store_release", *operands, **_scope_attrs(scope))


def _check_sem(ctx: Context, what: str, sem: Any, ordered: str) -> None:
    """`sem` of a load or store: None (a plain access) or its one ordering, a compile-time string."""
    require_constexpr(ctx, sem, f"{what}'s sem")
    if sem is not None and sem != ordered:
        ctx.error(f"{what}'s sem must be {ordered!r} (GPU scope) or None for a plain {what}, got {describe(sem)}; "
                  f"e.g. tessera.{what}(ptr{', value' if what == 'store' else ''}, sem={ordered!r})")


def _check_scope(ctx: Context, what: str, scope: Any, sem: Any = "acq_rel") -> str:
    """`scope` of an ordered access or atomic: one of SCOPES, a compile-time string (None: the default, "gpu").
    A plain load or store (`sem` None) orders nothing, so a scope there is a mistake, not a no-op."""
    require_constexpr(ctx, scope, f"{what}'s scope")
    if scope is None:
        return DEFAULT_SCOPE
    examples = {"load": "tessera.load(ptr, sem='acquire', scope='cta')",
                "store": "tessera.store(ptr, value, sem='release', scope='cta')"}
    example = examples.get(what, f"tessera.{what}(ptr, value, scope='cta')")
    if scope not in SCOPES:
        ctx.error(f"{what}'s scope must be one of {', '.join(map(repr, SCOPES))}, got {describe(scope)}; "
                  f"e.g. {example}")
    if sem is None:
        ordered = "acquire" if what == "load" else "release"
        ctx.error(f"{what}'s scope={scope!r} says whom an ordered {what} synchronizes with, but this {what} has no "
                  f"sem, so it orders nothing: add sem={ordered!r} ({example}), or drop scope")
    return scope


def _scope_attrs(scope: str) -> dict:
    """The op attributes of `scope`: none for the default, so that GPU-scope IR reads as before scopes existed."""
    return {} if scope == DEFAULT_SCOPE else {"scope": scope}


def _check_whole_elements(ctx: Context, pointer: Tensor, what: str, sem: Any) -> None:
    pointee = _pointee(pointer)
    if sem is not None and pointee.is_subbyte:
        ctx.error(f"a {what} with sem={sem!r} accesses whole elements of 8 bits or more, but {pointer.type} points "
                  f"to packed {pointee.name}; keep the flag in a wider type (e.g. tessera.i32)", TypeMismatchError)


# ---------------------------------------------------------------------------
# Views and blocks


def _extents(ctx: Context, values: Any, what: str) -> list:
    """Sizes, strides or offsets: Python ints stay ints (so arithmetic on them folds), scalars stay traced."""
    entries = list(values) if isinstance(values, (tuple, list)) else [values]
    for v in entries:
        is_int = isinstance(v, int) and not isinstance(v, bool)
        is_int_scalar = isinstance(v, Tensor) and not v.is_tile and v.dtype is not None and v.dtype.is_int
        if not (is_int or is_int_scalar):
            ctx.error(f"{what} must be integers (Python ints or integer scalars), got {describe(v)}",
                      TypeMismatchError)
    return entries


def _multiply(ctx: Context, a: Any, b: Any) -> Any:
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return operators.binary(ctx, "*", a, b)
    return a * b


@builtin
def view(ctx: Context, pointer, shape, strides=None) -> Tensor:
    """view(pointer, shape, strides=None) -> a strided tensor view of global memory.

    `pointer` is the address of element (0, ..., 0); `shape` and `strides`
    are tuples of ints or integer scalars (strides count elements). Without
    `strides` the tensor is contiguous, row-major. Read and write it by
    blocks: `v.block((BM, BN), (i, j)).load()`; lanes outside `shape` read
    the fill value and are never written.
    """
    if not operators.is_pointer(pointer) or pointer.is_tile:
        ctx.error(f"view needs a scalar pointer (the address of the first element), got {describe(pointer)}",
                  TypeMismatchError)
    sizes = _extents(ctx, shape, "view's shape")
    if strides is None:
        strides = [1]
        for size in reversed(sizes[1:]):
            strides.insert(0, _multiply(ctx, strides[0], size))
    else:
        strides = _extents(ctx, strides, "view's strides")
        if len(strides) != len(sizes):
            ctx.error(f"view's shape has {len(sizes)} dimensions but its strides have {len(strides)}")
    operands = [operators.to_tensor(ctx, v) for v in sizes + strides]
    return operators.emit(ctx, "make_view", pointer, *operands)


@dataclass(frozen=True, eq=False)
class BlockRef:
    """One block of a view: `shape` elements starting at element `offsets`.

    A compile-time handle made by `view.block(...)`; `.load()` and
    `.store(tile)` emit the bounds-checked IR.
    """

    ctx: Context
    view: Tensor
    shape: tuple[int, ...]
    offsets: tuple[Tensor, ...]

    @property
    def dtype(self) -> DType:
        return self.view.type.dtype

    def load(self, fill=0, layout=None, multicast=False) -> Tensor:
        """The block as a tile; lanes outside the view read `fill` (a compile-time number, default 0).

        `layout` pins the tile's register layout (see `tessera.convert_layout`).
        `multicast=True` promises that every program of the kernel's cluster
        (`tessera.cluster_dims`) loads this same block here; a TMA-filled
        `tessera.pipeline` then loads it once per cluster, each block a share
        multicast to all (the interpreter checks the promise; without a
        cluster it changes nothing).
        """
        ctx = self.ctx
        require_constexpr(ctx, fill, "load's fill")
        require_constexpr(ctx, multicast, "load's multicast")
        if not operators.is_python_number(fill):
            ctx.error(f"load's fill must be a number, got {describe(fill)}")
        value = self.dtype.quantize(fill).item()
        attrs = {"shape": self.shape}
        if value != 0:
            attrs["fill"] = int(value) if isinstance(value, bool) else value
        if multicast:
            attrs["multicast"] = True
        tile = operators.emit(ctx, "view_load", self.view, *self.offsets, **attrs)
        return pin_layout(ctx, tile, layout, "load's layout")

    def store(self, value) -> None:
        """Write `value`, converted to the view's dtype and broadcast to the block shape.

        Lanes outside the view are not written.
        """
        tile = _fit(self.ctx, value, self.dtype, self.shape, "the stored block")
        operators.emit(self.ctx, "view_store", self.view, *self.offsets, tile)

    def __repr__(self) -> str:
        return f"BlockRef({self.view.type}, shape={self.shape})"


def view_block(ctx: Context, view: Tensor, shape, index=None, *, offsets=None) -> BlockRef:
    """view.block(shape, index=None, *, offsets=None) -> the block of `shape` at block `index`.

    `index` counts blocks (element offsets are index * shape); `offsets`
    gives element offsets instead; with neither, the block starts at 0.
    Entries are ints or integer scalars.
    """
    rank = view.type.rank
    shape = static_shape(ctx, shape, "the block shape")
    if len(shape) != rank:
        ctx.error(f"a block of the rank-{rank} view {view.type} needs {rank} dimensions, got shape {shape}")
    if index is not None and offsets is not None:
        ctx.error("block takes either `index` (counted in blocks) or `offsets` (in elements), not both")
    if index is None and offsets is None:
        starts = [0] * rank
    else:
        what = "the block index" if index is not None else "the block offsets"
        starts = _extents(ctx, index if index is not None else offsets, what)
        if len(starts) != rank:
            ctx.error(f"{what} has {len(starts)} entries, but the view has rank {rank}")
        if index is not None:
            starts = [_multiply(ctx, i, size) for i, size in zip(starts, shape)]
    return BlockRef(ctx, view, shape, tuple(operators.to_tensor(ctx, s) for s in starts))


# ---------------------------------------------------------------------------
# Atomics

_NUMERIC_KINDS = ("add", "max", "min")


def _atomic(ctx: Context, kind: str, pointer: Any, value: Any, mask: Any, scope: Any) -> Tensor:
    name = f"atomic_{kind}"
    scope = _check_scope(ctx, name, scope)
    pointer = _pointer(ctx, pointer, name)
    pointee = _pointee(pointer)
    if kind in _NUMERIC_KINDS and pointee.is_bool:
        ctx.error(f"{name} needs numbers, but {pointer.type} points to bool", TypeMismatchError)
    if kind in BITWISE_KINDS and pointee.is_float:
        ctx.error(f"{name} needs integers or bool, but {pointer.type} points to {pointee.name}", TypeMismatchError)
    operands = [pointer, _fit(ctx, value, pointee, pointer.shape, f"{name}'s value")]
    if mask is not None:
        operands.append(_mask(ctx, mask, pointer.shape, name))
    return operators.emit(ctx, "atomic_rmw", *operands, kind=kind, **_scope_attrs(scope))


@builtin
def atomic_add(ctx: Context, pointer, value, mask=None, scope=DEFAULT_SCOPE) -> Tensor:
    """atomic_add(pointer, value, mask=None, scope="gpu") -> old values: atomically `*pointer += value` lane by lane.

    `value` is converted to the element type and broadcast to the pointer's
    shape; lanes where `mask` is false are untouched.

    Every atomic is acquire-release at its `scope`, the threads it is
    atomic and ordered against: "gpu" (the default: every program),
    "cta" (this program's threads only: cheaper fences, and a race between
    programs, which the SIMT simulator reports), "cluster" (its
    thread-block cluster, sm_90+) or "sys" (the host and peer GPUs too).
    NVIDIA: a relaxed `atom` at the scope between `fence.acq_rel.<scope>`
    fences (`atom.relaxed.cta.global.add.u32`; the GPU scope's is LLVM's
    bare `atom.global.add.u32`); AMD: the scope's syncscope. Every atomic
    below takes `scope` the same way.

    A scalar atomic is the whole
    program's: one thread performs it after a barrier (so it releases every
    thread's earlier writes), and its old value reaches every thread through
    shared memory. To wait for a counter, poll with `load(ptr, sem="acquire")`
    rather than `atomic_add(ptr, 0)`, which writes the line each time.
    """
    return _atomic(ctx, "add", pointer, value, mask, scope)


@builtin
def atomic_max(ctx: Context, pointer, value, mask=None, scope=DEFAULT_SCOPE) -> Tensor:
    """atomic_max(pointer, value, mask=None, scope="gpu") -> old values:
    atomically `*pointer = max(*pointer, value)`."""
    return _atomic(ctx, "max", pointer, value, mask, scope)


@builtin
def atomic_min(ctx: Context, pointer, value, mask=None, scope=DEFAULT_SCOPE) -> Tensor:
    """atomic_min(pointer, value, mask=None, scope="gpu") -> old values:
    atomically `*pointer = min(*pointer, value)`."""
    return _atomic(ctx, "min", pointer, value, mask, scope)


@builtin
def atomic_and(ctx: Context, pointer, value, mask=None, scope=DEFAULT_SCOPE) -> Tensor:
    """atomic_and(pointer, value, mask=None, scope="gpu") -> old values:
    atomically `*pointer &= value` (integers, bool)."""
    return _atomic(ctx, "and", pointer, value, mask, scope)


@builtin
def atomic_or(ctx: Context, pointer, value, mask=None, scope=DEFAULT_SCOPE) -> Tensor:
    """atomic_or(pointer, value, mask=None, scope="gpu") -> old values:
    atomically `*pointer |= value` (integers, bool)."""
    return _atomic(ctx, "or", pointer, value, mask, scope)


@builtin
def atomic_xor(ctx: Context, pointer, value, mask=None, scope=DEFAULT_SCOPE) -> Tensor:
    """atomic_xor(pointer, value, mask=None, scope="gpu") -> old values:
    atomically `*pointer ^= value` (integers, bool)."""
    return _atomic(ctx, "xor", pointer, value, mask, scope)


@builtin
def atomic_xchg(ctx: Context, pointer, value, mask=None, scope=DEFAULT_SCOPE) -> Tensor:
    """atomic_xchg(pointer, value, mask=None, scope="gpu") -> old values: atomically `*pointer = value`."""
    return _atomic(ctx, "xchg", pointer, value, mask, scope)


@builtin
def atomic_cas(ctx: Context, pointer, compare, value, scope=DEFAULT_SCOPE) -> Tensor:
    """atomic_cas(pointer, compare, value, scope="gpu") -> old values: atomically, where `*pointer == compare`,
    `*pointer = value`.

    `compare` and `value` are converted to the element type and broadcast to
    the pointer's shape. A lane succeeded when the returned old value equals
    `compare`. Acquire-release at `scope`, as `atomic_add` describes
    (NVIDIA: `atom.acq_rel.<scope>.cas`).
    """
    scope = _check_scope(ctx, "atomic_cas", scope)
    pointer = _pointer(ctx, pointer, "atomic_cas")
    pointee, shape = _pointee(pointer), pointer.shape
    expected = _fit(ctx, compare, pointee, shape, "atomic_cas's compare")
    desired = _fit(ctx, value, pointee, shape, "atomic_cas's value")
    return operators.emit(ctx, "atomic_cas", pointer, expected, desired, **_scope_attrs(scope))


# ---------------------------------------------------------------------------
# Waiting for other programs


@builtin
def nanosleep(ctx: Context, ns) -> None:
    """nanosleep(ns): sleep about `ns` nanoseconds, the backoff of a spin-wait.

    `ns` is an integer (a Python int or an integer scalar, converted to i32).
    A hint, as on the hardware: NVIDIA's `nanosleep.u32` sleeps within
    [0, 2 * ns] and at most 1 ms; AMD's `s_sleep` counts 64 clocks a unit
    (about 30 ns), so it sleeps in those steps. The CPU interpreter and the
    SIMT simulator do nothing (their scheduler parks a program whose wait
    loop changes nothing). Polling politely leaves the memory system to the
    programs being waited for:

        pause = 32
        while tessera.load(flag_ptr, sem="acquire") == 0:
            tessera.nanosleep(pause)
            pause = tessera.minimum(pause * 2, 1024)
    """
    is_int = isinstance(ns, int) and not isinstance(ns, bool)
    is_int_scalar = isinstance(ns, Tensor) and not ns.is_tile and ns.dtype is not None and ns.dtype.is_int
    if not (is_int or is_int_scalar):
        ctx.error(f"nanosleep needs an integer number of nanoseconds (a Python int or an integer scalar), got "
                  f"{describe(ns)}; e.g. tessera.nanosleep(100), or convert it with .to(tessera.i32)",
                  TypeMismatchError)
    if is_int and not 0 <= ns < 2 ** 31:
        ctx.error(f"nanosleep's ns must be in [0, 2**31), got {ns} (the hardware sleeps at most 1 ms anyway)")
    operators.emit(ctx, "nanosleep", operators.fit(ctx, ns, i32, ()))
