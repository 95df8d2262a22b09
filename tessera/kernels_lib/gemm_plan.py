"""`tessera::gemm`'s warm path: one plan per call shape, replayed without checks, binding or config selection.

The general path (`gemm._gemm`) checks the arguments, lays them out, picks
the kernels (a split-K plan or the autotuned tiled kernel, fast math or
not), states the operands' alignment and launches through each kernel's warm
entry. All of that depends only on what `plan_key` holds -- per operand its
shape, strides, dtype, device and whether its address is 16-byte aligned;
whether the operands overlap; the bias's layout, the activation, the output
dtype and the transposes -- so the first warm call of a key records what it
launched (`Recording`: each kernel's prepared launch, grid and argument
values, from the entry's `resolve` twin) and later calls replay it
(`GemmPlan.run`): allocate C (and a split-K workspace), read three addresses,
one prepared launch per kernel.

Why a replay runs the binary full binding picks: a kernel's warm entry keys
its launch on each array's dtype, device, 16-byte alignment and pairwise
overlap, each int's value class, and the constexprs and tuning values. The
plan key fixes all of them: the ints (sizes, strides, split steps) and
constexprs (tile, ALIGN, PIPELINED, flags) follow from the shapes, strides,
dtypes and alignment; C and the workspace are fresh allocations, so they
overlap no operand, and a replay checks that they are aligned as when the
plan was recorded. A plan keeps the `generation` of each kernel's warm
launches and is dropped when one moved (autotune's `pin`, a test forgetting
prepared launches). tests/kernels_lib/test_gemm_plan.py checks replays
against the general path for random calls.

fp8 scales are planned too: a replay passes each scale's address as the
general path does (`scale_operand`: a per-tensor 0-d scale as it is, which
the kernels read as one scalar; a vector as it is when dense); the key holds
each scale's layout (so its mode: a plan recorded for a vector never replays
for a 0-d scale, nor the other way), alignment, overlaps and identities with
the other operands.

Not planned (the general path runs every time): operands that need a copy
(not dense), an empty K, calls inside `tessera.fusion()`.
$TESSERA_GEMM_ATOMIC_SPLIT_K is read on each call of a plan that splits K, and
on AMD GPUs the plan target (`targets.plan_target`: $TESSERA_AMD_PLANS) on
each call;
$TESSERA_INTERPRET and $TESSERA_GEMM_STREAM_K when a key is first planned (as for kernels' warm path). A
stream-K plan replays only on the stream it was recorded on, whose arrival counters it passes.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any, Callable, Iterator, NamedTuple, Optional

import torch

from tessera import LaunchError

A, B, BIAS, C, WORKSPACE, ALPHA, SCALE_A, SCALE_B = range(8)    # a replay's pool: a call's addresses, alpha
_POOL = 8
CAPACITY = 4096                                  # plans kept; the table starts over when full


def plan_key(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], activation, out_dtype, trans_a: bool,
             trans_b: bool, scale_a: Optional[torch.Tensor] = None,
             scale_b: Optional[torch.Tensor] = None) -> tuple[tuple, int, int, int]:
    """(the plan key of a call, a's, b's and bias's addresses (0 without bias)); see the module docstring.
    `a is b` is part of it: a recording finds each operand's place among the launch arguments by identity,
    so a plan recorded from gemm(x, x) passes one address twice, right only for calls passing one tensor twice."""
    pa, pb = a.data_ptr(), b.data_ptr()
    ea, eb = pa + a.nbytes, pb + b.nbytes
    key = (a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device, pa & 15 == 0,
           pb & 15 == 0, pa < eb and pb < ea, a is b, activation, out_dtype, trans_a, trans_b)
    if scale_a is not None or scale_b is not None:
        key = (*key, _scale_facts([(a, pa, ea), (b, pb, eb)] if bias is None else
                                  [(a, pa, ea), (b, pb, eb), (bias, bias.data_ptr(), bias.data_ptr() + bias.nbytes)],
                                  scale_a, scale_b))
    if bias is None:
        return key, pa, pb, 0
    pc = bias.data_ptr()
    ec = pc + bias.nbytes
    return (*key, bias.shape, bias.stride(), bias.dtype, bias.device, pc & 15 == 0, pa < ec and pc < ea,
            pb < ec and pc < eb), pa, pb, pc


def _scale_facts(seen: list, scale_a: Optional[torch.Tensor], scale_b: Optional[torch.Tensor]) -> tuple:
    """What the launches' specialization reads of the fp8 scales (`seen`: the operands as (tensor, start, end)):
    per scale (None: absent) its layout, dtype, device and alignment, and its identity to and overlap with each
    operand and scale before it (a 0-d scale or a dense vector is passed as it is, so it may be, or share bytes
    with, the bias or the other scale)."""
    facts = []
    for scale in (scale_a, scale_b):
        if scale is None:
            facts.append(None)
            continue
        ps = scale.data_ptr()
        es = ps + scale.nbytes
        relations = []
        for t, p, e in seen:
            relations += (t is scale, p < es and ps < e)
        facts.append((scale.shape, scale.stride(), scale.dtype, scale.device, ps & 15 == 0, tuple(relations)))
        seen.append((scale, ps, es))
    return tuple(facts)


def scale_mode(scale: Optional[torch.Tensor]) -> str:
    """The kernels' SCALE_A / SCALE_B for an fp8 scale (`gemm_epilogue.SCALE_MODES`): "none", "tensor" for a
    0-d scale (one scalar load), "vector" for one per row / column."""
    return "none" if scale is None else "tensor" if scale.dim() == 0 else "vector"


def scale_operand(scale: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """What the kernels read of an fp8 scale: a per-tensor (0-d) scale as it is, a vector as it is when dense
    (the general path and a replay both make it here; a 0-d tensor is never copied)."""
    if scale is None or scale.dim() == 0:
        return scale
    return scale.contiguous()       # (no reshape: -0.9 µs)


class Step(NamedTuple):
    """One recorded launch: `launch(gx, gy, gz, pick(pool + consts), stream)` with the call's pool."""

    fast: Any                   # the kernel's FastLaunches: its generation says whether `launch` is current
    generation: int
    launch: Callable[..., None]
    gx: int
    gy: int
    gz: int
    pick: Callable[[tuple], tuple]
    consts: tuple
    ordinal: int
    stream_of: Optional[Callable[[int], int]]
    name: str


class GemmPlan:
    """What one plan key launches: C's shape and dtype, the workspace (if K is split), the steps."""

    __slots__ = ("out_shape", "out_dtype", "device", "workspace", "atomic", "atomic_now", "steps", "stream",
                 "scaled", "target", "_current", "_launches", "_rows", "_columns")

    def __init__(self, out_shape: tuple[int, int], out_dtype: torch.dtype, device: torch.device,
                 workspace: Optional[tuple[tuple[int, int], bool]], atomic: Optional[bool],
                 atomic_now: Callable[[], bool], steps: tuple[Step, ...], stream: Optional[int] = None,
                 scaled: bool = False, target: Optional[tuple[str, Callable[[], str]]] = None):
        self.out_shape, self.out_dtype, self.device = out_shape, out_dtype, device
        self.scaled = scaled            # fp8 scales: their addresses read per call (`scale_operand`)
        self.target = target            # AMD: (the plan target the launches were picked for, the target now)
        self.workspace = workspace      # (shape, zeroed) of the float32 split-K partials, or None
        self.atomic = atomic            # K split: whether it sums with atomics (the env switch at recording)
        self.atomic_now = atomic_now    # ... and the switch now
        self.steps = steps
        self.stream = stream            # the stream whose arrival counters a stream-K step uses, or None
        self._current = tuple((s.fast, s.generation) for s in steps)      # plain tuples: read on every call
        self._launches = tuple(s[2:] for s in steps)
        self._rows, self._columns = out_shape       # torch.empty(rows, columns, ...): ~0.4 µs less than a shape tuple

    def run(self, pa: int, pb: int, pbias: int, alpha: float, scale_a: Optional[torch.Tensor] = None,
            scale_b: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """Launch for a call with these addresses (and fp8 scales) and return C; None, with nothing launched, when
        the plan is stale (a kernel's prepared launches were forgotten, the atomic switch moved) or a fresh
        allocation is not 16-byte aligned as at recording: the general path then decides."""
        for fast, generation in self._current:
            if fast.generation != generation:
                return None
        if self.atomic is not None and self.atomic_now() != self.atomic:
            return None
        if self.target is not None and self.target[1]() != self.target[0]:
            return None                 # $TESSERA_AMD_PLANS moved: another target's tiles
        if self.stream is not None:     # stream K's counters are the recording stream's: another one re-plans
            step = self.steps[0]
            if step.stream_of is None or step.stream_of(step.ordinal) != self.stream:
                return None
        c = torch.empty(self._rows, self._columns, dtype=self.out_dtype, device=self.device)
        pc = c.data_ptr()
        if pc & 15:
            return None
        pw = 0
        if self.workspace is not None:
            shape, zeroed = self.workspace
            work = (torch.zeros if zeroed else torch.empty)(shape, dtype=torch.float32, device=self.device)
            pw = work.data_ptr()
            if pw & 15:
                return None
        psa = psb = 0
        if self.scaled:                 # (the copies stay referenced until the launches are queued)
            operand_a, operand_b = scale_operand(scale_a), scale_operand(scale_b)
            if operand_a is not None:
                psa = operand_a.data_ptr()
                if psa & 15 and operand_a is not scale_a:
                    return None         # a fresh copy not aligned as at recording
            if operand_b is not None:
                psb = operand_b.data_ptr()
                if psb & 15 and operand_b is not scale_b:
                    return None
        pool = (pa, pb, pbias, pc, pw, float(alpha), psa, psb)
        for launch, gx, gy, gz, pick, consts, ordinal, stream_of, name in self._launches:
            try:
                launch(gx, gy, gz, pick(pool + consts), 0 if stream_of is None else stream_of(ordinal))
            except LaunchError as exc:
                raise exc.with_kernel(name) from None
        return c


class Direct:
    """How the general path launches: `kernel[grid](*args, **kwargs)`; `adapt` turns its tensors into the arrays
    the kernels take (the identity, but for `stub_gpu_operands`)."""

    def __init__(self, adapt: Callable[[tuple], tuple]):
        self.adapt = adapt

    def launch(self, kernel: Any, grid: Any, args: tuple, kwargs: dict) -> None:
        kernel[grid](*args, **kwargs)

    def workspace(self, tensor: torch.Tensor, zeroed: bool) -> Any:
        """A split-K workspace the launch allocated (zeroed or not), as the kernels take it."""
        return self.adapt((tensor,))[0]

    def pin_stream(self, stream: int) -> None:
        """A recording replays only on `stream` (see `Recording.pin_stream`); launching directly, nothing to do."""


class Recording(Direct):
    """Launches like `Direct`, recording each launch as a plan step (`complete` when every one was warm)."""

    def __init__(self, adapt: Callable[[tuple], tuple], a_mem: Any, b_mem: Any, bias_mem: Any, c: Any,
                 alpha: float, scale_a_mem: Any = None, scale_b_mem: Any = None):
        super().__init__(adapt)
        self.slots = {id(a_mem): A, id(b_mem): B, id(c): C, id(alpha): ALPHA}
        if bias_mem is not c:
            self.slots[id(bias_mem)] = BIAS
        for array, slot in ((scale_a_mem, SCALE_A), (scale_b_mem, SCALE_B)):
            if array is not None:       # (a scale that is the bias, or the other scale: one address either way)
                self.slots[id(array)] = slot
        self.scaled = scale_a_mem is not None or scale_b_mem is not None
        self.alive = [a_mem, b_mem, bias_mem, c, alpha, scale_a_mem, scale_b_mem]  # ids stay theirs while recording
        self.steps: list[Step] = []
        self.complete = True
        self.workspace_of: Optional[tuple[tuple[int, int], bool]] = None
        self.workspace_aligned = True
        self.stream: Optional[int] = None

    def pin_stream(self, stream: int) -> None:
        """The launches use state kept per stream (stream K's arrival counters): replay only on `stream`."""
        self.stream = stream

    def workspace(self, tensor: torch.Tensor, zeroed: bool) -> Any:
        array = super().workspace(tensor, zeroed)
        self.slots[id(array)] = WORKSPACE
        self.alive.append(array)
        self.workspace_of = (tuple(tensor.shape), zeroed)
        self.workspace_aligned = tensor.data_ptr() & 15 == 0
        return array

    def launch(self, kernel: Any, grid: Any, args: tuple, kwargs: dict) -> None:
        """`kernel[grid](*args, **kwargs)`, recorded as a step when it takes the warm path."""
        fast = kernel.fast_launches
        generation = fast.generation
        found = fast.resolve(grid, *args, **kwargs)
        if found is None:
            self.complete = False
            kernel[grid](*args, **kwargs)
            return
        indices, consts = [], []
        for arg, value in zip(args, found.values):
            slot = self.slots.get(id(arg))
            if slot is None:
                indices.append(_POOL + len(consts))
                consts.append(value)
            else:
                indices.append(slot)
        self.steps.append(Step(fast, generation, found.launch, *found.dims, operator.itemgetter(*indices),
                               tuple(consts), found.ordinal, found.stream_of, kernel.name))
        try:
            found.launch(*found.dims, found.values,
                         0 if found.stream_of is None else found.stream_of(found.ordinal))
        except LaunchError as exc:
            raise exc.with_kernel(kernel.name) from None


class Plans(dict):
    """Plan key -> GemmPlan, emptied when full."""

    def remember(self, key: tuple, recording: Recording, c: torch.Tensor, atomic: Optional[bool],
                 atomic_now: Callable[[], bool], target: Optional[tuple[str, Callable[[], str]]] = None) -> None:
        """Keep what `recording` launched under `key`, if every launch was warm and C and the workspace are
        16-byte aligned (what a replay checks its own allocations against). `target`: on AMD, the plan target
        the launches were picked for and how to read it now (`GemmPlan.run` compares them)."""
        if not (recording.complete and recording.steps and recording.workspace_aligned) or c.data_ptr() & 15:
            return
        if len(self) >= CAPACITY:
            self.clear()
        self[key] = GemmPlan(tuple(c.shape), c.dtype, c.device, recording.workspace_of, atomic, atomic_now,
                             tuple(recording.steps), recording.stream, recording.scaled, target)


class _CudaView:
    """A CPU tensor as a GPU array (`__cuda_array_interface__` at its host address), for `stub_gpu_operands`."""

    def __init__(self, t: torch.Tensor):
        self.tensor = t
        typestr = {torch.float16: "<f2", torch.float32: "<f4", torch.uint8: "|u1", torch.int16: "<i2",
                   torch.int32: "<i4"}[t.dtype]
        self.__cuda_array_interface__ = {"shape": tuple(t.shape), "typestr": typestr, "data": (t.data_ptr(), False),
                                         "version": 3, "strides": tuple(s * t.element_size() for s in t.stride())}


# bfloat16 and fp8 have no CUDA-array-interface type: their views hold the bits, reinterpreted
_BITS = {torch.bfloat16: (torch.int16, "bf16"), torch.float8_e4m3fn: (torch.uint8, "f8e4m3"),
         torch.float8_e5m2: (torch.uint8, "f8e5m2")}


def _cuda_view(t: torch.Tensor) -> Any:
    if t.dtype not in _BITS:
        return _CudaView(t)
    import tessera
    bits, name = _BITS[t.dtype]
    return tessera.reinterpret(_CudaView(t.view(bits)), getattr(tessera, name))


def _cuda_views(args: tuple) -> tuple:
    """`args` with each tensor as a `_CudaView`, one per tensor (a tensor passed twice is one array twice)."""
    views: dict[int, Any] = {}
    return tuple(views.setdefault(id(x), _cuda_view(x)) if isinstance(x, torch.Tensor) else x for x in args)


@contextlib.contextmanager
def stub_gpu_operands(num_sms: int = 132) -> Iterator[None]:
    """Inside, the op runs CPU float16 / float32 tensors as if they were on a GPU of `num_sms` SMs: its launches
    get them as `__cuda_array_interface__` arrays at their host addresses. With `runtime.stub_driver` in place
    this is the op's whole GPU path -- checks, plans, allocation (on the CPU), launches -- without a GPU:
    bench/launch_overhead.py --stub-driver times it and tests/kernels_lib/test_gemm_plan.py checks it."""
    import importlib

    gemm = importlib.import_module(__package__ + ".gemm")     # the package exports the function `gemm`

    saved = gemm._runs_on_gpu, gemm._device_args, gemm._num_sms
    gemm._runs_on_gpu = lambda a: True
    gemm._device_args = _cuda_views
    gemm._num_sms = lambda ordinal: num_sms
    try:
        yield
    finally:
        gemm._runs_on_gpu, gemm._device_args, gemm._num_sms = saved
