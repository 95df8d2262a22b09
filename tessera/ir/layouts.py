"""Register layouts: which thread holds which element of a tile, in which register.

A `RegisterLayout` of a tile of `shape` over `num_threads` threads maps
(thread, local) -> tile coordinate, where `local` indexes the `local_size`
registers one thread holds. Layouts are values built, after Tilus, from two
primitives and a product:

    local(2, 1)       one thread holds a 2x1 tile; local index row-major
    spatial(8, 4)     32 threads hold one element each; thread index row-major
    column_local, column_spatial   the same with the last dim most significant
    replicated(4)     4 threads hold the same (rank-0) element
    a * b             Kronecker product: a tile of a's shape whose every
                      element is a tile laid out by b

The product is outer-major, like a row-major index over the pair (a, b):

    shape  = a.shape * b.shape                     (elementwise)
    thread = thread_a * b.num_threads + thread_b
    local  = local_a * b.local_size + local_b
    coord  = coord_a * b.shape + coord_b

so `a` picks the block and `b` the element inside it. Both factors have the
same rank, except that a rank-0 factor (`replicated(n)`) broadcasts to any
rank. `a.local(...)`, `a.spatial(...)`, ... spell `a * local(...)`, so the
mma.sync m16n8 accumulator reads `local(2,1).spatial(8,4).local(1,2)`.

Representation (Tilus's): each tile dim is split into modes (sizes, major to
minor); each mode is one digit of either the thread index (`spatial_modes`)
or the local index (`local_modes`), both listed major digit first, with modes
numbered in dim order. An entry -n in `spatial_modes` is a replication digit:
n threads that hold the same elements. The stored form is canonical (no
size-1 modes, no digits that could be merged), so `==` is equality of maps and
`str` is a function of the map; `parse_layout(str(x)) == x`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from tessera.ir.errors import IRError


class LayoutError(IRError, ValueError):
    """An impossible layout, an undefined divide, or layout text that does not parse."""


@dataclass(frozen=True)
class RegisterLayout:
    """(thread, local) -> coordinate map of a tile; see the module docstring."""

    __tessera_constexpr__ = True   # kernels may use layouts as compile-time values (globals, constexprs)

    shape: tuple[int, ...]
    modes: tuple[tuple[int, ...], ...]
    spatial_modes: tuple[int, ...]
    local_modes: tuple[int, ...]

    def __post_init__(self) -> None:
        canon = _canonical(self.shape, self.modes, self.spatial_modes, self.local_modes)
        for name, value in zip(("shape", "modes", "spatial_modes", "local_modes"), canon):
            object.__setattr__(self, name, value)

    # -- queries --------------------------------------------------------------

    @property
    def rank(self) -> int:
        return len(self.shape)

    @cached_property
    def sizes(self) -> tuple[int, ...]:
        """Mode sizes by mode id (ids count through the dims in order)."""
        return tuple(m for ms in self.modes for m in ms)

    @cached_property
    def dim_mode_ids(self) -> tuple[tuple[int, ...], ...]:
        """The mode ids of each dim, major to minor."""
        out, start = [], 0
        for ms in self.modes:
            out.append(tuple(range(start, start + len(ms))))
            start += len(ms)
        return tuple(out)

    @property
    def num_threads(self) -> int:
        return math.prod(self.sizes[e] if e >= 0 else -e for e in self.spatial_modes)

    @property
    def local_size(self) -> int:
        """Registers (elements) per thread."""
        return math.prod(self.sizes[e] for e in self.local_modes)

    @property
    def replication(self) -> int:
        """How many threads hold each element (1 for a bijection)."""
        return math.prod(-e for e in self.spatial_modes if e < 0)

    @property
    def is_bijective(self) -> bool:
        return self.replication == 1

    def map(self, thread: Any, local: Any) -> tuple:
        """Tile coordinate of (thread, local), one entry per dim.

        Vectorized: array arguments broadcast and give arrays; two ints give ints.
        """
        scalar = all(isinstance(x, (int, np.integer)) for x in (thread, local))
        t, i = np.broadcast_arrays(np.asarray(thread, np.int64), np.asarray(local, np.int64))
        if np.any((t < 0) | (t >= self.num_threads)) or np.any((i < 0) | (i >= self.local_size)):
            raise LayoutError(
                f"{self}: thread must be in [0, {self.num_threads}) and local in [0, {self.local_size})"
            )
        digit = {}
        for index, entries in ((t, self.spatial_modes), (i, self.local_modes)):
            for e in reversed(entries):
                n = self.sizes[e] if e >= 0 else -e
                if e >= 0:
                    digit[e] = index % n
                index = index // n
        coords = []
        for ids in self.dim_mode_ids:
            c = np.zeros(t.shape, np.int64)
            for e in ids:
                c = c * self.sizes[e] + digit[e]
            coords.append(int(c) if scalar else c)
        return tuple(coords)

    def table(self) -> np.ndarray:
        """Coordinates of every (thread, local): an int array of shape (threads, locals, rank)."""
        t = np.arange(self.num_threads)[:, None]
        i = np.arange(self.local_size)[None, :]
        coords = self.map(t, i)
        if not coords:
            return np.zeros((self.num_threads, self.local_size, 0), np.int64)
        return np.stack(np.broadcast_arrays(*coords), axis=-1)

    def inverse(self, coord: Sequence[int]) -> list[tuple[int, int]]:
        """Every (thread, local) that holds `coord`, by increasing thread."""
        coord = tuple(int(c) for c in coord)
        if len(coord) != self.rank or any(not 0 <= c < n for c, n in zip(coord, self.shape)):
            raise LayoutError(f"{self}: coordinate {coord} is outside the tile {self.shape}")
        digit = {}
        for c, ids in zip(coord, self.dim_mode_ids):
            for e in reversed(ids):
                digit[e] = c % self.sizes[e]
                c //= self.sizes[e]
        threads = [0]
        for e in self.spatial_modes:
            n = self.sizes[e] if e >= 0 else -e
            choices = range(n) if e < 0 else (digit[e],)
            threads = [t * n + r for t in threads for r in choices]
        local = 0
        for e in self.local_modes:
            local = local * self.sizes[e] + digit[e]
        return [(t, local) for t in threads]

    def local_contiguity(self, dim: int = -1) -> int:
        """How many elements consecutive along `dim` a thread holds in consecutive registers.

        The largest v such that locals v*j .. v*j+v-1 of every thread are v
        neighbours along `dim`; what a vectorized load or store may use.
        """
        ids = self.dim_mode_ids[_dim(dim, self.rank)]
        if ids and self.local_modes and self.local_modes[-1] == ids[-1]:
            return self.sizes[ids[-1]]
        return 1

    # -- algebra --------------------------------------------------------------

    def __mul__(self, other: RegisterLayout) -> RegisterLayout:
        """Kronecker product (see the module docstring for the conventions)."""
        if not isinstance(other, RegisterLayout):
            return NotImplemented
        a, b = _same_rank(self, other)
        new_a, new_b, pos = {}, {}, 0
        for ids_a, ids_b in zip(a.dim_mode_ids, b.dim_mode_ids):
            for ids, new in ((ids_a, new_a), (ids_b, new_b)):
                for e in ids:
                    new[e], pos = pos, pos + 1

        def renumber(entries, new):
            return [new[e] if e >= 0 else e for e in entries]

        return RegisterLayout(
            tuple(x * y for x, y in zip(a.shape, b.shape)),
            tuple(x + y for x, y in zip(a.modes, b.modes)),
            renumber(a.spatial_modes, new_a) + renumber(b.spatial_modes, new_b),
            renumber(a.local_modes, new_a) + renumber(b.local_modes, new_b),
        )

    def local(self, *shape: int) -> RegisterLayout:
        return self * local(*shape)

    def spatial(self, *shape: int) -> RegisterLayout:
        return self * spatial(*shape)

    def column_local(self, *shape: int) -> RegisterLayout:
        return self * column_local(*shape)

    def column_spatial(self, *shape: int) -> RegisterLayout:
        return self * column_spatial(*shape)

    def replicated(self, n: int) -> RegisterLayout:
        return self * replicated(n)

    def divide(self, other: RegisterLayout) -> RegisterLayout:
        """The quotient A with A * other == self; LayoutError when there is none."""
        return _divide(self, other)

    __truediv__ = divide

    def reduce(self, dims: int | Iterable[int], keepdims: bool = True) -> RegisterLayout:
        """Layout of the result of reducing this tile over `dims`.

        A thread's registers along a reduced dim fold into one; threads that
        covered a reduced dim end up holding the same result, so those thread
        digits become replication. Reduced dims keep size 1 unless
        `keepdims=False` drops them.
        """
        reduced = {_dim(d, self.rank) for d in ([dims] if isinstance(dims, int) else dims)}
        gone = {e for d in reduced for e in self.dim_mode_ids[d]}
        spatial_modes = [-self.sizes[e] if e in gone else e for e in self.spatial_modes]
        local_modes = [e for e in self.local_modes if e not in gone]
        kept = [d for d in range(self.rank) if keepdims or d not in reduced]
        return _assemble(
            [1 if d in reduced else self.shape[d] for d in kept],
            [() if d in reduced else self.dim_mode_ids[d] for d in kept],
            self.sizes, spatial_modes, local_modes,
        )  # fmt: skip

    def permute(self, order: Sequence[int]) -> RegisterLayout:
        """The layout of the tile transposed so that new dim k is old dim order[k]."""
        order = [_dim(d, self.rank) for d in order]
        if sorted(order) != list(range(self.rank)):
            raise LayoutError(f"{self}: {list(order)} is not a permutation of the dims")
        return _assemble(
            [self.shape[d] for d in order], [self.dim_mode_ids[d] for d in order],
            self.sizes, self.spatial_modes, self.local_modes,
        )  # fmt: skip

    def reshape(self, shape: Sequence[int]) -> RegisterLayout:
        """The layout of the same elements viewed in `shape` (same row-major order): the modes, all dims'
        together in order, regrouped into the new dims, a mode split in two where a new dim ends inside it
        (its digit becomes two adjacent digits). LayoutError when a dim ends inside a mode it does not
        divide."""
        shape = tuple(int(n) for n in shape)
        if math.prod(shape) != math.prod(self.shape):
            raise LayoutError(f"{self}: cannot view {self.shape} as {shape}, a different number of elements")
        size: dict[Any, int] = dict(enumerate(self.sizes))
        keys = [e for ids in self.dim_mode_ids for e in ids]
        digits = [list(self.spatial_modes), list(self.local_modes)]
        dims: list[list[Any]] = []
        for n in shape:
            dim, acc = [], 1
            while acc < n:
                key = keys.pop(0)
                if acc * size[key] > n:         # the dim ends inside this mode: split it, major part here
                    outer = n // acc
                    if n % acc or size[key] % outer:
                        raise LayoutError(f"{self}: cannot view {self.shape} as {shape}: a mode of size "
                                          f"{size[key]} does not split at {outer}")
                    major, minor = (key, "o"), (key, "i")
                    size[major], size[minor] = outer, size[key] // outer
                    for lst in digits:
                        if key in lst:
                            k = lst.index(key)
                            lst[k:k + 1] = [major, minor]
                    keys.insert(0, minor)
                    key = major
                dim.append(key)
                acc *= size[key]
            dims.append(dim)
        return _assemble(shape, dims, size, *digits)

    # -- text -----------------------------------------------------------------

    def __str__(self) -> str:
        chain = _as_chain(self)
        if chain is not None:
            return ".".join(chain)
        return (
            f"layout(shape={_fmt(self.shape)},modes={_fmt(self.modes)},"
            f"spatial={_fmt(self.spatial_modes)},local={_fmt(self.local_modes)})"
        )

    def __repr__(self) -> str:
        return f"parse_layout({str(self)!r})"


# -- primitives ------------------------------------------------------------------


def local(*shape: int) -> RegisterLayout:
    """One thread holds the whole `shape`; local index row-major."""
    return _primitive(shape, spatial=False, column=False)


def spatial(*shape: int) -> RegisterLayout:
    """prod(shape) threads hold one element each; thread index row-major."""
    return _primitive(shape, spatial=True, column=False)


def column_local(*shape: int) -> RegisterLayout:
    """`local` with the local index column-major (last dim most significant)."""
    return _primitive(shape, spatial=False, column=True)


def column_spatial(*shape: int) -> RegisterLayout:
    """`spatial` with the thread index column-major (last dim most significant)."""
    return _primitive(shape, spatial=True, column=True)


def replicated(n: int) -> RegisterLayout:
    """n threads holding the same rank-0 element; in a product it fits any rank."""
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise LayoutError(f"replicated({n}): the thread count must be a positive int")
    return RegisterLayout((), (), (-int(n),) if n > 1 else (), ())


def _primitive(shape: Sequence[int], spatial: bool, column: bool) -> RegisterLayout:
    if any(not isinstance(s, (int, np.integer)) or s < 1 for s in shape):
        raise LayoutError(f"layout sizes must be positive ints, got {tuple(shape)}")
    digits = tuple(reversed(range(len(shape))) if column else range(len(shape)))
    modes = tuple((int(s),) for s in shape)
    return RegisterLayout(tuple(shape), modes, digits if spatial else (), () if spatial else digits)


# -- named hardware layouts ------------------------------------------------------


def mma_m16n8k16_a() -> RegisterLayout:
    """mma.sync m16n8k16 multiplicand A (.f16/.bf16), a 16x16 (m, k) tile.

    PTX ISA 9.7.14.5.8, Figure 79: groupID = lane >> 2, tid = lane % 4;
    row = groupID (+8 for a2, a3, a6, a7), col = tid*2 + (i & 1) (+8 for i >= 4).
    """
    return column_local(2, 2).spatial(8, 4).local(1, 2)


def mma_m16n8k16_b() -> RegisterLayout:
    """mma.sync m16n8k16 multiplicand B (.f16/.bf16), a 16x8 (k, n) tile.

    PTX ISA 9.7.14.5.8, Figure 81: row = tid*2 + (i & 1) (+8 for b2, b3),
    col = groupID.
    """
    return local(2, 1).column_spatial(4, 8).local(2, 1)


def mma_m16n8k16_c() -> RegisterLayout:
    """mma.sync m16n8 (k8/k16) accumulator C/D (.f32 or .f16), a 16x8 (m, n) tile.

    PTX ISA 9.7.14.5.8, Figure 83: row = groupID (+8 for c2, c3),
    col = tid*2 + (i & 1).
    """
    return local(2, 1).spatial(8, 4).local(1, 2)


def ldmatrix(num: int = 4, trans: bool = False) -> RegisterLayout:
    """Registers of ldmatrix.sync.m8n8.x{num}.b16, matrices stacked by rows: (8*num, 8).

    PTX ISA 9.7.14.5.15 (ldmatrix fragment figure): register j holds matrix j,
    whose row addresses come from lanes 8j..8j+7; in each 8x8 matrix lane l
    holds row l // 4, cols 2*(l % 4) + {0, 1}. With .trans it holds the
    transposed element: rows 2*(l % 4) + {0, 1}, col l // 4. Local index is
    2*j + element.
    """
    if num not in (1, 2, 4):
        raise LayoutError(f"ldmatrix: num must be 1, 2 or 4, got {num}")
    inner = column_spatial(4, 8).local(2, 1) if trans else spatial(8, 4).local(1, 2)
    return local(num, 1) * inner


# Kernels may call the constructors on compile-time arguments: the DSL evaluates
# them while tracing (the marker is all it looks for; ir/ imports nothing of dsl/).
for _constructor in (local, spatial, column_local, column_spatial, replicated,
                     mma_m16n8k16_a, mma_m16n8k16_b, mma_m16n8k16_c, ldmatrix):
    _constructor.__tessera_constexpr__ = True


# -- text form -------------------------------------------------------------------

_PRIMITIVES: dict[str, Callable[..., RegisterLayout]] = {
    "local": local, "spatial": spatial, "column_local": column_local,
    "column_spatial": column_spatial, "replicated": replicated,
}  # fmt: skip


def parse_layout(text: str) -> RegisterLayout:
    """Inverse of `str(layout)`: a chain like `local(2,1).spatial(8,4).local(1,2)`
    or the general `layout(shape=[..],modes=[[..],..],spatial=[..],local=[..])`."""
    calls = parse_call_chain(text)
    try:
        name, args, kwargs = calls[0]
        if name == "layout":
            if args or set(kwargs) != {"shape", "modes", "spatial", "local"}:
                raise LayoutError("layout(...) takes shape=, modes=, spatial= and local=")
            result = RegisterLayout(kwargs["shape"], kwargs["modes"], kwargs["spatial"], kwargs["local"])
        else:
            result = _call_primitive(name, args, kwargs)
        for name, args, kwargs in calls[1:]:
            result = result * _call_primitive(name, args, kwargs)
        return result
    except LayoutError as e:
        raise LayoutError(f"bad layout {text!r}: {e}") from None


def _call_primitive(name: str, args: list, kwargs: dict) -> RegisterLayout:
    if name not in _PRIMITIVES or kwargs or any(not isinstance(a, int) for a in args):
        raise LayoutError(f"unknown layout factor {name}(...); expected one of {', '.join(_PRIMITIVES)}")
    if name == "replicated" and len(args) != 1:
        raise LayoutError("replicated(n) takes one thread count")
    return _PRIMITIVES[name](*args)


_TOKEN = re.compile(r"\s*(?:(?P<int>-?\d+)|(?P<name>[A-Za-z_]\w*)|(?P<punct>[()\[\],.=]))")


def parse_call_chain(text: str) -> list[tuple[str, list, dict]]:
    """Split `f(1,2).g(x=[3,[4]])` into [(name, args, kwargs), ...].

    The shared text syntax of register and shared-memory layouts: values are
    ints and bracketed lists of values.
    """
    tokens, pos = [], 0
    while pos < len(text.rstrip()):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise LayoutError(f"bad layout {text!r}: unexpected character at column {pos + 1}")
        tokens.append((m.lastgroup, m.group(m.lastgroup), m.start(m.lastgroup)))
        pos = m.end()
    tokens.append(("end", "", len(text)))
    k = 0

    def take(kind: str, value: str | None = None) -> str:
        nonlocal k
        got_kind, got, at = tokens[k]
        if got_kind != kind or (value is not None and got != value):
            raise LayoutError(f"bad layout {text!r}: expected {value or kind} at column {at + 1}")
        k += 1
        return got

    def value() -> Any:
        if tokens[k][1] != "[":
            return int(take("int"))
        take("punct", "[")
        items = []
        while tokens[k][1] != "]":
            items.append(value())
            if tokens[k][1] != "]":
                take("punct", ",")
        take("punct", "]")
        return items

    calls = []
    while True:
        name, args, kwargs = take("name"), [], {}
        take("punct", "(")
        while tokens[k][1] != ")":
            if tokens[k][0] == "name":
                key = take("name")
                take("punct", "=")
                kwargs[key] = value()
            else:
                args.append(value())
            if tokens[k][1] != ")":
                take("punct", ",")
        take("punct", ")")
        calls.append((name, args, kwargs))
        if tokens[k][0] == "end":
            return calls
        take("punct", ".")


def _fmt(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(_fmt(v) for v in value) + "]"
    return str(value)


def _as_chain(layout: RegisterLayout) -> list[str] | None:
    """Factor the layout into primitives, outermost first; None if it has no chain form.

    Peels the first factor repeatedly: a run of leading local digits (each the
    leading mode of its dim, dims in increasing or decreasing order), else a
    replication digit, else such a run of spatial digits. Each digit only
    waits for the modes before it in its dim and its digit list, so this
    succeeds exactly when those orders have no cycle (always for products).
    """
    dim_of = {e: d for d, ids in enumerate(layout.dim_mode_ids) for e in ids}
    head = [0] * layout.rank
    ptr = {"local": 0, "spatial": 0}
    lists = {"local": layout.local_modes, "spatial": layout.spatial_modes}
    chain, shaped = [], False
    while ptr["local"] < len(lists["local"]) or ptr["spatial"] < len(lists["spatial"]):
        kind, run = "local", _run(layout, lists["local"], ptr["local"], head, dim_of)
        if not run:
            sp, j = lists["spatial"], ptr["spatial"]
            if j < len(sp) and sp[j] < 0:
                chain.append(f"replicated({-sp[j]})")
                ptr["spatial"] += 1
                continue
            kind, run = "spatial", _run(layout, sp, j, head, dim_of)
            if not run:
                return None
        shape = [1] * layout.rank
        for e in run:
            shape[dim_of[e]] = layout.sizes[e]
            head[dim_of[e]] += 1
        ptr[kind] += len(run)
        column = len(run) > 1 and dim_of[run[1]] < dim_of[run[0]]
        chain.append(f"{'column_' if column else ''}{kind}({','.join(map(str, shape))})")
        shaped = True
    if not shaped and (layout.rank > 0 or not chain):
        chain.insert(0, f"local({','.join(['1'] * layout.rank)})")
    return chain


def _run(layout: RegisterLayout, entries: Sequence[int], start: int, head: list[int], dim_of: dict) -> list[int]:
    run: list[int] = []
    for e in entries[start:]:
        if e < 0:
            break
        d = dim_of[e]
        ids = layout.dim_mode_ids[d]
        if head[d] >= len(ids) or ids[head[d]] != e:
            break
        if run:
            step = d - dim_of[run[-1]]
            if step == 0 or (len(run) > 1 and (step > 0) != (dim_of[run[1]] > dim_of[run[0]])):
                break
        run.append(e)
    return run


# -- internals -------------------------------------------------------------------


def _dim(d: int, rank: int) -> int:
    if not -rank <= d < rank:
        raise LayoutError(f"dim {d} is out of range for rank {rank}")
    return d % rank


def _same_rank(a: RegisterLayout, b: RegisterLayout) -> tuple[RegisterLayout, RegisterLayout]:
    """Broadcast a rank-0 operand to the other's rank."""
    if a.rank == b.rank:
        return a, b
    if a.rank == 0 or b.rank == 0:
        r = max(a.rank, b.rank)
        a, b = (_with_rank(x, r) if x.rank == 0 else x for x in (a, b))
        return a, b
    raise LayoutError(f"layouts {a} and {b} have different ranks ({a.rank} and {b.rank})")


def _with_rank(layout: RegisterLayout, rank: int) -> RegisterLayout:
    return RegisterLayout((1,) * rank, ((),) * rank, layout.spatial_modes, layout.local_modes)


def _assemble(shape, dim_keys, size, spatial_modes, local_modes, replicated_keys=frozenset()) -> RegisterLayout:
    """Build a layout from modes named by arbitrary keys; renumbers them in dim order.

    Entries of `spatial_modes` are keys, keys in `replicated_keys` (replication
    digits of size size[key]), or negative ints (replication digits).
    """
    new, modes = {}, []
    for keys in dim_keys:
        modes.append(tuple(size[k] for k in keys))
        for k in keys:
            new[k] = len(new)

    def entry(k):
        if isinstance(k, int) and k < 0:
            return k
        return -size[k] if k in replicated_keys else new[k]

    return RegisterLayout(
        tuple(shape), tuple(modes), tuple(entry(k) for k in spatial_modes), tuple(new[k] for k in local_modes)
    )


def _canonical(shape, modes, spatial_modes, local_modes):
    """Validate, drop size-1 modes, merge mergeable digits, renumber modes in dim order."""
    try:
        shape = tuple(int(s) for s in shape)
        modes = tuple(tuple(int(m) for m in ms) for ms in modes)
        sp, lo = [int(e) for e in spatial_modes], [int(e) for e in local_modes]
    except (TypeError, ValueError):
        raise LayoutError("layout fields must be ints and tuples of ints") from None
    if len(modes) != len(shape) or any(s < 1 for s in shape):
        raise LayoutError(f"modes {modes} do not split the positive shape {shape}")
    for s, ms in zip(shape, modes):
        if any(m < 1 for m in ms) or math.prod(ms) != s:
            raise LayoutError(f"modes {ms} do not multiply to the dim size {s}")
    size = [m for ms in modes for m in ms]
    if sorted(e for e in sp + lo if e >= 0) != list(range(len(size))) or any(e < 0 for e in lo):
        raise LayoutError(
            f"spatial {tuple(sp)} and local {tuple(lo)} must list every mode id in "
            f"[0, {len(size)}) once (negative entries, replication, only in spatial)"
        )
    dims, start = [], 0
    for ms in modes:
        dims.append([e for e in range(start, start + len(ms)) if size[e] > 1])
        start += len(ms)
    sp = [e for e in sp if (e >= 0 and size[e] > 1) or e < -1]
    lo = [e for e in lo if size[e] > 1]
    merged: list[int] = []
    for e in sp:
        if e < 0 and merged and merged[-1] < 0:
            merged[-1] *= -e
        else:
            merged.append(e)
    sp = merged
    dim_of = {e: d for d, ids in enumerate(dims) for e in ids}
    while _merge_once(dims, dim_of, size, sp) or _merge_once(dims, dim_of, size, lo):
        pass
    new = {e: k for k, e in enumerate(e for ids in dims for e in ids)}
    return (
        shape,
        tuple(tuple(size[e] for e in ids) for ids in dims),
        tuple(new[e] if e >= 0 else e for e in sp),
        tuple(new[e] for e in lo),
    )


def _merge_once(dims, dim_of, size, digits) -> bool:
    """Merge one pair of modes adjacent (major, minor) both in their dim and in `digits`."""
    for j in range(len(digits) - 1):
        a, b = digits[j], digits[j + 1]
        if a < 0 or b < 0 or dim_of[a] != dim_of[b]:
            continue
        ids = dims[dim_of[a]]
        k = ids.index(a)
        if k + 1 < len(ids) and ids[k + 1] == b:
            size[a] *= size[b]
            del digits[j + 1]
            del ids[k + 1]
            return True
    return False


def _divide(layout: RegisterLayout, divisor: RegisterLayout) -> RegisterLayout:
    """A with A * divisor == layout: divisor's digits are the minor tail of each list."""
    a, b = _same_rank(layout, divisor)
    fail = f"{layout} is not a product with right factor {divisor}"
    if any(x % y for x, y in zip(a.shape, b.shape)):
        raise LayoutError(f"{fail}: shape {b.shape} does not divide {a.shape}")
    size: dict[Any, int] = dict(enumerate(a.sizes))
    rep = set()
    sp: list[Any] = []
    for j, e in enumerate(a.spatial_modes):
        if e < 0:
            rep.add(("r", j))
            size[("r", j)] = -e
        sp.append(("r", j) if e < 0 else e)
    dims = [list(ids) for ids in a.dim_mode_ids]
    lo = list(a.local_modes)
    targets = [(ids, n) for ids, n in zip(dims, b.shape)]
    targets += [(sp, b.num_threads), (lo, b.local_size)]
    while True:  # split digits that straddle a cut until every cut falls between digits
        cuts = [_cut(entries, target, size, fail) for entries, target in targets]
        straddling = next((c for c in cuts if isinstance(c, tuple)), None)
        if straddling is None:
            break
        key, inner = straddling
        outer, minor = (key, "o"), (key, "i")
        size[outer], size[minor] = size[key] // inner, inner
        if key in rep:
            rep |= {outer, minor}
        for lst in dims + [sp, lo]:
            if key in lst:
                k = lst.index(key)
                lst[k : k + 1] = [outer, minor]
    tail_modes = {k for ids, c in zip(dims, cuts) for k in ids[c:]}
    tail_digits = {k for lst, c in ((sp, cuts[-2]), (lo, cuts[-1])) for k in lst[c:] if k not in rep}
    if tail_modes != tail_digits:
        raise LayoutError(f"{fail}: its minor modes and minor digits differ")
    quotient = _assemble(
        [x // y for x, y in zip(a.shape, b.shape)], [ids[:c] for ids, c in zip(dims, cuts)],
        size, sp[: cuts[-2]], lo[: cuts[-1]], rep,
    )  # fmt: skip
    rest = _assemble(b.shape, [ids[c:] for ids, c in zip(dims, cuts)], size, sp[cuts[-2] :], lo[cuts[-1] :], rep)
    if rest != b or quotient * b != a:
        raise LayoutError(f"{fail}: its minor part is {rest}")
    return quotient


def _cut(entries: list, target: int, size: dict, fail: str) -> int | tuple:
    """Index where the minor digits of `entries` multiply to `target`, or the
    (digit, inner size) to split first when a digit straddles that point."""
    acc, j = 1, len(entries)
    while acc < target and j > 0:
        key = entries[j - 1]
        if acc * size[key] > target:
            inner = target // acc
            if target % acc or size[key] % inner:
                raise LayoutError(f"{fail}: a digit of size {size[key]} cannot split at {inner}")
            return key, inner
        acc *= size[key]
        j -= 1
    if acc != target:
        raise LayoutError(f"{fail}: the minor digits do not multiply to {target}")
    return j
