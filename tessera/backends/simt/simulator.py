"""The SIMT simulator: run thread IR on the CPU, every thread of a block in lockstep.

    run_threads(fn, [x, y, out, n], grid=(4,))                  # num_threads from fn.attrs
    run_threads(fn, args, grid=4, num_threads=128, max_steps=10_000)

Blocks run one after another in the tile interpreter's order (axis 0
fastest), so a kernel computes the same thing here as in `run_function`;
blocks that spin on each other's flags are scheduled cooperatively, as there
(`interp/cooperative.py`), and the blocks of a thread-block cluster
(`cluster_dims`) run together, one at a time, handing over at waits only a
peer can end (`cluster.py`).
Within a block every SSA value is a numpy array over its T threads (see
`ops.py`): one walk over the IR executes all threads at once, and
`thread_id` is `arange(T)`. Warps are consecutive runs of `warp_size`
threads. Divergent control flow runs under a mask of active threads
(`control_flow.py`), and the two sides of a divergent `if` that waits for
other threads run as cooperatively scheduled paths (`paths.py`: warp
specialization); memory ops are bounds-, race- and vector-checked
(`memory.py`, `shared.py`), and a release/acquire pair between blocks
whose scopes do not hold each other is reported (`scopes.py`).

Launch parameters come from the function's attributes unless given:
`num_threads` (required), `warp_size` (default 32), `shared_bytes` (default
0). `max_steps` bounds the ops one block may execute, so that an infinite
loop fails with InterpreterError instead of hanging.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.ops import OPS
from tessera.ir.types import Type, scalar_dtype, shape_of

from ..interp.addresses import AddressSpace
from ..interp.control_flow import KernelReturn
from ..interp.cooperative import CooperativeLaunch
from ..interp.errors import InterpreterError
from ..interp.interpreter import bind_arguments, normalize_grid
from ..interp.registry import apply_semantics
from ..interp.values import Pointers
from . import cluster, control_flow, low_bit, mbarrier, memory, tma_store  # noqa: F401  (fill the SIMT semantics table)
from . import happens_before, scopes
from . import warp_specialization, wave_schedule, wgmma  # noqa: F401
from .ops import SIMT_SEMANTICS
from .shared import SharedMemory
from .thread_checks import TILE_ONLY_OPS, verify_thread_ir

DEFAULT_MAX_STEPS = 1_000_000
_TERMINATORS = frozenset(name for name, opdef in OPS.items() if opdef.terminator)


def run_threads(fn: Function, args: Sequence[Any], grid: int | tuple[int, ...], num_threads: int | None = None,
                *, warp_size: int | None = None, max_steps: int = DEFAULT_MAX_STEPS,
                resident: int | None = None, global_races: bool = False) -> None:
    """Run thread-IR kernel `fn` over `grid`, writing results in place.

    `args` are as for the tile interpreter's `run_function`: a numpy array or
    `Memory` per pointer parameter, a number per scalar parameter. A kernel
    with a `while` loop runs its blocks cooperatively, as `run_function` runs
    programs (blocks spinning on a flag park; `resident` blocks live at once,
    default all; a deadlock is an InterpreterError naming the loop).
    `global_races` also checks that every block's access to global memory
    another block wrote is ordered after it (`happens_before.py`).
    """
    verify_thread_ir(fn)
    launch = Launch(
        num_threads=_launch_attr(fn, "num_threads", num_threads, None),
        warp_size=_launch_attr(fn, "warp_size", warp_size, 32),
        shared_bytes=_launch_attr(fn, "shared_bytes", None, 0),
        max_steps=max_steps,
    )
    grid3 = normalize_grid(grid, minimum=0)
    bound = bind_arguments(fn, [mbarrier.as_argument(a) for a in mbarrier.with_tensor_maps(fn, args)])
    launch.addresses = AddressSpace(bound)
    launch.scoped = scopes.new_record(fn)
    launch.happens_before = happens_before.Clocks() if global_races else None
    blocks = [(x, y, z) for z, y, x in itertools.product(*(range(n) for n in reversed(grid3)))]
    if math.prod(cluster.cluster_dims(fn)) > 1:     # blocks of a cluster run together (`cluster.py`)
        if resident is not None or any(op.name == "while" for op in fn.walk()):
            raise InterpreterError("the simulator does not run clusters whose blocks spin on flags (`while` loops) "
                                   "or with resident=", kernel=fn.name)
        for members in cluster.clusters(fn, grid3):
            cluster.Cluster(fn, cluster.cluster_dims(fn),
                            [ThreadBlock(fn, pid, grid3, launch) for pid in members]).run(bound)
        return
    if resident is None and not any(op.name == "while" for op in fn.walk()):
        for pid in blocks:
            ThreadBlock(fn, pid, grid3, launch).run(bound)
        return
    cooperative: CooperativeLaunch

    def run(slot) -> None:
        block = ThreadBlock(fn, slot.program_id, grid3, launch)
        block.park = lambda op: cooperative.park(slot, op)
        block.run(bound)

    cooperative = CooperativeLaunch(fn, blocks, max(len(blocks), 1) if resident is None else resident, run)
    cooperative.run()


@dataclass
class Launch:
    """What every block of one launch shares."""

    num_threads: int
    warp_size: int
    shared_bytes: int
    max_steps: int
    cache: dict[Operation, Any] = field(default_factory=dict)
    addresses: AddressSpace | None = None      # the arrays reached by address (int_to_ptr), set per launch
    scoped: dict | None = None                 # ordered writes by address, where scopes can fail (`scopes.py`)
    happens_before: Any = None                 # with global_races: `happens_before.Clocks`


def _launch_attr(fn: Function, name: str, given: int | None, default: int | None) -> int:
    value = given if given is not None else fn.attrs.get(name, default)
    if value is None:
        raise InterpreterError(f"the kernel has no `{name}` attribute; pass {name}= to run_threads", kernel=fn.name)
    if not isinstance(value, (int, np.integer)) or value < (0 if name == "shared_bytes" else 1):
        raise InterpreterError(f"`{name}` must be a {'non-negative' if name == 'shared_bytes' else 'positive'} "
                               f"integer, got {value!r}", kernel=fn.name)
    if name == "warp_size" and value & (value - 1):
        raise InterpreterError(f"warp size must be a power of two, got {value}", kernel=fn.name)
    return int(value)


class ThreadBlock:
    """One block: its threads' environment, shared memory, active mask and the walk over regions."""

    def __init__(self, fn: Function, program_id: tuple[int, int, int], grid: tuple[int, int, int], launch: Launch):
        self.fn = fn
        self.program_id = program_id
        self.grid = grid
        self.launch = launch
        self.num_threads = launch.num_threads
        self.warp_size = launch.warp_size
        self.shared = SharedMemory(launch.shared_bytes)
        self.mask: np.ndarray | None = None  # active threads; None when all are
        self.env: dict[Value, Any] = {}
        self.steps = 0
        # Results that asynchronous ops (wgmma) still write: value -> (the op, a check of an op reading it
        # that returns an error message or None). Per-block state of semantics modules lives in `state`.
        self.unready: dict[Value, tuple[Operation, Any]] = {}
        self.state: dict[str, Any] = {}
        self.addresses = launch.addresses
        self.park = None        # a cooperative launch's wait for a block spinning on a flag (interp/cooperative.py)
        self.cluster = None     # the `cluster.Cluster` it runs in, and its rank there (none: a cluster of one)
        self.cluster_rank = 0
        # NVIDIA targets: float32 arithmetic returns the canonical NaN (`ops.canonical_nans`)
        self.canonical_nans = str(fn.attrs.get("target", "")).startswith("sm_")

    def run(self, args: Sequence[Any]) -> None:
        with np.errstate(all="ignore"):
            try:
                self.run_region(self.fn.body, [self._per_thread(a) for a in args])
            except KernelReturn:
                pass
        if self.unready:
            op = next(iter(self.unready.values()))[0]
            raise self.error(op, f"the kernel ends with {op.name} results never waited for; add the commit "
                                 "and a wait that retires them before it returns")
        left = self.shared.async_outstanding()
        if left:
            raise InterpreterError(f"{left} async copies never waited for: the kernel ends with async_copy ops "
                                   "in flight; add async_commit and async_wait {pending = 0} before it returns",
                                   kernel=self.fn.name, program_id=self.program_id)
        mbarrier.finish_block(self)
        tma_store.finish_block(self)
        warp_specialization.finish_block(self)
        wave_schedule.finish_block(self)

    def run_region(self, block: Block, args: Sequence[Any], mask: np.ndarray | None = None) -> list[Any]:
        """Run `block` for the threads in `mask` (None: all); return what its terminator passes on."""
        saved = self.mask
        self.mask = None if mask is None or mask.all() else mask
        try:
            return self._run_ops(block, args)
        finally:
            self.mask = saved

    def _run_ops(self, block: Block, args: Sequence[Any]) -> list[Any]:
        env = self.env
        for param, value in zip(block.args, args):
            env[param] = value
        for op in block.ops:
            self.steps += 1
            if self.steps > self.launch.max_steps:
                raise self.error(op, f"the block executed more than {self.launch.max_steps} ops without finishing; "
                                     "is a loop infinite? (pass a larger max_steps= to run_threads if not)")
            if self.unready:
                self._check_ready(op)
            sem = SIMT_SEMANTICS.get(op.name)
            if sem is None:
                what = "a tile-level op; lower the kernel to threads first" if op.name in TILE_ONLY_OPS else \
                    "not supported by the SIMT simulator"
                raise self.error(op, f"op '{op.name}' is {what}")
            out = apply_semantics(self, sem, op, [env[v] for v in op.operands], f"block {self.program_id}")
            if op.name in _TERMINATORS:
                return list(out)
            if sem.multi:
                for result, value in zip(op.results, out, strict=True):
                    env[result] = self._checked(op, value, result.type)
            elif op.results:
                env[op.results[0]] = self._checked(op, out, op.results[0].type)
        return []

    def _check_ready(self, op: Operation) -> None:
        for value in op.operands:
            entry = self.unready.get(value)
            if entry is not None:
                message = entry[1](op)
                if message:
                    raise self.error(op, message)

    def memo(self, op: Operation, make) -> np.ndarray:
        """A value that depends only on `op` and the launch (constants), computed once, read-only."""
        cache = self.launch.cache
        value = cache.get(op)
        if value is None:
            value = np.asarray(make())
            value.setflags(write=False)
            cache[op] = value
        return value

    def error(self, op: Operation, message: str) -> InterpreterError:
        """An InterpreterError naming `op`, its source location, the kernel and this block."""
        return InterpreterError(message, op=op.name, loc=op.loc, kernel=self.fn.name, program_id=self.program_id)

    def _per_thread(self, value: Any) -> Any:
        """A kernel argument, the same in every thread."""
        if isinstance(value, Pointers):
            return Pointers(value.memory, np.zeros(self.num_threads, dtype=np.int64) + value.offsets)
        value = np.asarray(value)
        return np.ascontiguousarray(np.broadcast_to(value, (self.num_threads, *value.shape)))

    def _checked(self, op: Operation, value: Any, t: Type) -> Any:
        """`value` as the runtime form of `t` over the threads; a mismatch is a simulator bug."""
        dtype = scalar_dtype(t)
        shape = (self.num_threads, *shape_of(t))
        if dtype is not None:
            array = np.asarray(value)
            if array.dtype != dtype.compute_dtype or array.shape != shape:
                raise self.error(op, f"internal error: semantics produced {array.dtype}{list(array.shape)} "
                                     f"for a {t} (expected {dtype.compute_dtype}{list(shape)})")
            return array
        if not isinstance(value, Pointers) or value.offsets.shape != shape:
            raise self.error(op, f"internal error: semantics produced {value!r} for a {t}")
        return value
