"""Thread IR -> AMDGCN assembly and a code object (hsaco): the AMDGPU backend's one entry point.

    artifacts = compile_thread_ir(fn, "gfx942")
    artifacts.assembly, artifacts.hsaco, artifacts.metadata["vgpr_count"]

Steps: resolve the target (`validate.py`), validate the function (the LLVM
core's checks with `AmdgpuDialect`), build the LLVM module
(`tessera.backends.llvm.codegen`), run LLVM (parse, verify, O3, emit the
AMDGCN assembly and the relocatable object), and link the object into a
loadable code object with ld.lld when one is found (`linker.py`). The
kernel's metadata (kernarg layout, LDS, registers, wavefront size) is read
from the object's AMDGPU note (`elf.py`), so it is there even without a
linker.

LLVM runs in the compile worker process (`tessera.backends.llvm.run`),
where a crash becomes a `BackendError` carrying LLVM's message and a hang
a `CompileTimeoutError`; `isolate=False` (or `TESSERA_ISOLATE=0`) runs it
in this process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.ir.core import Function
from tessera.ir.target import Target

from ..llvm.codegen import codegen_function
from ..llvm.run import prepare as prepare_llvm
from ..llvm.run import run_llvm
from .assembler import assemble
from .dialect import DYNAMIC_SHARED_BYTES, AmdgpuDialect
from .elf import CodeObject, kernel_summary
from .linker import NO_LINKER_MESSAGE, LinkerError, find_linker
from .linker import link as run_linker
from .validate import resolve_target, validate_function

@dataclass(frozen=True)
class AmdgpuArtifacts:
    """What compiling one kernel produced."""

    kernel: str                 # the kernel symbol (its descriptor is `<kernel>.kd`)
    target: str                 # gfx90a, gfx942, gfx950
    llvm_ir: str                # the module as generated, before optimization
    optimized_llvm_ir: str      # after O3
    assembly: str               # AMDGCN assembly (emit_assembly)
    hsaco: bytes | None         # the linked code object (ET_DYN); None when no ld.lld was found (or link=False)
    metadata: dict = field(default_factory=dict)  # elf.kernel_summary: kernarg layout, LDS, registers, wavefront
    num_threads: int = 0        # block size the kernel was lowered for (its flat work-group size bound)
    shared_bytes: int = 0       # LDS the kernel uses, all static (in the code object's group segment)

    @property
    def dynamic_shared_bytes(self) -> int:
        """What a launch passes as dynamic shared memory: 0, as the LDS is static."""
        return DYNAMIC_SHARED_BYTES


def compile_thread_ir(fn: Function, target: Target | str | None = None, *, isolate: bool | None = None,
                      link: bool | None = None, fp_fusion: bool = False, opt_level: int = 3) -> AmdgpuArtifacts:
    """Compile thread-IR kernel `fn` for AMD `target` (a Target or its name; default: fn's `target` attr).

    isolate:   run LLVM in the compile worker process (default: yes, unless $TESSERA_ISOLATE=0).
    link:      True needs ld.lld, False skips linking, None (default) links when ld.lld is found.
    fp_fusion: let LLVM fuse a*b+c into fma (faster; one rounding instead of the interpreter's two).
    """
    target = resolve_target(target if target is not None else fn.attrs.get("target"))
    prepare_llvm(isolate)
    dialect = AmdgpuDialect(target)
    validate_function(fn, dialect)
    lowered = codegen_function(fn, dialect, fp_fusion=fp_fusion)
    llvm_ir = str(lowered.module)
    request = {
        "llvm_ir": llvm_ir, "kernel": lowered.kernel, "triple": target.llvm_triple, "cpu": target.llvm_cpu,
        "features": target.llvm_features, "opt_level": opt_level, "emit_object": True,
        "sink_vectors": opt_level > 1,      # a spilling kernel: try recomputing hoisted vectors and masks
    }
    inline_asm = any(op.name == "inline_asm" for op in fn.walk())
    if inline_asm:          # llvmlite cannot assemble it (see assembler.py): emit the text, assemble it with clang
        request["emit_object"] = False
    result = run_llvm(request, isolate=isolate, backend="AMDGPU")
    if inline_asm:
        result["object"] = assemble(result["assembly"], target.llvm_cpu)
    metadata = kernel_summary(CodeObject(result["object"]).kernel_metadata(lowered.kernel))
    return AmdgpuArtifacts(
        kernel=lowered.kernel, target=target.name, llvm_ir=llvm_ir, optimized_llvm_ir=result["optimized_ir"],
        assembly=result["assembly"], hsaco=_link(result["object"], link), metadata=metadata,
        num_threads=int(fn.attrs["num_threads"]), shared_bytes=int(fn.attrs.get("shared_bytes", 0)),
    )


def _link(object_bytes: bytes, link: bool | None) -> bytes | None:
    if link is False:
        return None
    linker = find_linker()
    if linker is None:
        if link:
            raise LinkerError(f"link=True but {NO_LINKER_MESSAGE}")
        return None
    return run_linker(object_bytes, linker)
