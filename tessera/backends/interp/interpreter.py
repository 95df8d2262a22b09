"""The tile interpreter: run a kernel's IR on the CPU, one program instance at a time.

    run_function(fn, [x, y, out, n], grid=(4,))

runs `fn` once per grid point, each instance a fresh walk over the body with
an environment from SSA value to runtime value (numpy arrays for numbers,
`Pointers`, `View`; see `values.py`). Instances run one after another in
row-major order with axis 0 fastest: (0,0,0), (1,0,0), ..., (0,1,0), ...,
so a kernel whose instances race on memory sees one fixed interleaving.
A kernel with a `while` loop runs on the cooperative scheduler
(`cooperative.py`): the same order, except that a program spinning on memory
another program will write parks and lets the others run, with `resident`
programs live at once (default: the whole grid) and a deadlock reported as an
error. `run_program` runs a single instance, for debugging one program id.

What each op does lives in the family modules (`elementwise.py`,
`shape.py`, `memory.py`, `reductions.py`, `control_flow.py`, `debug.py`,
`creation.py`), registered by op name in `registry.SEMANTICS`.

numpy floating-point warnings are silenced while a kernel runs: overflow to
inf and 0/0 -> NaN are IEEE results, not errors.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.ops import OPS
from tessera.ir.types import PointerType, SharedType, TensorMapType, Type, ViewType, scalar_dtype, shape_of

# Importing the family modules fills the semantics table.
from . import control_flow, creation, debug, elementwise, memory, reductions, shape  # noqa: F401
from . import addresses, hints, inline_asm, shared  # noqa: F401
from .addresses import AddressSpace
from .control_flow import KernelReturn
from .cooperative import CooperativeLaunch
from .errors import InterpreterError
from .registry import SEMANTICS, apply_semantics
from .storage import Memory
from .values import Pointers, View

_TERMINATORS = frozenset(name for name, opdef in OPS.items() if opdef.terminator)


def run_function(fn: Function, args: Sequence[Any], grid: int | tuple[int, ...], resident: int | None = None) -> None:
    """Run kernel `fn` on the CPU over `grid` (1 to 3 axes; a 0 runs nothing), writing results in place.

    `args` match `fn.args`: a `Memory` or numpy array for each pointer
    parameter (an array is wrapped as `Memory(array, pointee dtype)`), a
    Python or numpy number for each scalar parameter (rounded to its dtype).
    `resident` bounds the programs live at once when programs wait for each
    other (see `cooperative.py`; default: all of them).
    """
    grid3 = normalize_grid(grid, minimum=0)
    check_cluster_grid(fn, grid3)
    bound = bind_arguments(fn, args)
    cache: dict[Operation, Any] = {}
    reachable = AddressSpace(bound)
    programs = [(x, y, z) for z, y, x in itertools.product(*(range(n) for n in reversed(grid3)))]
    if not _may_spin(fn) and resident is None:
        for pid in programs:
            ProgramInstance(fn, pid, grid3, cache, reachable).run(bound)
        return
    _run_cooperatively(fn, bound, programs, grid3, max(len(programs), 1) if resident is None else resident, cache, reachable)


def check_cluster_grid(fn: Function, grid3: tuple[int, int, int]) -> None:
    """A kernel with `cluster_dims` runs on whole clusters: the grid must be a multiple of them along each axis."""
    dims = tuple(fn.attrs.get("cluster_dims") or ()) + (1, 1, 1)
    if any(g % d for g, d in zip(grid3, dims[:3])):
        raise InterpreterError(f"the grid {grid3} is not a whole number of clusters of {dims[:3]} programs "
                               "(tessera.cluster_dims): launch a grid that is a multiple of them along each axis",
                               kernel=fn.name)


def _may_spin(fn: Function) -> bool:
    """Whether `fn` has a `while` loop, the only construct a program can wait for another one in."""
    return any(op.name == "while" for op in fn.walk())


def _run_cooperatively(fn: Function, bound: list[Any], programs: list[tuple[int, int, int]],
                       grid3: tuple[int, int, int], resident: int, cache: dict[Operation, Any],
                       reachable: AddressSpace) -> None:
    launch: CooperativeLaunch

    def run(slot) -> None:
        instance = ProgramInstance(fn, slot.program_id, grid3, cache, reachable)
        instance.park = lambda op: launch.park(slot, op)
        instance.run(bound)

    launch = CooperativeLaunch(fn, programs, resident, run)
    launch.run()


def run_program(fn: Function, args: Sequence[Any], program_id: int | tuple[int, ...] = 0,
                grid: int | tuple[int, ...] | None = None) -> None:
    """Run the single instance `program_id` of a launch over `grid` (default: the
    smallest grid containing it), e.g. to reproduce one failing block."""
    pid = normalize_grid(program_id, what="program_id", minimum=0, pad=0)
    grid3 = normalize_grid(grid) if grid is not None else tuple(p + 1 for p in pid)
    if any(p >= g for p, g in zip(pid, grid3)):
        raise InterpreterError(f"program id {pid} lies outside grid {grid3}", kernel=fn.name)
    bound = bind_arguments(fn, args)
    if _may_spin(fn):       # a lone program that spins on memory is a deadlock, reported at once
        _run_cooperatively(fn, bound, [pid], grid3, 1, {}, AddressSpace(bound))
        return
    ProgramInstance(fn, pid, grid3, {}, AddressSpace(bound)).run(bound)


class ProgramInstance:
    """One program instance: its id, the environment, and the walk over regions."""

    def __init__(self, fn: Function, program_id: tuple[int, int, int], grid: tuple[int, int, int],
                 cache: dict[Operation, Any], reachable: AddressSpace | None = None):
        self.fn = fn
        self.program_id = program_id
        self.grid = grid
        self.addresses = reachable or AddressSpace([])   # the arrays the launch reaches by address (int_to_ptr)
        self.env: dict[Value, Any] = {}
        self._cache = cache          # shared by the instances of one launch
        self._lanewise = False       # a combine region runs on arrays of lanes at once
        self.park: Callable[[Operation], None] | None = None   # a cooperative launch's wait (cooperative.py)

    def run(self, args: Sequence[Any]) -> None:
        with np.errstate(all="ignore"):
            try:
                self.run_region(self.fn.body, args)
            except KernelReturn:
                pass
            shared.check_drained(self)

    def run_region(self, block: Block, args: Sequence[Any]) -> list[Any]:
        """Bind the block's arguments, run its ops, return what its terminator passes on."""
        env = self.env
        for param, value in zip(block.args, args):
            env[param] = value
        for op in block.ops:
            sem = SEMANTICS.get(op.name)
            if sem is None:
                raise self.error(op, f"the interpreter has no semantics for op '{op.name}'")
            out = apply_semantics(self, sem, op, [env[v] for v in op.operands], f"program {self.program_id}")
            if op.name in _TERMINATORS:
                return list(out)
            results = op.results
            if sem.multi:
                for result, value in zip(results, out, strict=True):
                    env[result] = self._checked(op, value, result.type)
            elif results:
                env[results[0]] = self._checked(op, out, results[0].type)
        return []

    @contextmanager
    def lanewise(self) -> Iterator[None]:
        """Run scalar-typed region code on whole arrays of lanes (shape checks off)."""
        saved, self._lanewise = self._lanewise, True
        try:
            yield
        finally:
            self._lanewise = saved

    def memo(self, op: Operation, make: Callable[[], np.ndarray]) -> np.ndarray:
        """A value that depends only on `op` (constants), computed once per launch, read-only."""
        value = self._cache.get(op)
        if value is None:
            value = np.asarray(make())
            value.setflags(write=False)
            self._cache[op] = value
        return value

    def error(self, op: Operation, message: str) -> InterpreterError:
        """An InterpreterError naming `op`, its source location, the kernel and this program."""
        return InterpreterError(message, op=op.name, loc=op.loc, kernel=self.fn.name, program_id=self.program_id)

    def _checked(self, op: Operation, value: Any, t: Type) -> Any:
        """`value` as the runtime form of type `t`; a mismatch is a bug in the op's semantics."""
        dtype = scalar_dtype(t)
        if dtype is not None:
            array = np.asarray(value)
            if array.dtype != dtype.compute_dtype or (not self._lanewise and array.shape != shape_of(t)):
                raise self.error(op, f"internal error: semantics produced {array.dtype}{list(array.shape)} "
                                     f"for a {t} (expected {dtype.compute_dtype}{list(shape_of(t))})")
            return array
        expected = View if isinstance(t, ViewType) else shared.SharedRef if isinstance(t, SharedType) else Pointers
        if not isinstance(value, expected):
            raise self.error(op, f"internal error: semantics produced {type(value).__name__} for a {t}")
        return value


def bind_arguments(fn: Function, args: Sequence[Any]) -> list[Any]:
    """Kernel arguments -> runtime values, checked against the parameters' types."""
    params = fn.args
    if len(args) != len(params):
        names = ", ".join(p.name_hint or f"arg{i}" for i, p in enumerate(params))
        raise InterpreterError(f"kernel takes {len(params)} arguments ({names}), got {len(args)}", kernel=fn.name)
    return [_bind_argument(fn, i, param, arg) for i, (param, arg) in enumerate(zip(params, args))]


def _bind_argument(fn: Function, index: int, param: Value, arg: Any) -> Any:
    name = param.name_hint or f"arg{index}"
    t = param.type

    def fail(message: str) -> InterpreterError:
        return InterpreterError(f"argument '{name}' ({t}): {message}", kernel=fn.name)

    if isinstance(t, PointerType):
        if isinstance(arg, np.ndarray):
            arg = Memory(arg, t.pointee, name=name)
        if not isinstance(arg, Memory):
            raise fail(f"pass a numpy array or a Memory, got {type(arg).__name__}")
        if arg.dtype != t.pointee:
            raise fail(f"memory holds {arg.dtype.name} elements, the kernel expects {t.pointee.name}; "
                       f"wrap it as Memory(array, {t.pointee.name})")
        named = arg if arg.name is not None else arg.named(name)
        return Pointers(named, np.zeros((), dtype=np.int64))
    if isinstance(t, TensorMapType):     # the SIMT simulator's TensorMapMemory (from a TensorMapDescription)
        if not (isinstance(arg, Memory) and hasattr(arg, "description")):
            raise fail(f"pass a tessera.ir.tensor_map.TensorMapDescription, got {type(arg).__name__}")
        return Pointers(arg if arg.name is not None else arg.named(name), np.zeros((), dtype=np.int64))
    if isinstance(t, ViewType):
        if not isinstance(arg, View) or arg.memory.dtype != t.dtype or len(arg.sizes) != t.rank:
            raise fail(f"pass a View of {t.dtype.name} elements with {t.rank} dimensions")
        return arg
    dtype = scalar_dtype(t)
    value = np.asarray(arg)
    if value.dtype.kind not in "biuf":
        raise fail(f"expected a number, got {type(arg).__name__}")
    if value.shape != shape_of(t):
        raise fail(f"expected shape {shape_of(t)}, got {value.shape}")
    return np.asarray(dtype.quantize(value))


def normalize_grid(grid, what: str = "grid", minimum: int = 1, pad: int = 1) -> tuple[int, int, int]:
    """An int or 1 to 3 ints -> three ints, missing axes filled with `pad`."""
    dims = (grid,) if isinstance(grid, (int, np.integer)) else tuple(grid)
    if not 1 <= len(dims) <= 3 or any(not isinstance(d, (int, np.integer)) or d < minimum for d in dims):
        raise InterpreterError(f"{what} must be 1 to 3 integers >= {minimum}, got {grid!r}")
    return tuple(int(d) for d in dims) + (pad,) * (3 - len(dims))
