"""The source of a kernel's warm launch entry (see `fast_launch.py`), generated for its argument kinds.

For `add(x_ptr, y_ptr, out_ptr, n, BLOCK: constexpr = 1024)` launched with
torch tensors and an int, the entry reads (abridged):

    def add(grid, *args, **kwargs):
        if len(args) != 4:
            return miss(grid, *args, **kwargs)
        a0, a1, a2, a3 = args
        if len(kwargs) == 0:                             # nothing passed: every default
            c4, num_warps = D4, 4
        else:                                            # else no unknown keyword
            if not kwargs.keys() <= KNOWN: return miss(grid, *args, **kwargs)
            c4 = kwargs.get("BLOCK", D4); num_warps = kwargs.get("num_warps", 4)
        if type(a0) is not T0 or ... or type(a3) is not int:
            return miss(grid, *args, **kwargs)
        s0 = a0.data_ptr(); e0 = s0 + a0.nbytes          # likewise a1, a2
        o1 = (s1 < e0 and s0 < e1)                       # a2: o2 = (pairs with a0, a1); a2 is a1: o2 = s1 < e1
        if -2147483648 <= a3 <= 2147483647: w3 = 32 ...
        key = (a0.dtype, a0.device, not s0 & 15, ..., w3, not a3 & 15, a3 == 1, o1, o2,
               type(c4), c4, num_warps)
        found = memo's launch if key is the last key found, else launches.get(key)
        if found is None:
            return miss_key(key, grid, args, kwargs)
        ... grid -> dims, stream -> handle ...
        found[0](gx, gy, gz, (s0, s1, s2, a3), stream)

Locals are numbered (a0, c4, ...), so a parameter may have any name. The
source is registered with `linecache` under a file name inside this package,
so tracebacks show it and torch.compile treats it as tessera's own code.
"""

from __future__ import annotations

import linecache
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..runtime.dlpack import GPU_DEVICE_TYPES
from ..runtime.errors import LaunchError
from ..runtime.launcher import stream_handle, torch_current_stream
from .arguments import itemsize

if TYPE_CHECKING:
    from .fast_launch import FastLaunches

# What the first GPU launch passed at a position (besides "int", "float", "bool"): how its facts are read.
# A device array is a GPU tensor seen as another dtype (`tessera.reinterpret`), which carries its facts; the
# first launch's says whether it holds a torch tensor (then launches default to torch's current stream).
TORCH, ARRAY_INTERFACE = "torch", "array_interface"
DEVICE_ARRAY, TORCH_DEVICE_ARRAY = "device_array", "torch_device_array"
GPU_ARRAYS = (TORCH, ARRAY_INTERFACE, DEVICE_ARRAY, TORCH_DEVICE_ARRAY)
class _ItemSizes(dict):
    """typestr -> bytes per element, filled on first sight (a dict lookup where `itemsize` is a call)."""

    def __missing__(self, typestr: str) -> int:
        size = self[typestr] = itemsize(typestr)
        return size


_ITEMSIZES = _ItemSizes()
_I32 = "-2147483648 <= {v} <= 2147483647"
_I64 = "-9223372036854775808 <= {v} <= 9223372036854775807"


def generate_entry(fast: "FastLaunches", kinds: tuple[tuple[str, type], ...], resolve: bool = False) -> Callable:
    """The entry function for launches whose leading arguments have `kinds` ((kind, exact type) each). With
    `resolve`, its twin for `FastLaunches.resolve`: the same reads, key and lookup, but every miss returns None
    and a hit returns (launch, dims, values, ordinal, stream_of) instead of calling the launch."""
    sig = fast.signature
    lines: list[str] = []
    emit = lines.append
    names = {"miss": fast.miss, "miss_key": fast.miss_key, "launches": fast.launches, "memo": fast.memo,
             "dims_of": fast.dims,
             "grid_dims": fast.grid_dims, "LaunchError": LaunchError, "stream_handle": stream_handle,
             "current_stream": _current_stream_function(kinds), "prod": math.prod, "ITEMSIZE": _ITEMSIZES,
             "stated_device": stated_device, "kernel_name": sig.name,
             "KNOWN": frozenset(p for p in sig.params[sig.leading:] if p not in sig.tuned) | set(sig.options)}
    miss = "return None" if resolve else "return miss(grid, *args, **kwargs)"
    emit("def entry(grid, *args, **kwargs):")
    emit(f"    if len(args) != {sig.leading}:")
    emit(f"        {miss}")
    values = [f"a{i}" for i in range(sig.leading)]
    if values:
        emit(f"    {', '.join(values)}{',' if len(values) == 1 else ''} = args")
    keyword_values = _unpack_keywords(sig, names, emit, miss)
    guards = [f"type(a{i}) is not T{i}" for i in range(len(kinds))]
    names.update({f"T{i}": t for i, (_, t) in enumerate(kinds)})
    emit(f"    if {' or '.join(guards)}:")
    emit(f"        {miss}")
    key, overlaps, launch_values = _argument_facts(sig, kinds, emit, miss)
    key += overlaps
    key += [f"type({v}), {v}" for p, v in keyword_values.items() if p not in sig.defaults]
    key += ["kd"]               # the defaulted constexprs and num_warps (`_unpack_keywords`)
    key += [_tuning_value(sig, kinds, p, keyword_values) for p in sig.tuning_key]
    emit(f"    key = ({', '.join(key)},)")
    emit("    last = memo[0]                     # the last key found and its launch: one compare when it repeats")
    emit("    try:")
    emit("        found = last[1] if key == last[0] else launches.get(key)")
    emit("    except Exception:                  # an unhashable constexpr: the slow path says what is wrong")
    emit(f"        {miss}")
    emit("    if found is None:")
    emit(f"        {'return None' if resolve else 'return miss_key(key, grid, args, kwargs)'}")
    emit("    memo[0] = (key, found)")
    _launch(sig, kinds, values, keyword_values, launch_values, emit, miss, resolve)
    return _compile(sig.name, "\n".join(lines) + "\n", names)


def _current_stream_function(kinds) -> Callable[[int], int]:
    """torch's raw current-stream query when the launch has torch tensors (no Stream object: what Triton
    calls), else the general one."""
    torch = sys.modules.get("torch") if _on_torch_streams(kinds) else None
    raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
    return raw or torch_current_stream


def _on_torch_streams(kinds) -> bool:
    """Whether launches default to torch's current stream: torch tensors among the arguments."""
    return any(kind in (TORCH, TORCH_DEVICE_ARRAY) for kind, _ in kinds)


def _tuning_value(sig, kinds, param: str, keyword_values: dict[str, str]) -> str:
    """The key part of one of autotune's key parameters: its value, or an array's shape (as `tuning_key`)."""
    i = sig.params.index(param)
    if i >= sig.leading:
        return keyword_values[param]
    kind = kinds[i][0]
    return f"a{i}.shape" if kind == TORCH else f"tuple(q{i}['shape'])" if kind == ARRAY_INTERFACE else f"a{i}"


def _unpack_keywords(sig, names: dict, emit, miss: str) -> dict[str, str]:
    """Emit the reads of the parameters passed by keyword (or defaulted) and of the launch options; returns
    {parameter: local} for the parameters. The constexprs without a default are read first (a missing one is
    a miss); a launch passing just those takes every default without looking it up and cannot have passed
    an unknown keyword, so only longer ones check their keywords against KNOWN."""
    keyword_values, required, reads, defaults = {}, [], [], []
    defaulted, default_facts = [], []       # kd's parts, read and as the defaults make them
    for i, param in enumerate(sig.params[sig.leading:], start=sig.leading):
        if param in sig.tuned:
            continue
        keyword_values[param] = f"c{i}"
        if param in sig.defaults:
            names[f"D{i}"] = sig.defaults[param]
            reads.append(f"c{i} = kwargs.get({param!r}, D{i})")
            defaults.append(f"c{i} = D{i}")
            defaulted.append(f"type(c{i}), c{i}")
            default_facts += [type(sig.defaults[param]), sig.defaults[param]]
        else:
            required.append((f"c{i}", param))
    options = [("num_warps", "4"), ("stream", "None")]
    reads += [f"{o} = kwargs.get({o!r}, {default})" for o, default in options if o in sig.options]
    defaults += [f"{o} = {default}" for o, default in options if o in sig.options]
    if "num_warps" in sig.options:
        defaulted.append("num_warps")
        default_facts.append(4)
    # kd: the defaulted constexprs' key part (types and values) and num_warps; a launch passing none of them
    # takes it whole, made once here (KD), so its key compares them by identity
    names["KD"] = tuple(default_facts)
    reads.append(f"kd = ({''.join(part + ', ' for part in defaulted)})")
    defaults.append("kd = KD")
    if required:            # a constexpr without a default must come as a keyword
        emit("    try:")
        for local, param in required:
            emit(f"        {local} = kwargs[{param!r}]")
        emit("    except KeyError:")
        emit(f"        {miss}")
    emit(f"    if len(kwargs) == {len(required)}:")
    for line in defaults or ["pass"]:
        emit(f"        {line}")
    emit("    else:")
    emit("        if not kwargs.keys() <= KNOWN:")
    emit(f"            {miss}")
    for line in reads:
        emit(f"        {line}")
    return keyword_values


def _argument_facts(sig, kinds, emit, miss: str) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """Emit the reads of each positional argument's facts; returns the key's parts, the arrays' [start, end)
    locals and what each argument passes to the kernel."""
    key, overlaps, launch_values = [], [], []
    previous: dict[str, int] = {}            # array kind -> the position of the last array of that kind
    ranges: list[int] = []                   # the positions of the arrays so far
    for i, (kind, cls) in enumerate(kinds):
        generic = sig.params[i] in sig.generic
        value = f"a{i}"
        if kind in GPU_ARRAYS:
            reads, facts = _array_reads(i, kind, cls)
            _emit_array_reads(i, previous.get(kind), reads, [f"s{i}", f"e{i}", *facts], emit, ranges)
            previous[kind] = i
            key += facts + ([] if generic else [f"not s{i} & 15"])
            overlaps += [f"o{i}"] if ranges else []
            ranges.append(i)
            launch_values.append(f"s{i}")
            continue
        if kind == "int" and sig.params[i] in sig.tuning_key:
            emit(f"    if not {_I64.format(v=value)}:     # u64: the slow path picks the type")
            emit(f"        {miss}")              # the value itself joins the key (autotune's): no facts needed
        elif kind == "int":
            emit(f"    if {_I32.format(v=value)}:")
            emit(f"        w{i} = 32")
            emit(f"    elif {_I64.format(v=value)}:")
            emit(f"        w{i} = 64")
            emit("    else:                              # u64: the slow path picks the type")
            emit(f"        {miss}")
            key += [f"w{i}"] + ([] if generic else [f"not {value} & 15", f"{value} == 1"])
        launch_values.append(value)
    return key, overlaps, launch_values


def _array_reads(i: int, kind: str, cls: type) -> tuple[list[str], list[str]]:
    """The statements reading array argument i's address s{i}, end e{i} and key facts, and those facts' locals."""
    value = f"a{i}"
    if kind == TORCH:
        return [f"s{i} = {value}.data_ptr()", f"e{i} = s{i} + {value}.nbytes", f"d{i} = {value}.dtype",
                f"v{i} = {value}.device"], [f"d{i}", f"v{i}"]
    if kind == ARRAY_INTERFACE:
        reads = [f"q{i} = {value}.__cuda_array_interface__", f"s{i} = q{i}['data'][0]", f"t{i} = q{i}['typestr']",
                 f"e{i} = s{i} + prod(q{i}['shape']) * ITEMSIZE[t{i}]     # as the slow path's aliasing check"]
        if hasattr(cls, "__dlpack_device__"):       # else it never says which device: no call
            return reads + [f"v{i} = stated_device({value})"], [f"t{i}", f"v{i}"]
        return reads, [f"t{i}"]
    return [f"s{i} = {value}.address", f"e{i} = s{i} + {value}.nbytes", f"d{i} = {value}.dtype",
            f"v{i} = {value}.device"], [f"d{i}", f"v{i}"]         # a reinterpreted device array


def _emit_array_reads(i: int, j: int | None, reads: list[str], names: list[str], emit, earlier: list[int]) -> None:
    """Emit `reads`, and o{i}: array i's overlap with each earlier array (positions `earlier`), as the slow
    path's aliasing check sees it ([start, end) ranges intersecting). After an array argument j of the same
    kind, when the same object is passed again (a library op passing its output for every unused operand), copy
    j's locals instead and let o{i} be whether j's range is non-empty: i's overlaps are then j's, and its
    overlap with j that, so the key (which tells the two cases apart by o{i}'s type) still fixes every fact."""
    pairs = "".join(f"s{i} < e{k} and s{k} < e{i}, " for k in earlier)
    if earlier == [j]:          # one earlier array, j itself: o{i} is that pair's fact in both cases
        pairs = pairs[:-2]
    if j is None:
        for line in reads:
            emit(f"    {line}")
        if earlier:
            emit(f"    o{i} = ({pairs})")
        return
    emit(f"    if a{i} is a{j}:")
    emit(f"        {', '.join(names)} = {', '.join(n[0] + str(j) for n in names)}")     # s{i} -> s{j}, ...
    emit(f"        o{i} = s{j} < e{j}")
    emit("    else:")
    for line in reads:
        emit(f"        {line}")
    emit(f"        o{i} = ({pairs})")


def _launch(sig, kinds, values, keyword_values, launch_values, emit, miss: str, resolve: bool = False) -> None:
    """Emit the grid, the stream and the call of the prepared launch (with `resolve`: return them instead)."""
    meta = ", ".join([f"{p!r}: {v}" for p, v in zip(sig.params, values)] +
                     [f"{p!r}: {v}" for p, v in keyword_values.items()])
    emit("    launch, ordinal, tuned = found")
    emit("    if type(grid) is not tuple and type(grid) is not int:")
    if sig.tuned:       # an autotuned kernel's launches carry their config's constexprs (`SlowLaunch.meta`)
        emit(f"        meta = {{{meta}, **tuned}}")
    else:
        emit(f"        meta = {{{meta}}}")
    emit("        grid = grid(meta)")
    emit("    try:")
    emit("        dims = dims_of.get(grid) or grid_dims(grid)")
    emit("    except TypeError:                  # an unhashable grid (a list): the slow path judges it")
    emit("        dims = None")
    emit("    if dims is None:")
    emit(f"        {miss}")
    torch_args = _on_torch_streams(kinds)
    if resolve:
        emit(f"    return launch, dims, ({', '.join(launch_values)},), ordinal, "
             f"{'current_stream' if torch_args else 'None'}")
        return
    if "stream" in sig.options:
        emit("    if stream is None:")
        emit(f"        stream = {'current_stream(ordinal)' if torch_args else '0'}")
        emit("    elif type(stream) is not int:")
        emit("        stream = stream_handle(stream)")
    else:
        emit(f"    stream = {'current_stream(ordinal)' if torch_args else '0'}")
    emit("    gx, gy, gz = dims")
    emit("    try:")
    emit(f"        launch(gx, gy, gz, ({', '.join(launch_values)},), stream)")
    emit("    except LaunchError as exc:")
    emit("        raise exc.with_kernel(kernel_name) from None")


_serial = 0


def _compile(name: str, source: str, names: dict[str, Any]) -> Callable:
    """Execute the generated source; its 'file' is registered with linecache for tracebacks."""
    global _serial
    _serial += 1
    filename = str(Path(__file__).with_name(f"<launch {name} {_serial}>"))
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = dict(names)
    exec(compile(source, filename, "exec"), namespace)
    entry = namespace["entry"]
    entry.__name__ = entry.__qualname__ = name
    return entry


def stated_device(obj: Any) -> int | None:
    """The GPU a `__dlpack_device__` object says it is on; None when it does not say, -1 when not a GPU."""
    query = getattr(obj, "__dlpack_device__", None)
    if query is None:
        return None
    try:
        kind, index = query()
        return int(index) if int(kind) in GPU_DEVICE_TYPES else -1
    except Exception:        # the slow path reports what is wrong with it
        return -1
