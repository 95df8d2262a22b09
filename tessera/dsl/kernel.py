"""`@tessera.kernel`: the object users decorate, trace and launch.

    @tessera.kernel
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tessera.constexpr):
        ...

    add[(n + 1023) // 1024,](x, y, out, n, BLOCK=1024)   # grid first, Triton style
    add(x, y, out, n, BLOCK=1024, grid=(4,))             # or as a keyword

The function's source is parsed once. Each distinct specialization (see
`arguments.py`) is traced to tile IR once and cached in memory. Launches
with numpy arrays (or with `TESSERA_INTERPRET=1`) run on the CPU tile
interpreter, one program instance at a time, so `print(...)` and
`breakpoint()` inside the kernel work. Launches with GPU tensors compile
(through the disk cache) and run on the GPU (`gpu_launch.py`); the launch
options `num_warps=` and `stream=` go with the arguments. A launch that
repeats an earlier GPU launch's kinds of arguments takes the warm path
(`fast_launch.py`): generated code, no binding, one driver call.
torch.compile does not trace a launch: it calls it outside the graph
(`tessera.torch.op` makes a launching function a PyTorch op instead).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..backends.interp import Memory, run_function
from ..ir.core import Module
from ..ir.verifier import verify_module
from ..ir.errors import VerifyError
from .arguments import BoundArguments, DeviceArray, TypedArray, bind_arguments
from .tracer import build_kernel_ir
from .dependencies import kernel_dependencies
from .fast_launch import FastLaunches, Launchable, Signature, SlowLaunch
from .torch_compile import install as install_torch_compile_rules
from .gpu_launch import binary_for, interpret_device_arrays, launch_on_gpu, launcher_for
from .errors import CompileError, KernelArgumentError
from .signature import SignatureError, parse_signature
from .source import KernelSource

if TYPE_CHECKING:
    from .compiler import CompiledKernel

install_torch_compile_rules()         # torch.compile calls launches, never traces them (see torch_compile.py)

Grid = tuple[int, ...] | Callable[[dict[str, Any]], tuple[int, ...]]
LAUNCH_OPTIONS = ("num_warps", "stream")   # launch keywords that are not kernel arguments


@dataclass
class Specialization:
    """One traced specialization of a kernel."""

    key: tuple
    module: Module
    dumped: bool = False        # its tile IR was written for TESSERA_DUMP by an interpreter run

    @property
    def function(self):
        return self.module.functions[0]


class Kernel(Launchable):
    """A traced, launchable tile kernel. Create with `@tessera.kernel`."""

    def __init__(self, fn: Callable[..., Any], do_not_specialize: Iterable[str | int] = (), fast_math: bool = False,
                 tolerate: Iterable[str] = ()):
        self.fn = fn
        self.source = KernelSource.of(fn)
        self.fast_math = bool(fast_math)
        self.tolerate = tuple(tolerate)
        if not all(isinstance(t, str) and t for t in self.tolerate):
            raise KernelArgumentError(f"tolerate takes non-empty strings (parts of shortfall messages), got "
                                      f"{self.tolerate!r}", kernel=self.name)
        names = self.source.param_names
        self.do_not_specialize = frozenset(names[p] if isinstance(p, int) else p for p in do_not_specialize)
        unknown = self.do_not_specialize - set(names)
        if unknown:
            raise KernelArgumentError(f"do_not_specialize names unknown parameters {sorted(unknown)}; "
                                      f"the kernel's parameters are {names}", kernel=self.name)
        self.specializations: dict[tuple, Specialization] = {}
        self.launchers: dict[tuple, Any] = {}      # (specialization, target, num_warps) -> runtime Launcher
        self.fast_launches = FastLaunches(self.launch_signature(), self._launch_slowly)
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__

    @property
    def name(self) -> str:
        return self.fn.__name__

    @functools.cached_property
    def dependencies(self) -> tuple[list[str], dict[str, Any]]:
        """(hashes of the @tessera.func helpers it calls, global constants it reads): part of the cache key."""
        return kernel_dependencies(self.source)

    def __repr__(self) -> str:
        return f"<tessera.kernel {self.name}>"

    def launch_signature(self, tuned: Iterable[str] = (), tuning_key: Iterable[str] = ()) -> Signature:
        """What the warm launch path unpacks (`fast_launch.Signature`); autotune passes what it chooses."""
        names = self.source.param_names
        tuned = frozenset(tuned)
        options = tuple(o for o in LAUNCH_OPTIONS if o not in names and not (tuned and o == "num_warps"))
        return Signature(self.name, tuple(names), self.source.constexpr_params, dict(self.source.defaults),
                         self.do_not_specialize, options, tuned, tuple(tuning_key))

    # -- tracing ----------------------------------------------------------

    def specialize(self, *args, **kwargs) -> Specialization:
        """Trace (or fetch from the in-memory cache) the tile IR for these arguments."""
        return self._specialization(self._bind(args, kwargs))

    def ir(self, *args, **kwargs) -> str:
        """The tile IR text of the specialization these arguments select."""
        from ..ir.printer import print_module
        return print_module(self.specialize(*args, **kwargs).module)

    def _bind(self, args: tuple, kwargs: dict) -> BoundArguments:
        try:
            return bind_arguments(self.source, args, kwargs, self.do_not_specialize)
        except CompileError as exc:
            raise exc.with_kernel(self.name) from None

    def _specialization(self, bound: BoundArguments) -> Specialization:
        spec = self.specializations.get(bound.key)
        if spec is None:
            spec = Specialization(bound.key, self._trace(bound.params))
            self.specializations[bound.key] = spec
        return spec

    def _trace(self, params) -> Module:
        """The verified tile IR for `params`; every error names this kernel."""
        try:
            module = build_kernel_ir(self.source, list(params))
            if self.fast_math:      # recorded on the IR, so every stage and the cache key see it
                module.functions[0].attrs["fast_math"] = True
            verify_module(module)
        except CompileError as exc:
            raise exc.with_kernel(self.name) from None
        except VerifyError as exc:
            raise CompileError(f"internal compiler error: the traced IR is malformed ({exc}); "
                               f"please report this with the kernel", kernel=self.name) from None
        return module

    def compile(self, *args, target: str = "sm_80", num_warps: int = 4, signature: str | None = None,
                strict: bool | None = None, debug: bool | None = None, **kwargs) -> "CompiledKernel":
        """Compile to GPU code for `target`, keeping every stage (see `tessera/dsl/compiler.py`).

        Pass the launch's arguments (arrays and scalars, or just constexprs
        with `signature="*f32:16,*f32:16,i32"`) to pick the specialization.
        `strict=True` (default: $TESSERA_STRICT) makes a `tessera.pipeline`
        that gets less than it asked for an error instead of a warning;
        `debug=True` (default: $TESSERA_DEBUG) compiles device-side print and
        assert in.
        """
        from .compiler import compile_tile_module  # imports the GPU compile path only when asked for

        if signature is not None:
            try:
                params = parse_signature(self.source, signature, kwargs)
            except SignatureError as exc:
                raise KernelArgumentError(str(exc), kernel=self.name) from None
            module = self._trace(params)
        else:
            module = self.specialize(*args, **kwargs).module
        return compile_tile_module(module, target=target, num_warps=num_warps, strict=strict, debug=debug,
                                   tolerate=self.tolerate)

    # -- launching --------------------------------------------------------

    def _launch_slowly(self, grid: Grid, args: tuple, kwargs: dict) -> SlowLaunch | None:
        """Bind every argument and launch; what ran on a GPU, for the warm path to remember (None on the CPU)."""
        options = {k: kwargs.pop(k) for k in LAUNCH_OPTIONS if k in kwargs and k not in self.source.param_names}
        bound = self._bind(args, kwargs)
        grid = self._resolve_grid(grid, bound)
        if not bound.on_device:
            self.interpret_bound(self._specialization(bound), bound, grid)
        elif os.environ.get("TESSERA_INTERPRET", "0") == "1":
            interpret_device_arrays(self, bound, grid)
        else:
            launcher, ordinal = launch_on_gpu(self, bound, grid, stream=options.get("stream"),
                                              num_warps=options.get("num_warps", 4))
            return SlowLaunch(launcher, ordinal, bound.by_name)
        return None

    def binary(self, *args, target: str = "sm_80", num_warps: int = 4, **kwargs):
        """The compiled binary (a cache entry: PTX, cubin, metadata) these arguments select, via the disk cache."""
        return binary_for(self, self._bind(args, kwargs), target, num_warps)

    def resident_programs(self, *args, num_warps: int = 4, **kwargs) -> int:
        """How many programs of the specialization these (GPU) arguments select the GPU runs at once (SMs x
        blocks per SM from the compiled kernel's registers and shared memory; the driver's occupancy query).
        Size the grid of a persistent kernel whose programs wait for each other by it. Compiles and loads
        the kernel if need be; launches nothing."""
        bound = self._bind(args, kwargs)
        if not any(isinstance(a, DeviceArray) for a in bound.runtime_args):
            raise KernelArgumentError("resident_programs asks the GPU driver, so pass the GPU tensors the launch "
                                      "will take (on the CPU interpreter any number of programs is resident; "
                                      "see interpret(..., resident=))", kernel=self.name)
        launcher, ordinal = launcher_for(self, bound, num_warps)
        return launcher.resident_programs(ordinal)

    def interpret(self, *args, grid: Grid, resident: int | None = None, **kwargs) -> None:
        """Run on the CPU tile interpreter regardless of where the arguments live. `resident` bounds the
        programs live at once when they wait for each other (default: the whole grid; see
        `tessera.backends.interp.cooperative`)."""
        bound = self._bind(args, kwargs)
        self.interpret_bound(self._specialization(bound), bound, self._resolve_grid(grid, bound), resident=resident)

    def interpret_bound(self, spec: Specialization, bound: BoundArguments, grid: tuple[int, ...],
                        runtime_args: list | None = None, resident: int | None = None) -> None:
        args = bound.runtime_args if runtime_args is None else runtime_args
        if not spec.dumped and os.environ.get("TESSERA_DUMP"):
            from .compiler import dump_interpreted

            dump_interpreted(spec.module)
            spec.dumped = True
        run_function(spec.function, [Memory(a.array, a.dtype) if isinstance(a, TypedArray) else a for a in args], grid,
                     resident=resident)

    def _resolve_grid(self, grid: Grid, bound: BoundArguments) -> tuple[int, ...]:
        if callable(grid):
            grid = grid(bound.by_name)
        if isinstance(grid, int):
            grid = (grid,)
        if not (isinstance(grid, tuple) and 1 <= len(grid) <= 3 and all(isinstance(g, int) and g >= 0 for g in grid)):
            raise KernelArgumentError(f"grid must be 1 to 3 non-negative ints, got {grid!r}", kernel=self.name)
        return grid


def kernel(fn: Callable[..., Any] | None = None, *, do_not_specialize: Iterable[str | int] = (),
           fast_math: bool = False, tolerate: Iterable[str] = ()):
    """Decorate a Python function as a tile kernel: `@tessera.kernel` or `@tessera.kernel(do_not_specialize=["n"])`.

    `fast_math=True` lets GPU code trade accuracy for speed in f32 math: exp/exp2/log/log2 on the hardware
    approximations (ex2.approx.ftz, lg2.approx.ftz on NVIDIA; the native instructions on AMD), division by a
    reciprocal, and a * b + c fused into one fma. Infinities and NaNs keep their meaning (masks with -inf
    still work). The CPU interpreter computes exactly either way. Library kernels (attention) opt in.

    `tolerate` names shortfalls the kernel's author has accepted (each a part of the `PipelineWarning`'s
    message): they stay warnings in strict mode ($TESSERA_STRICT, `strict=True`), so a library kernel's
    documented fallback (decode's cp.async where TMA cannot read the block table's pages) does not fail a
    user's strict build; every other shortfall still does.
    """
    if fn is None:
        return lambda f: Kernel(f, do_not_specialize, fast_math, tolerate)
    return Kernel(fn, do_not_specialize, fast_math, tolerate)
