"""The AMDGPU backend: thread IR -> LLVM IR (llvmlite) -> AMDGCN -> code object (hsaco, via ld.lld). It
may import `tessera.ir` and the LLVM core (`tessera.backends.llvm`) only.

    from tessera.backends.amdgpu import compile_thread_ir
    artifacts = compile_thread_ir(fn, "gfx942")      # fn: a thread-IR Function
    artifacts.assembly, artifacts.hsaco, artifacts.metadata

The target-neutral work (values, control flow, elementwise ops, casts,
memory, LLVM's optimization) is the LLVM core's (`tessera.backends.llvm`);
this package supplies what is AMD's. Files, in the order they run:

    validate.py     AMD targets (triple, gfx CPU)
    dialect.py      AmdgpuDialect: amdgpu_kernel, COv5, workitem/workgroup ids, dispatch packet,
                    fenced s_barrier, ds_bpermute shuffles, static LDS
    codegen_table.py the AMDGPU codegen table (common ops; the place for mfma and async copies)
    lds_dma.py      async_copy as global_load_lds (M0-based, per wave), waits as s_waitcnt vmcnt
    math.py         math from LLVM intrinsics and expansions (tanh, erf), with their accuracy
    intrinsics.py   every llvm.amdgcn.* / math intrinsic the backend calls
    linker.py       finding ld.lld (TESSERA_LLD, ROCm, PATH, ziglang) and linking ET_REL -> ET_DYN
    elf.py          reading code objects: ELF type, symbols, the AMDGPU metadata note
    msgpack.py      the MessagePack decoder that note needs
    compile.py      compile_thread_ir, AmdgpuArtifacts
"""

from ..llvm.errors import BackendError, CodegenError
from .compile import AmdgpuArtifacts, compile_thread_ir
from .elf import CodeObject
from .linker import Linker, LinkerError, find_linker

__all__ = [
    "AmdgpuArtifacts", "BackendError", "CodeObject", "Linker", "LinkerError", "CodegenError",
    "compile_thread_ir", "find_linker",
]
