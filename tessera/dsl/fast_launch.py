"""The warm GPU launch path: generated code from a launch's arguments to `cuLaunchKernel`.

`bind_arguments` classifies every argument the general way (tens of µs of
Python). A launch that repeats an earlier one needs far less, so each kernel
gets a small function generated for the kinds of arguments its last GPU
launch passed (which positions held torch tensors, CUDA-array-interface
objects, ints, floats, bools). Called as `entry(grid, *args, **kwargs)`, it

1. unpacks the arguments without `inspect` (runtime arguments by position,
   constexprs and launch options by keyword or default),
2. checks each argument's type is the kind it was generated for,
3. builds a flat key holding exactly the facts the specialization key
   records, or finer ones -- per tensor its dtype, device and 16-byte
   alignment; per int its width bucket, divisibility by 16 and == 1; which
   pairs of arrays overlap; each constexpr's type and value; num_warps --
   plus, for `@tessera.autotune`, the values that choose the config,
4. finds the prepared launch (`Launcher.prepared`) under that key (one compare
   when the key is the last one found) and calls
   it with the device addresses, the grid (a tuple or a callable of the
   arguments) and the stream.

Anything else -- an argument of another kind, a missing or unknown keyword,
an unhashable constexpr, a key not seen yet, an empty grid -- goes to the
slow path (`Kernel._launch_slowly`), which binds fully, reports errors, and
hands back the launcher to remember under the key. So a warm launch can only
select the binary the slow path would have: `tests/dsl/test_fast_launch.py`
checks that for random launches on every path.

`TESSERA_INTERPRET` and `TESSERA_AUTOTUNE_PIN` are read on the slow path,
that is when a specialization is first launched: set them before.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

from .arguments import DeviceArray
from .errors import KernelArgumentError
from .launch_codegen import ARRAY_INTERFACE, DEVICE_ARRAY, GPU_ARRAYS, TORCH, TORCH_DEVICE_ARRAY, generate_entry
from .torch_compile import dynamo_opaque


_FORGOTTEN = ((), None)                  # a memo no launch key equals (`FastLaunches.memo`)
_DIMS_CAPACITY = 4096                    # grids remembered as validated (x, y, z); the table starts over when full
_skip_launches: contextvars.ContextVar[bool] = contextvars.ContextVar("tessera_skip_launches", default=False)


_recorder: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("tessera_launch_recorder", default=None)


@contextlib.contextmanager
def launches_recorded(recorder: Callable[[Any, Any, tuple, dict], None] | None) -> Iterator[None]:
    """Inside, every kernel launch calls `recorder(kernel, grid, args, kwargs)` instead of running (None:
    launches run, as while a capture replays what it recorded); `tessera.fusion()` records this way."""
    token = _recorder.set(recorder)
    try:
        yield
    finally:
        _recorder.reset(token)


def launching_directly() -> bool:
    """Whether a launch here runs as it is called: no launch recorder (`tessera.fusion()`) and no skipping (a
    fake implementation). A caller replaying prepared launches itself (`kernels_lib/gemm_plan.py`) asks first."""
    return _recorder.get() is None and not _skip_launches.get()


def recorder() -> Callable | None:
    """The active launch recorder, if any."""
    return _recorder.get()


@contextlib.contextmanager
def launches_skipped() -> Iterator[None]:
    """Launches do nothing inside (the fake implementation of `tessera.torch.op`: the function runs on fake
    tensors for the shapes of what it returns). They are skipped on the slow path, which every launch with
    fake or meta tensors takes: their type or device never matches a prepared launch's."""
    token = _skip_launches.set(True)
    try:
        yield
    finally:
        _skip_launches.reset(token)


@dataclass(frozen=True)
class Signature:
    """The parameters a generated entry unpacks: the kernel's, less those an autotuner chooses."""

    name: str
    params: tuple[str, ...]
    constexprs: frozenset[str]
    defaults: dict[str, Any]
    generic: frozenset[str]              # do_not_specialize: no alignment or divisibility facts
    options: tuple[str, ...]             # launch keywords that are not parameters (num_warps, stream)
    tuned: frozenset[str] = frozenset()  # chosen by @tessera.autotune: never passed, set by the config
    tuning_key: tuple[str, ...] = ()     # autotune's key: their values join the launch key

    @property
    def leading(self) -> int:
        """How many parameters a warm launch passes by position: those before the first constexpr."""
        return next((i for i, p in enumerate(self.params) if p in self.constexprs), len(self.params))


@dynamo_opaque
def with_grid(kernel: Any, grid: Any) -> Callable[..., None]:
    """`kernel[grid]` (the `__getitem__` of kernels and autotuned kernels): the warm entry with the grid bound,
    kept per grid (a tuple by value, a grid function that closes over nothing by identity), so a repeated grid
    costs a lookup."""
    record = _recorder.get()
    if record is not None:
        return lambda *args, **kwargs: record(kernel, grid, args, kwargs)
    fast = kernel.fast_launches
    try:
        launch = fast.grids.get(grid)      # a tuple by value, a function without a closure by identity
    except TypeError:           # unhashable sizes (symbolic, while torch.compile traces a fake launch)
        return functools.partial(fast.entry, grid)
    if launch is not None:
        return launch
    launch = functools.partial(fast.entry, grid)
    if type(grid) is tuple or getattr(grid, "__closure__", True) is None:    # not kept: a closure may hold
        if len(fast.grids) >= _DIMS_CAPACITY:                               # tensors alive
            fast.grids.clear()
        fast.grids[grid] = launch
    return launch


class Launchable:
    """The launch entry points a kernel and an autotuned kernel share: `kernel[grid](...)`, `kernel(..., grid=)`
    and `kernel.run(..., grid=)`, each the warm entry (`fast_launches`) unless a plan is being recorded. A
    subclass has `name` and `fast_launches`."""

    __getitem__ = with_grid        # `kernel[grid](*args, **kwargs)`: launch over `grid` program instances

    @dynamo_opaque
    def __call__(self, *args, grid: Any = None, **kwargs) -> None:
        if grid is None:
            raise KernelArgumentError(f"launch kernel '{self.name}' with a grid: {self.name}[grid](...) or "
                                      f"{self.name}(..., grid=(n,))", kernel=self.name)
        if recorder() is not None:
            return recorder()(self, grid, args, kwargs)
        self.fast_launches.entry(grid, *args, **kwargs)

    @dynamo_opaque
    def run(self, *args, grid: Any, **kwargs) -> None:
        """Launch: GPU tensors run on the GPU, host arrays (or anything with TESSERA_INTERPRET=1) on the CPU."""
        if recorder() is not None:
            return recorder()(self, grid, args, kwargs)
        self.fast_launches.entry(grid, *args, **kwargs)


class Resolved(NamedTuple):
    """A warm launch taken apart (`FastLaunches.resolve`): `launch(*dims, values, stream)` runs it, the stream
    being `stream_of(ordinal)` (torch's current stream), or 0 when `stream_of` is None."""

    launch: Callable[..., None]
    dims: tuple[int, int, int]
    values: tuple
    ordinal: int
    stream_of: Callable[[int], int] | None


@dataclass(frozen=True)
class SlowLaunch:
    """What the slow path launched: the launcher, on which device (None: not known without asking the
    driver, so not remembered), every argument by name, and the config's constexprs (autotune) that a
    callable grid also sees."""

    launcher: Any
    ordinal: int | None
    by_name: dict[str, Any]
    meta: dict[str, Any] | None = None


def argument_kinds(signature: Signature, by_name: dict[str, Any]) -> tuple[tuple[str, type], ...] | None:
    """(kind, exact type) of each argument passed by position in a bound launch; None when one has no warm
    path, or no array says which device the launch runs on."""
    if any(p not in signature.constexprs for p in signature.params[signature.leading:]):
        return None                      # a runtime parameter after a constexpr: not worth a second layout
    torch = sys.modules.get("torch")
    kinds = []
    for name in signature.params[:signature.leading]:
        value = by_name[name]
        kind = type(value)
        if kind is int or kind is float or kind is bool:
            kinds.append((kind.__name__, kind))
        elif torch is not None and isinstance(value, torch.Tensor):
            kinds.append((TORCH, kind))
        elif hasattr(value, "__cuda_array_interface__"):
            kinds.append((ARRAY_INTERFACE, kind))
        elif isinstance(value, DeviceArray):        # tessera.reinterpret of a GPU tensor
            wraps_torch = type(value.obj).__module__.startswith("torch")
            kinds.append((TORCH_DEVICE_ARRAY if wraps_torch else DEVICE_ARRAY, kind))
        else:
            return None
    if not any(k in GPU_ARRAYS for k, _ in kinds):
        return None
    return tuple(kinds)


class FastLaunches:
    """One kernel's warm path: an entry generated per argument kinds, and the prepared launches by key.

    `entry(grid, *args, **kwargs)` launches; it starts as the slow path and becomes the generated code
    for the kinds of the last GPU launch that had a warm path.
    """

    def __init__(self, signature: Signature, slow: Callable[[Any, tuple, dict], SlowLaunch | None]):
        self.signature = signature
        self.slow = slow
        self.launches: dict[tuple, tuple] = {}       # key -> (prepared launch, ordinal, meta)
        self.memo: list[tuple] = [_FORGOTTEN]        # [(the last key the entry found, its launch)]
        self.dims: dict[Any, tuple[int, int, int]] = {}
        self.entries: dict[tuple, Callable] = {}
        self.entry = self.miss
        self.grids: dict[tuple, Callable] = {}       # grid -> the entry with it bound (`with_grid`)
        self.kinds: tuple | None = None              # the argument kinds `entry` was generated for
        self.resolvers: dict[tuple, Callable] = {}   # kinds -> the entry's `resolve` twin
        self.generation = 0                          # counts `clear()`s: what a caller holding a launch checks

    def clear(self) -> None:
        """Forget every prepared launch (autotune's `pin` changes which config a key launches); launches a
        caller took from `resolve` are stale from now on (`generation` moved)."""
        self.launches.clear()
        self.memo[0] = _FORGOTTEN
        self.generation += 1

    def resolve(self, grid: Any, *args: Any, **kwargs: Any) -> "Resolved | None":
        """What a warm launch `entry(grid, *args, **kwargs)` would do, without doing it: the prepared launch, the
        grid's (x, y, z), the converted argument values, the device and where its stream comes from. None
        wherever the entry would not take its warm path (a new key, other argument kinds, `stream=` given, a
        launch recorder active or launches skipped); the caller then launches the usual way. The values are
        the entry's own (`launch_codegen.generate_entry(..., resolve=True)` is the entry's source with the
        call replaced by a return), so a library op that replays them for arguments with the same facts runs
        the binary full binding picks (`kernels_lib/gemm_plan.py`)."""
        if self.kinds is None or "stream" in kwargs or _recorder.get() is not None or _skip_launches.get():
            return None
        resolver = self.resolvers.get(self.kinds)
        if resolver is None:
            resolver = self.resolvers[self.kinds] = generate_entry(self, self.kinds, resolve=True)
        found = resolver(grid, *args, **kwargs)
        return None if found is None else Resolved(*found)

    @dynamo_opaque
    def miss(self, grid: Any, *args: Any, **kwargs: Any) -> None:
        """A launch the entry cannot take: launch it the slow way, and generate an entry for its kinds."""
        if _skip_launches.get():
            return
        done = self.slow(grid, args, kwargs)
        kinds = argument_kinds(self.signature, done.by_name) if done is not None else None
        if kinds is None:
            return
        entry = self.entries.get(kinds)
        if entry is None:
            entry = self.entries[kinds] = dynamo_opaque(generate_entry(self, kinds))
        if entry is not self.entry:
            self.entry, self.kinds = entry, kinds
            self.grids.clear()

    def miss_key(self, key: tuple, grid: Any, args: tuple, kwargs: dict) -> None:
        """A launch of the entry's kinds whose key is new: launch it the slow way and remember it."""
        if _skip_launches.get():
            return
        done = self.slow(grid, args, kwargs)
        if done is not None and done.ordinal is not None:
            self.launches[key] = (done.launcher.prepared(done.ordinal), done.ordinal, done.meta)

    def grid_dims(self, grid: Any) -> tuple[int, int, int] | None:
        """A grid tuple as validated (x, y, z), remembered; None for anything the slow path must judge."""
        dims = (grid,) if type(grid) is int else grid
        if not (type(dims) is tuple and 1 <= len(dims) <= 3 and all(type(g) is int and g > 0 for g in dims)):
            return None                  # malformed or empty: the slow path raises or launches nothing
        if len(self.dims) >= _DIMS_CAPACITY:
            self.dims.clear()
        dims = self.dims[grid] = (*dims, *(1,) * (3 - len(dims)))
        return dims
