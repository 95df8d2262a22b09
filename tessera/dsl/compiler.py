"""From a traced kernel to GPU code, keeping every stage for inspection.

    compiled = my_kernel.compile(x, y, out, n, BLOCK=1024, target="sm_90a")
    print(compiled.stages["ptx"])          # also: tile_ir, optimized_tile_ir, thread_ir, llvm_ir
    compiled.metadata                      # threads, shared memory, registers, spills (ptxas -v)
    compiled.binary                        # the cubin (NVIDIA, with ptxas) or hsaco (AMD, with ld.lld)

The stages are the compile path of DESIGN.md section 2, one function each:
tile-IR passes -> lowering to thread IR -> the target vendor's backend:
NVPTX (LLVM IR -> PTX stage -> cubin when ptxas is available) or AMDGPU
(LLVM IR -> `amdgcn` assembly stage -> hsaco when ld.lld is available;
its metadata adds the code object's register counts and kernarg layout,
`kernel_args`). `metadata["dynamic_shared_bytes"]` is what a launch passes
as dynamic shared memory: the shared bytes on NVIDIA, 0 on AMD (its LDS is
static, in the code object). `metadata["tensor_maps"]` lists the recipes of
the hidden `tensormap` parameters the compiler added for TMA loads
(`TensorMapRecipe.to_json`), from which a launcher builds them. With `TESSERA_DUMP=DIR` in the environment every
stage is also written to one folder per specialization, `DIR/<kernel>-<target>-<threads>t-<hash of the tile
IR>/<kernel>.<stage>.<ext>` (`DIR/<kernel>-interpreter-<hash>/` holds the tile IR of interpreter runs). A kernel that is
valid but cannot be lowered as configured (a pinned layout for the wrong
number of threads, more shared memory than the block has) is a
`CompileError` at the offending op's source line, and so is every refusal
of a backend (a dtype, an op or a math function the target lacks): the
backends' `CodegenError`s never leave `compile_tile_module`. A failure of
LLVM or ptxas itself is a compiler bug: a `CompileError` that says so.
A `tessera.pipeline` loop that gets less than it asked for (fewer stages,
no async copies, no TMA, no warp specialization) is a `PipelineWarning` at
the loop's line, or a `CompileError` in strict mode (`TESSERA_STRICT=1` or
`strict=True`); so, in strict mode only, is a plain `range` loop feeding a
dot that the compiler could not pipeline on its own. Device-side `print` and `assert` are compiled in debug
builds only (`TESSERA_DEBUG=1` or `debug=True`; vprintf and a trap on
NVIDIA, a trap for assert on AMD), and dropped otherwise.
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ir.core import Function, Module
from ..ir.printer import print_module
from ..ir.target import get_target
from ..ir.tensor_map import kernel_recipes
from ..backends.llvm.errors import BackendError, CodegenError
from ..passes.errors import LoweringError, PipelineWarning, UnpipelinedLoopWarning
from ..passes.manager import PassManager
from ..passes.tile_passes import default_tile_passes
from ..passes.thread_passes import lower
from ..passes.rewrite import clone_function
from .errors import CompileError
from .modes import STRICT_ENV, debug_mode, strict_mode

STAGE_EXTENSIONS = {"tile_ir": "tile.ir", "optimized_tile_ir": "opt.tile.ir", "thread_ir": "thread.ir",
                    "llvm_ir": "ll", "ptx": "ptx", "amdgcn": "s"}
BINARY_EXTENSIONS = {"nvidia": "cubin", "amd": "hsaco"}


@dataclass
class CompiledKernel:
    """Everything one compilation produced: each stage's text, the binary, and facts about it."""

    name: str
    target: str
    stages: dict[str, str]
    binary: bytes | None        # cubin (NVIDIA) or hsaco (AMD); None without ptxas / ld.lld
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def cubin(self) -> bytes | None:
        """The binary under its NVIDIA name (kept for callers that predate AMD targets)."""
        return self.binary

    @property
    def binary_extension(self) -> str:
        """"cubin" or "hsaco": how the binary's file is named."""
        return BINARY_EXTENSIONS[get_target(self.target).vendor]

    def dump(self, directory: str | os.PathLike) -> list[Path]:
        """Write every stage (and the binary) to `directory`; returns the paths written."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for stage, text in self.stages.items():
            path = out / f"{self.name}.{STAGE_EXTENSIONS[stage]}"
            path.write_text(text)
            written.append(path)
        if self.binary is not None:
            path = out / f"{self.name}.{self.binary_extension}"
            path.write_bytes(self.binary)
            written.append(path)
        return written


def compile_tile_module(module: Module, target: str = "sm_80", num_warps: int = 4,
                        strict: bool | None = None, debug: bool | None = None,
                        tolerate: tuple[str, ...] = ()) -> CompiledKernel:
    """Run a traced tile-IR module through every stage for `target` (NVIDIA or AMD). `strict` (default:
    $TESSERA_STRICT) makes a `tessera.pipeline` that gets less than it asked for an error, not a warning,
    except the shortfalls whose messages contain one of `tolerate` (the kernel's accepted ones);
    `debug` (default: $TESSERA_DEBUG) keeps device-side print and assert."""
    description = get_target(target)
    if description.vendor not in BINARY_EXTENSIONS:
        raise ValueError(f"target {target} is not supported: no backend for {description.vendor} GPUs")
    fn = module.functions[0]
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[stage] = now - clock
        clock = now

    from ..backends.llvm.run import prepare as start_llvm_worker
    start_llvm_worker()     # LLVM's process starts up while the passes and the lowering run here
    stages = {"tile_ir": print_module(module)}
    # Passes rewrite in place: work on a copy so the kernel's cached tile IR stays as traced.
    working_copy = Module([clone_function(f) for f in module.functions])
    optimized = PassManager(default_tile_passes()).run(working_copy)
    stages["optimized_tile_ir"] = print_module(optimized)
    lap("tile_passes")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", PipelineWarning)
            threads = lower(optimized, description, num_warps=num_warps, debug=debug_mode(debug))
    except LoweringError as exc:
        raise _compile_error(exc, fn) from None
    _report_shortfalls(caught, fn, strict_mode(strict), tolerate)
    stages["thread_ir"] = print_module(threads)
    lap("lower_to_threads")
    thread_fn = threads.functions[0]
    metadata = {
        "num_threads": thread_fn.attrs.get("num_threads"),
        "num_warps": num_warps,
        "shared_bytes": thread_fn.attrs.get("shared_bytes", 0),
        "stage_seconds": seconds,
    }
    if thread_fn.attrs.get("programs_per_block", 1) > 1:   # AMD's wave-group ping-pong: a block runs two programs
        metadata["programs_per_block"] = int(thread_fn.attrs["programs_per_block"])
    if thread_fn.attrs.get("cluster_dims"):     # launched in clusters (`runtime/cluster_launch.py`)
        metadata["cluster_dims"] = [int(d) for d in thread_fn.attrs["cluster_dims"]]
    recipes = kernel_recipes(thread_fn.attrs)
    if recipes:     # hidden tensormap parameters (TMA loads): what a launcher builds them from
        names = [a.name_hint for a in thread_fn.args]
        metadata["tensor_maps"] = [r.to_json(names) for r in recipes]
    backend = _amdgpu if description.vendor == "amd" else _nvptx
    try:
        binary = backend(thread_fn, description, stages, metadata)
    except BackendError as exc:
        raise _backend_compile_error(exc, fn, thread_fn, description.name) from exc
    lap("llvm_amdgcn_lld" if description.vendor == "amd" else "llvm_ptx_ptxas")
    compiled = CompiledKernel(fn.name, target, stages, binary, metadata)
    dump_dir = os.environ.get("TESSERA_DUMP")
    if dump_dir:
        compiled.dump(dump_folder(dump_dir, fn.name, f"{target}-{metadata.get('num_threads')}t", stages["tile_ir"]))
    return compiled


def dump_folder(root: str | os.PathLike, kernel: str, variant: str, tile_ir: str) -> Path:
    """`root/<kernel>-<variant>-<8 hex digits of the tile IR's sha256>`: one folder per specialization, so a
    second specialization of a kernel never overwrites the first's files."""
    digest = hashlib.sha256(tile_ir.encode()).hexdigest()[:8]
    return Path(root) / f"{kernel}-{variant}-{digest}"


def dump_interpreted(module: Module) -> None:
    """With TESSERA_DUMP set, write the tile IR a CPU-interpreter run executes."""
    root = os.environ.get("TESSERA_DUMP")
    if root:
        text = print_module(module)
        name = module.functions[0].name
        folder = dump_folder(root, name, "interpreter", text)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.{STAGE_EXTENSIONS['tile_ir']}").write_text(text)


def _report_shortfalls(caught: list, fn: Function, strict: bool, tolerate: tuple[str, ...] = ()) -> None:
    """Each PipelineWarning of the lowering at the user's source line: shown as a warning, or raised as a
    CompileError in strict mode (an UnpipelinedLoopWarning, about a loop nobody asked to pipeline, only then)
    unless its message contains one of `tolerate`. Other warnings pass on as they were."""
    for record in caught:
        warning = record.message
        if not isinstance(warning, PipelineWarning):
            warnings.warn_explicit(warning, record.category, record.filename, record.lineno)
            continue
        if isinstance(warning, UnpipelinedLoopWarning) and not strict:
            continue
        if strict and not any(part in str(warning.message) for part in tolerate):
            raise _located(f"{warning.message} (an error in strict mode: ${STRICT_ENV} or strict=True)",
                           warning.loc, fn)
        loc = warning.loc or fn.loc
        warnings.warn_explicit(PipelineWarning(f"kernel '{fn.name}': {warning.message}", loc), PipelineWarning,
                               loc.file if loc else "<kernel>", loc.line if loc else 0)


def _nvptx(thread_fn: Function, target, stages: dict, metadata: dict) -> bytes | None:
    from ..backends.nvptx.compile import compile_thread_ir

    artifacts = compile_thread_ir(thread_fn, target)
    stages["llvm_ir"] = artifacts.llvm_ir
    stages["ptx"] = artifacts.ptx
    metadata["dynamic_shared_bytes"] = artifacts.shared_bytes
    metadata.update(artifacts.ptxas_info or {})
    return artifacts.cubin


def _amdgpu(thread_fn: Function, target, stages: dict, metadata: dict) -> bytes | None:
    from ..backends.amdgpu.compile import compile_thread_ir

    artifacts = compile_thread_ir(thread_fn, target)
    stages["llvm_ir"] = artifacts.llvm_ir
    stages["amdgcn"] = artifacts.assembly
    facts = dict(artifacts.metadata)
    metadata["kernel_args"] = facts.pop("args")
    metadata["dynamic_shared_bytes"] = artifacts.dynamic_shared_bytes
    metadata.update(facts)   # kernarg_segment_size, sgpr_count, vgpr_count, wavefront_size, ...
    return artifacts.hsaco


def _compile_error(exc: LoweringError, fn: Function) -> CompileError:
    """A LoweringError as the user sees it: at the op's source line (else the kernel's), naming the kernel."""
    what = f"cannot lower '{exc.op.name}': " if exc.op is not None else ""
    return _located(what + exc.message, exc.loc, fn)


def _backend_compile_error(exc: BackendError, fn: Function, thread_fn: Function, target: str) -> CompileError:
    """A backend's refusal (CodegenError) at the op's source line; LLVM's or the assembler's failure at the
    kernel's inline assembly when it has some (its text is theirs to read), else as the internal error it is."""
    if isinstance(exc, CodegenError):
        what = f"`{exc.op_name}` " if exc.op_name else ""
        return _located(f"cannot compile {what}for {target}: {exc.message}", exc.loc, fn)
    asm = next((op for op in thread_fn.walk() if op.name == "inline_asm"), None)
    if asm is not None:
        return _located(f"the {target} toolchain rejected the kernel, which has inline assembly (here, and "
                        f"maybe elsewhere); check it is valid for {target}: {exc}", asm.loc, fn)
    return _located(f"internal compiler error while generating code for {target}: {exc}; please report it with "
                    f"the kernel", None, fn)


def _located(message: str, loc, fn: Function) -> CompileError:
    loc = loc or fn.loc
    return CompileError(message, kernel=fn.name, file=loc.file if loc else None,
                        line=loc.line if loc else None, column=loc.column if loc else None)
