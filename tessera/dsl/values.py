"""What the frontend manipulates while it traces a kernel.

While the AST visitor walks a kernel, every Python expression evaluates to
either

* a compile-time Python value (int, float, bool, str, None, a DType, a tuple
  of those, a builtin, a module): a *constexpr*, folded away; or
* a `Tensor`: a traced IR value (scalar, pointer, tile of either, or view).

Builtins (`tessera.load`, `tessera.arange`, ...) receive a `Context` and
arguments of both kinds, emit IR through `ctx.builder`, and return Tensors
or Python values. `ctx.error(...)` raises a CompileError at the source
location being traced, so builtins never need to know about line numbers.
"""

from __future__ import annotations

import inspect

from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn

from ..ir.builder import Builder
from ..ir.core import Location, Value
from ..ir.types import SharedType, Type, TileType, ViewType, scalar_dtype, shape_of
from ..ir.dtypes import DType
from .errors import CompileError


class Tensor:
    """A traced IR value with Python operators handled by the tracer."""

    __slots__ = ("value",)

    def __init__(self, value: Value):
        self.value = value

    @property
    def type(self) -> Type:
        return self.value.type

    @property
    def shape(self) -> tuple[int, ...]:
        return shape_of(self.value.type)

    @property
    def dtype(self) -> DType | None:
        """The data type of a scalar or tile of scalars (None for pointers and views)."""
        return scalar_dtype(self.value.type)

    @property
    def is_tile(self) -> bool:
        return isinstance(self.value.type, TileType)

    @property
    def is_view(self) -> bool:
        return isinstance(self.value.type, ViewType)

    @property
    def is_shared(self) -> bool:
        """A shared-memory buffer (`tessera.shared`) or a slot of one."""
        return isinstance(self.value.type, SharedType)

    def __bool__(self) -> NoReturn:
        # `if tensor:` / `a and b` on traced values must go through the code
        # generator (structured control flow), never Python's truth test.
        raise TypeError("a traced value has no compile-time truth value")

    def __repr__(self) -> str:
        return f"Tensor({self.value.type})"


@dataclass
class Context:
    """Handed to every builtin: where to emit IR and how to report errors."""

    builder: Builder
    kernel_name: str = ""
    file: str | None = None
    source_lines: list[str] = field(default_factory=list)
    # Set by the tracer: inline a @tessera.func at the insertion point,
    # `call_function(func, args) -> result`. Builtins with function arguments
    # (custom reduce/scan combine functions) use it to fill their regions.
    call_function: Callable[[Any, list[Any]], Any] | None = None

    @property
    def loc(self) -> Location | None:
        return self.builder.loc

    def error(self, message: str, cls: type[CompileError] = CompileError) -> NoReturn:
        """Raise `cls(message)` pointing at the source line being traced."""
        loc = self.builder.loc
        line = loc.line if loc else None
        source = None
        if line is not None and 0 < line <= len(self.source_lines):
            source = self.source_lines[line - 1].rstrip("\n")
        raise cls(message, kernel=self.kernel_name or None, file=loc.file if loc else self.file,
                  line=line, column=loc.column if loc else None, source_line=source)


@dataclass(frozen=True)
class Builtin:
    """A language function usable inside kernels, e.g. `tessera.load`.

    `impl(ctx, *args, **kwargs)` emits IR. Calling the builtin from plain
    Python (outside a kernel) is an error that says so.
    """

    name: str
    impl: Callable[..., Any]
    doc: str = ""

    def __post_init__(self):
        # what help(), IDEs and inspect.signature read: the language function's own text and parameters
        # (the implementation's, without its leading `ctx`)
        params = list(inspect.signature(self.impl).parameters.values())[1:]
        for attr, value in (("__doc__", self.doc), ("__name__", self.name), ("__qualname__", self.name),
                            ("__module__", "tessera"), ("__signature__", inspect.Signature(params))):
            object.__setattr__(self, attr, value)

    def __repr__(self) -> str:
        return f"<tessera.{self.name}>"

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"tessera.{self.name} can only be called inside a @tessera.kernel or @tessera.func")


BUILTINS: dict[str, Builtin] = {}


def builtin(fn: Callable[..., Any] | None = None, *, name: str | None = None):
    """Register `fn(ctx, ...)` as the language function `tessera.<name>`."""
    def register(f: Callable[..., Any]) -> Builtin:
        key = name or f.__name__.rstrip("_")
        if key in BUILTINS:
            raise RuntimeError(f"builtin {key!r} defined twice")
        b = Builtin(key, f, f.__doc__ or "")
        BUILTINS[key] = b
        return b
    return register(fn) if fn is not None else register


class static_range:
    """`for i in tessera.static_range(lo, hi, step)`: a loop unrolled at compile time (bounds must be constexpr).

    Outside kernels it behaves like `range`.
    """

    def __init__(self, *args: int):
        self.range = range(*args)

    def __iter__(self):
        return iter(self.range)


class pipeline:
    """`for k in tessera.pipeline(lo, hi, step, stages=S)`: a runtime loop whose global -> shared copies
    for `dot` operands are software-pipelined S deep (cp.async ring buffers; direct-to-LDS loads on gfx942 / gfx950; see
    `passes/schedule/software_pipeline.py`). It computes what `range` computes; `stages` (a compile-time
    int >= 1; 1 keeps the loop plain) is recorded on the IR `for`. A bare `range` loop feeding a `dot` is
    pipelined by the compiler on its own where that is safe (3 stages on sm_80+,
    `passes/schedule/auto_pipeline.py`); `tessera.pipeline` sets the depth, or opts out with stages=1. `warp_specialize=True` (sm_90/sm_90a, TMA
    loads only) adds a producer warpgroup that fills the ring while the `num_warps` consumer warps compute
    (`passes/schedule/warp_specialization.py`); it is recorded on the IR `for` as `warp_specialize = true`.
    Directly in a persistent kernel's loop over tiles, the producer walks the tiles too, filling the next
    tile's slots during this one's epilogue (`passes/schedule/warp_specialized_tiles.py`).
    `pingpong=True` with it has two consumer warpgroups take turns issuing their wgmmas, so one's softmax (or
    other non-tensor-core work) runs under the other's (FlashAttention-3's ping-pong; `pingpong = true`).
    On AMD (gfx942, gfx950), `pingpong=True` without it and with stages=1 is HipKittens' wave-group ping-pong:
    the block's `num_warps` waves are two groups, each running one program (launch half the programs along
    axis 0), one s_barrier apart, so one group's MFMAs run under the other's loads (`passes/wave_pingpong.py`).

    Outside kernels it behaves like `range`.
    """

    def __init__(self, *args: int, stages: int = 2, warp_specialize: bool = False, pingpong: bool = False):
        self.range = range(*args)
        self.stages = stages
        self.warp_specialize = warp_specialize
        self.pingpong = pingpong

    def __iter__(self):
        return iter(self.range)


@dataclass(frozen=True)
class constexpr:
    """Annotation for kernel parameters whose value is fixed at compile time: `BLOCK: tessera.constexpr`."""

    value: Any = None
