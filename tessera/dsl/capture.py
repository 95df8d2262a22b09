"""`tessera.fusion()`: record kernel launches, fuse what the fusion pass proves safe, launch the result.

    with tessera.fusion() as f:
        scale[grid](x, t, n, 2.0, BLOCK=1024)       # recorded, not run
        relu[grid](t, out, n, BLOCK=1024)
        del t                                        # an intermediate: its store can be dropped
    print(f.report())                                # what was fused, and why the rest was not
    f.replay()                                       # run the fused launches again (same memory)

Launches inside the block are recorded with their arguments (tensors
through aliases of their storage, so the caller's objects can die) and run
when the block ends, or at `f.flush()`: the recorded sequence goes to the
fusion pass (`tessera.passes.fusion`) as launches bound to buffer names
(one per distinct memory range; overlapping ranges are marked aliased) and
scalar values, and the launches it returns run in order: unfused ones as
the kernel they were, fused ones as `FusedKernel`s. A buffer is an
intermediate (its store may be dropped) when the caller's objects for it
are garbage by then, or were passed to `f.intermediate(...)`; numpy arrays
are kept alive by their views, so mark those. Library ops are recorded as
the kernel launches they make. An autotuned launch cannot be timed while
recording (its inputs are not computed yet), so it is recorded as its
kernel launched with the pinned or already tuned config for its arguments,
else the one its `model=` predicts (`AutotunedKernel.predicted_config`; the
report names it) and fuses like any other: on GPU tensors a library GEMM
takes its elementwise consumers as its epilogue.

torch operations inside the block that read memory a recorded launch
writes, or write memory it touches, first run what is recorded (a
`TorchDispatchMode` watches, by the ops' schemas), so eager torch code sees
what it would without the capture; a numpy read of a result inside the
block needs `f.flush()` first.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

from ..passes.fusion import Decision, Launch, fuse_launches
from ..passes.fusion.accesses import Keys, accesses
from .arguments import DeviceArray, TypedArray, _device_array
from .fast_launch import launches_recorded, recorder
from .fused_kernel import FusedKernel

LAUNCH_OPTIONS = ("num_warps", "stream")


@dataclass
class Record:
    kernel: Any
    grid: Any
    args: tuple
    kwargs: dict
    fn: Any = None                       # tile IR (None: a launch the pass cannot read, run as it is)
    bind: tuple[str, ...] = ()
    writes: frozenset[str] = frozenset()  # the bound names it writes
    values: dict[str, Any] = field(default_factory=dict)     # bound name -> runtime value
    writes_all: frozenset[str] = frozenset()


class Fusion:
    """The capture `tessera.fusion()` returns (see the module docstring)."""

    def __init__(self, horizontal: bool = True):
        self.horizontal = horizontal
        self.records: list[Record] = []
        self.decisions: list[Decision] = []
        self.notes: list[str] = []
        self.shapes: dict[str, str] = {}         # buffer name -> what it holds, for the report
        self.ran: list[str] = []
        self.launches: list[Launch] = []         # what ran, as the pass returned it (IR, grid, bound names)
        self.recorded = 0
        self.ranges: dict[tuple, str] = {}       # (device, start, end) -> buffer name
        self.users: dict[str, list] = {}         # buffer name -> weak references to the caller's objects
        self.marked: set[str] = set()
        self.declared: frozenset = frozenset()   # objects the next launches write whole (`writes_whole`)
        self.busy = False                        # recording or replaying: the torch guard stands aside
        self.program: list = []                  # what the last flush ran, as calls `replay()` repeats
        self.traffic = {"recorded": 0, "ran": 0}  # bytes of the buffers each launch reads or writes
        self._stack = contextlib.ExitStack()

    # -- the block ----------------------------------------------------------

    def __enter__(self) -> "Fusion":
        self._stack.enter_context(launches_recorded(self._record))
        guard = _torch_guard(self)
        if guard is not None:
            self._stack.enter_context(guard)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.flush()
        finally:
            self._stack.close()

    def intermediate(self, *arrays) -> None:
        """Mark arrays whose contents nobody reads after the block: stores to them may be dropped."""
        for array in arrays:
            name = self._name_of(array)
            if name is not None:
                self.marked.add(name)

    def report(self) -> str:
        """What was recorded, what ran, and every fusion decision with its reason."""
        lines = [f"tessera.fusion: {self.recorded} launches recorded, {len(self.ran)} run: {', '.join(self.ran)}"]
        lines += [f"  {d}" for d in self.decisions] + [f"  {note}" for note in self.notes]
        if self.traffic["recorded"]:
            lines.append(f"  memory traffic: {self.traffic['ran']} bytes (the launches one by one: "
                         f"{self.traffic['recorded']})")
        if self.shapes:
            lines.append("  buffers: " + ", ".join(f"{n} = {d}" for n, d in sorted(self.shapes.items(),
                                                                                  key=lambda i: int(i[0][3:]))))
        return "\n".join(lines)

    # -- recording ----------------------------------------------------------

    def _record(self, kernel, grid, args, kwargs) -> None:
        self.busy = True
        try:
            self.recorded += 1
            self.records.append(self._describe(kernel, grid, args, dict(kwargs)))
        finally:
            self.busy = False

    def _describe(self, kernel, grid, args, kwargs) -> Record:
        users = [a for a in (*args, *kwargs.values()) if _is_array(a)]
        args, kwargs = tuple(_alias(a) for a in args), {k: _alias(v) for k, v in kwargs.items()}
        if hasattr(kernel, "predicted_config"):          # autotuned: a config found without timing (its inputs
            config, how = kernel.predicted_config(*args, **kwargs)       # are not computed yet), then a launch
            hint = "; launch it once outside the capture to tune it" if how == "model" else ""
            self._note(f"{kernel.name}: autotuned; launched with the {how} config ({config}){hint}")
            kernel, kwargs = kernel.kernel, {**kwargs, **config.as_dict()}
        if not hasattr(kernel, "_bind"):                 # something else that launches: run as it is
            return Record(kernel, grid, args, kwargs)
        options = {k: kwargs.pop(k) for k in LAUNCH_OPTIONS if k in kwargs and k not in kernel.source.param_names}
        bound = kernel._bind(args, kwargs)
        grid3 = kernel._resolve_grid(grid, bound)
        fn = kernel._specialization(bound).function
        names = tuple(self._bind_name(v) for v in bound.runtime_args)
        for user in users:
            self._remember(user)
        written = frozenset(n for n in (self._name_of(obj) for obj in self.declared) if n is not None)
        launch = Launch(fn, grid3, names)
        writes = frozenset(a.buffer or "" for a in accesses(launch, Keys().bind(launch)) if a.writes)
        if "" in writes:                        # a write through an address the pass cannot trace: any array
            writes = frozenset(n for n in names if not n.startswith("#"))
        return Record(kernel, grid3, args, {**kwargs, **options}, fn, names, writes,
                      dict(zip(names, bound.runtime_args)), written & set(names))

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    def _bind_name(self, value: Any) -> str:
        span = _span(value)
        if span is None:
            return f"#{value!r}"
        if span not in self.ranges:
            self.ranges[span] = f"buf{len(self.ranges)}"
        return self.ranges[span]

    def _name_of(self, array: Any) -> Optional[str]:
        span = _span_of_object(array)
        return self.ranges.get(span) if span is not None else None

    def _remember(self, obj: Any) -> None:
        name = self._name_of(obj)
        if name is not None:
            self.shapes.setdefault(name, _describe_array(obj))
            try:
                self.users.setdefault(name, []).append(weakref.ref(obj))
            except TypeError:                    # no weak references: treat as alive for good
                self.users.setdefault(name, []).append(lambda obj=obj: obj)

    # -- running ------------------------------------------------------------

    def flush(self) -> None:
        """Fuse and run what has been recorded so far."""
        records, self.records = self.records, []
        self.program = []
        self.busy = True
        try:
            with launches_recorded(None):
                segment: list[Record] = []
                for i, record in enumerate(records + [None]):
                    if record is None or record.fn is None:
                        self._run_segment(segment, records[i:] if record is not None else [])
                        segment = []
                        if record is not None:
                            call = (lambda r=record: r.kernel[r.grid](*r.args, **r.kwargs))
                            self.program.append(call)
                            call()
                            self.ran.append(f"{getattr(record.kernel, 'name', record.kernel)} (run as recorded)")
                    else:
                        segment.append(record)
        finally:
            self.busy = False

    def _run_segment(self, segment: list[Record], after: list[Record]) -> None:
        if not segment:
            return
        launches = [Launch(r.fn, r.grid, r.bind, r.writes_all) for r in segment]
        plan = fuse_launches(launches, self._live(after), self._aliased(), self.horizontal)
        self.decisions += plan.decisions
        self.traffic["recorded"] += sum(self._bytes(launch) for launch in launches)
        for launch in plan.launches:
            call = self._call(segment, launch)
            self.program.append(call)
            call()
            self.ran.append("+".join(launch.sources))
            self.launches.append(launch)
            self.traffic["ran"] += self._bytes(launch)

    def _call(self, segment: list[Record], launch: Launch):
        """A function that runs one launch of the plan: the recorded kernel, or the fused function."""
        if len(launch.origin) == 1:
            record = segment[launch.origin[0]]
            return lambda: record.kernel[record.grid](*record.args, **record.kwargs)
        values = {}
        for i in launch.origin:
            values.update(segment[i].values)
        options, kernel = segment[launch.origin[0]].kwargs, FusedKernel(launch.fn)
        args = [values[n] for n in launch.bind]
        return lambda: kernel.run(launch.grid, args, num_warps=options.get("num_warps", 4),
                                  stream=options.get("stream"))

    def replay(self) -> None:
        """Run again what the last flush ran, on the same memory, without recording or fusing anew."""
        self.busy = True
        try:
            with launches_recorded(None):
                for call in self.program:
                    call()
        finally:
            self.busy = False

    def _bytes(self, launch: Launch) -> int:
        """The bytes of the buffers a launch reads or writes (each once): what it must move at least."""
        spans = {n: s for s, n in self.ranges.items()}
        touched = {a.buffer for a in accesses(launch, Keys().bind(launch))}
        return sum(spans[n][2] - spans[n][1] for n in touched if n in spans)

    def _live(self, after: list[Record]) -> frozenset[str]:
        """Buffers needed after this segment: a later launch touches them, or the caller still holds them."""
        live = {n for n, refs in self.users.items() if n not in self.marked and any(r() is not None for r in refs)}
        for record in after:
            live.update(record.bind or self.ranges.values())
        return frozenset(live)

    def _aliased(self) -> frozenset[str]:
        spans = sorted(self.ranges.items())
        overlapping = set()
        for (a, name_a), (b, name_b) in zip(spans, spans[1:]):
            if a[0] == b[0] and b[1] < a[2]:
                overlapping.update((name_a, name_b))
        return frozenset(overlapping)

    def pending(self, tensor, writing: bool) -> bool:
        """Whether a recorded launch writes `tensor`'s memory (or, when the torch op is `writing` it, touches it)."""
        span = _span_of_object(tensor)
        if span is None or not self.records:
            return False
        if any(r.fn is None for r in self.records):         # a launch the pass cannot read: any of its arrays
            names = None
        else:
            names = {n for r in self.records for n in (r.bind if writing else r.writes)}
        spans = [s for s, n in self.ranges.items() if names is None or n in names]
        return any(s[0] == span[0] and s[1] < span[2] and span[1] < s[2] for s in spans)


def fusion(horizontal: bool = True) -> Fusion:
    """Capture kernel launches in a `with` block and run them fused: `with tessera.fusion() as f: ...`;
    `f.report()` says what was fused and why the rest was not. `horizontal=False` keeps independent launches
    apart. See `tessera/dsl/capture.py`."""
    return Fusion(horizontal)


def capturing() -> bool:
    """Whether `tessera.fusion()` is recording launches here: a library op may then pick the kernel variant
    its consumers can be fused into (the GEMM's exact kernel rather than its fast-math one). Cheap (a context
    variable read): library ops ask on every launch."""
    return isinstance(getattr(recorder(), "__self__", None), Fusion)


@contextlib.contextmanager
def writes_whole(*arrays):
    """Declare that the kernels launched inside write every element of `arrays` (what a library op knows of
    its output and the IR cannot show, e.g. a GEMM's tile order): a capture may then fuse an elementwise
    consumer into them. Outside `tessera.fusion()` it does nothing."""
    capture = getattr(recorder(), "__self__", None)
    if not isinstance(capture, Fusion):
        yield
        return
    saved, capture.declared = capture.declared, capture.declared | frozenset(arrays)
    try:
        yield
    finally:
        capture.declared = saved


# ---------------------------------------------------------------------------
# Arrays: aliases, memory ranges


def _is_array(value: Any) -> bool:
    return (hasattr(value, "__array_interface__") or hasattr(value, "__cuda_array_interface__")
            or hasattr(value, "data_ptr") or isinstance(value, TypedArray))


def _alias(value: Any) -> Any:
    """A torch tensor as a new tensor object on the same storage (so the caller's may die); others as they are."""
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        return value.detach()
    return value


def _span(value: Any) -> Optional[tuple]:
    """(device, start, end) of a bound runtime argument's memory; None for scalars."""
    if isinstance(value, TypedArray):
        start = value.array.__array_interface__["data"][0]
        return ("host", start, start + value.array.nbytes)
    if isinstance(value, DeviceArray):
        return (f"gpu{value.device}", value.address, value.address + value.nbytes)
    return None


def _span_of_object(obj: Any) -> Optional[tuple]:
    """(device, start, end) of a caller's array (numpy, torch, TypedArray, `__cuda_array_interface__`)."""
    if isinstance(obj, TypedArray):
        return _span(obj)
    if hasattr(obj, "__cuda_array_interface__") and not hasattr(obj, "data_ptr"):
        return _span(_device_array(obj))
    if hasattr(obj, "data_ptr") and hasattr(obj, "untyped_storage"):
        start = obj.data_ptr()
        device = "host" if obj.device.type == "cpu" else f"gpu{obj.device.index or 0}"
        return (device, start, start + obj.numel() * obj.element_size())
    interface = getattr(obj, "__array_interface__", None)
    if interface is not None:
        start = interface["data"][0]
        return ("host", start, start + obj.nbytes)
    return None


def _tensor_arguments(func, args, kwargs):
    """(tensor, whether the op writes it) for each tensor argument of a torch op, by its schema."""
    schema = getattr(func, "_schema", None)
    params = list(schema.arguments) if schema is not None else []
    by_name = {p.name: p for p in params}
    bound = list(zip(params, args)) + [(by_name.get(k), v) for k, v in kwargs.items()]
    for param, value in bound:
        for t in (value if isinstance(value, (list, tuple)) else [value]):
            if hasattr(t, "data_ptr"):
                alias = getattr(param, "alias_info", None) if param is not None else None
                yield t, param is None or (alias is not None and alias.is_write)


def _describe_array(obj: Any) -> str:
    """'float32[33, 24]': an array's dtype and shape, as the report names buffers."""
    dtype = str(getattr(obj, "dtype", "?")).replace("torch.", "")
    return f"{dtype}{list(getattr(obj, 'shape', ()))}"


def _torch_guard(capture: Fusion):
    """A TorchDispatchMode that runs what is recorded before a torch op touches its memory (None without torch)."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        return None

    class PendingGuard(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not capture.busy and capture.records and not getattr(func, "is_view", False) \
                    and "empty" not in func.__name__:
                if any(capture.pending(t, writing) for t, writing in _tensor_arguments(func, args, kwargs)):
                    capture.notes.append(f"ran what was recorded before torch's {func.__name__}, which touches "
                                         f"its memory")
                    capture.flush()
            return func(*args, **kwargs)

    return PendingGuard()
