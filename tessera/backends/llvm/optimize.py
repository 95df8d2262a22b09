"""LLVM IR text -> assembly (PTX, AMDGCN) and, on request, an object file: parse,
link a bitcode library, verify, optimize at O3, emit. Target-neutral: the
triple, CPU and features say what to emit.

This file imports nothing but llvmlite and the standard library, so it also
runs on its own as the compile worker, a child process where an LLVM abort
or hang cannot take the caller down (`worker.py` starts and stops it):

    python -P optimize.py --serve     # one JSON request per line in, one reply per line out

A request holds `compile_llvm`'s keyword arguments; its reply is
`{"ok": true, "assembly": ..., "optimized_ir": ..., "object": base64 or null}`
or `{"ok": false, "error": ...}`. The worker answers requests one at a time
until its stdin closes or its parent process is gone.

Details that matter:
* the module's data layout comes from the target machine (llvmlite prints
  an empty one);
* O3 is the new pass manager's default pipeline (`create_pass_builder`),
  which for NVPTX includes NVVMReflect, so libdevice's `__nvvm_reflect`
  checks fold (no flush-to-zero: the module sets no `nvvm-reflect-ftz`);
* a bitcode library (CUDA's libdevice) is large (~500 functions, ~70 ms to
  parse): the first time a function is needed, the parsed library is cut
  down to the requested functions and what they call, and that bitcode is
  cached for the process. The cut-down functions are `linkonce_odr`, so two
  cached pieces that both hold a helper link without clashing; after
  linking, everything but the kernel becomes internal and O3 drops what is
  unused;
* `emit_object` also returns the relocatable object (`emit_object`, ET_REL
  for AMDGPU, which `ld.lld` links into a code object);
* `sink_vectors` (AMDGPU): a kernel whose code spills registers is generated
  a second time from the optimized IR with its cheap loop-invariant vectors
  and lane masks recomputed where used (`sink_vectors.py`), and the version
  that spills less is kept; a kernel that does not spill is untouched. One
  that still spills SGPRs is tried once more with its arguments read from
  the kernarg segment where used and what is computed from them alone
  recomputed there (`reload_arguments.py`), and lane masks computed after
  the barriers their uses follow, kept if it spills less and needs no more
  scratch. Only the kept version's object is emitted.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import llvmlite.binding as llvm


class LLVMError(RuntimeError):
    """LLVM rejected the module (parse or verification error, missing library function)."""


_LOCK = threading.Lock()  # one LLVM context for the process: compile one module at a time
_INITIALIZED = False
_TARGET_MACHINES: dict[tuple, llvm.TargetMachine] = {}
_LIBRARY_PIECES: dict[tuple[str, str], bytes] = {}  # (library path, function) -> bitcode holding it
_SIBLINGS: dict = {}  # module name -> a module of this folder (`_sibling`)


def compile_llvm(llvm_ir: str, *, kernel: str, triple: str, cpu: str, features: str, opt_level: int = 3,
                 bitcode_library: str | None = None, library_functions: list[str] = (),
                 emit_object: bool = False, sink_vectors: bool = False) -> dict:
    """Assembly, optimized IR and (with `emit_object`) the object bytes of module `llvm_ir`; raises LLVMError.
    `sink_vectors` (AMDGPU): if the code spills registers, also generate it with the cheap vector values
    recomputed where they are used (`sink_vectors.py`), and keep whichever spills less."""
    with _LOCK:
        tm = _target_machine(triple, cpu, features, opt_level)
        try:
            module = llvm.parse_assembly(llvm_ir)
        except RuntimeError as e:
            raise LLVMError(f"LLVM could not parse the module: {e}") from None
        module.triple = triple
        module.data_layout = str(tm.target_data)
        if library_functions:
            _link_library(module, kernel, bitcode_library, list(library_functions), tm)
        try:
            module.verify()
        except RuntimeError as e:
            raise LLVMError(f"LLVM's verifier rejected the module: {e}") from None
        pass_builder = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=opt_level))
        pass_builder.getModulePassManager().run(module, pass_builder)
        optimized_ir = str(module)
        result = _emit(tm, module, optimized_ir, emit_object)
        if sink_vectors and any(_spills(result["assembly"])):
            sink = _sibling("sink_vectors")
            for scheduler in (None, sink.LOW_PRESSURE_SCHEDULER):   # the second only if the first still spills
                sunk = _sink_vectors(optimized_ir, kernel, triple, cpu, features, opt_level, emit_object, scheduler)
                if sunk is None:
                    break
                if _spills(sunk["assembly"]) < _spills(result["assembly"]):
                    result = sunk
                if not any(_spills(result["assembly"])):
                    break
            for scheduler in (None, sink.LOW_PRESSURE_SCHEDULER):   # SGPR spills left: base addresses read again
                if not _spills(result["assembly"])[1]:                # where used (`reload_arguments.py`)
                    break
                reloaded = _sink_vectors(optimized_ir, kernel, triple, cpu, features, opt_level, emit_object,
                                         scheduler, reload_arguments=True)
                if reloaded is not None and _spills(reloaded["assembly"]) < _spills(result["assembly"]) and \
                        _scratch(reloaded["assembly"]) <= _scratch(result["assembly"]):
                    result = reloaded
        return _with_object(result)


def _emit(tm, module, optimized_ir: str, emit_object: bool) -> dict:
    """The assembly of `module`; with `emit_object`, what `_with_object` needs to emit its object, which waits
    until the caller has chosen among the versions it generated (each code generation costs seconds for a large
    kernel; only the kept version's object is needed)."""
    # Code generation rewrites the module it runs on (AMDGPU annotates control flow with
    # intrinsics it cannot select a second time), so each emission gets its own copy.
    assembly = tm.emit_assembly(module.clone() if emit_object else module)
    return {"assembly": assembly, "optimized_ir": optimized_ir, "object": None,
            "_emit_object": (tm, module) if emit_object else None}


def _with_object(result: dict) -> dict:
    """`result` (from `_emit`) with its object emitted if it was asked for."""
    pending = result.pop("_emit_object")
    if pending is not None:
        tm, module = pending
        result["object"] = tm.emit_object(module)
    return result


_SPILLS = re.compile(r"^\s+\.(vgpr_spill_count|sgpr_spill_count):\s+(\d+)", re.M)


def _spills(assembly: str) -> tuple[int, int]:
    """(VGPR spills, SGPR spills) of the kernel, from the AMDGPU metadata in its assembly ((0, 0) elsewhere)."""
    counts = dict((name, int(n)) for name, n in _SPILLS.findall(assembly))
    return counts.get("vgpr_spill_count", 0), counts.get("sgpr_spill_count", 0)


_SCRATCH = re.compile(r"^\s+\.private_segment_fixed_size:\s+(\d+)", re.M)


def _scratch(assembly: str) -> int:
    """The kernel's fixed scratch bytes a lane, from the AMDGPU metadata in its assembly (0 elsewhere)."""
    return sum(int(n) for n in _SCRATCH.findall(assembly))


def _sink_vectors(optimized_ir: str, kernel: str, triple: str, cpu: str, features: str, opt_level: int,
                  emit_object: bool, scheduler: str | None = None, reload_arguments: bool = False) -> dict | None:
    """The code of `optimized_ir` after `sink_vectors.sink_vector_cones` (scheduled by AMDGPU's `scheduler`
    if given, else its default) and, with `reload_arguments`, with the argument cones sunk too, lane masks
    computed past barriers, and `reload_arguments.reload_kernel_arguments`; or None if nothing moved."""
    sink, reload = _sibling("sink_vectors"), _sibling("reload_arguments")
    cones = reload.argument_cones(optimized_ir, kernel) if reload_arguments else frozenset()
    text, copies = sink.sink_vector_cones(optimized_ir, kernel, also=cones, past_barriers=reload_arguments)
    if reload_arguments:
        text, loads = reload.reload_kernel_arguments(text, kernel)
        copies += loads
    if not copies:
        return None
    if scheduler is not None:
        text = sink.with_kernel_attribute(text, kernel, f'"amdgpu-sched-strategy"="{scheduler}"')
    try:
        module = llvm.parse_assembly(text)
        module.verify()
    except RuntimeError:    # a bug of the text rewrite: keep the code that spills (the no-spill tests notice)
        return None
    tm = _target_machine(triple, cpu, features, min(opt_level, sink.CODE_GEN_LEVEL))
    return _emit(tm, module, text, emit_object)


def _sibling(name: str):
    """Module `name`.py of this folder, loaded by path (the worker runs with -P: this folder is not on sys.path)."""
    if name not in _SIBLINGS:
        spec = importlib.util.spec_from_file_location(f"_tessera_llvm_{name}", Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _SIBLINGS[name] = module
    return _SIBLINGS[name]


def _initialize() -> None:
    global _INITIALIZED
    if not _INITIALIZED:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        _INITIALIZED = True


def _target_machine(triple: str, cpu: str, features: str, opt_level: int) -> llvm.TargetMachine:
    _initialize()
    key = (triple, cpu, features, opt_level)
    if key not in _TARGET_MACHINES:
        target = llvm.Target.from_triple(triple)
        _TARGET_MACHINES[key] = target.create_target_machine(cpu=cpu, features=features, opt=opt_level)
    return _TARGET_MACHINES[key]


# -- bitcode libraries (libdevice) ---------------------------------------------------


def _link_library(module, kernel: str, path: str | None, names: list[str], tm) -> None:
    if path is None:
        raise LLVMError(f"the module calls {', '.join(names)} but no bitcode library was given")
    missing = [n for n in names if (path, n) not in _LIBRARY_PIECES]
    if missing:
        piece = _cut_library(path, missing, module.triple, module.data_layout, tm)
        for name in missing:
            _LIBRARY_PIECES[(path, name)] = piece
    pieces = {id(p): p for p in (_LIBRARY_PIECES[(path, n)] for n in names)}
    for piece in pieces.values():
        module.link_in(llvm.parse_bitcode(piece))
    for fn in module.functions:
        if not fn.is_declaration and fn.name != kernel:
            fn.linkage = "internal"


def _cut_library(path: str, names: list[str], triple: str, data_layout: str, tm) -> bytes:
    """Bitcode of the library at `path` reduced to `names` (kept external) and what they use."""
    try:
        lib = llvm.parse_bitcode(Path(path).read_bytes())
    except (OSError, RuntimeError) as e:
        raise LLVMError(f"cannot read the bitcode library {path}: {e}") from None
    lib.triple, lib.data_layout = triple, data_layout
    defined = {fn.name for fn in lib.functions if not fn.is_declaration}
    absent = [n for n in names if n not in defined]
    if absent:
        raise LLVMError(f"the bitcode library {path} has no function {', '.join(absent)}")
    for fn in lib.functions:
        if not fn.is_declaration:
            fn.linkage = "external" if fn.name in names else "internal"
    for var in lib.global_variables:
        if not var.is_declaration:
            var.linkage = "internal"
    pass_builder = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=0))
    passes = llvm.create_new_module_pass_manager()
    passes.add_global_dead_code_eliminate_pass()
    passes.run(lib, pass_builder)
    for fn in lib.functions:
        if fn.name in names:
            fn.linkage = "linkonce_odr"
    return lib.as_bitcode()


# -- the compile worker (a child process) ---------------------------------------------------

PARENT_POLL_S = 1.0     # how often the worker checks that the process it serves still exists


def _serve() -> None:
    """Answer requests from stdin until it closes. Replies go through a private copy of fd 1, and fd 1
    itself then points at stderr, so nothing LLVM prints can corrupt a reply."""
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    _initialize()     # LLVM's one-time setup, while the parent is still generating the first module
    for line in sys.stdin:
        replies.write(json.dumps(_answer(json.loads(line))) + "\n")
        replies.flush()


def _answer(request: dict) -> dict:
    try:
        reply = {"ok": True, **compile_llvm(**request)}
    except LLVMError as e:
        return {"ok": False, "error": str(e)}
    if reply["object"] is not None:
        reply["object"] = base64.b64encode(reply["object"]).decode("ascii")
    return reply


def _exit_when_orphaned(parent: int) -> None:
    """End the worker when the process it serves is gone, even in the middle of a compile (ctypes calls into
    LLVM release the GIL, so this thread runs while LLVM works)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the parent's to handle: it stops us if it must
    _serve()
