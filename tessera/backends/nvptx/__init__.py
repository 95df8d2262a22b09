"""The NVPTX backend: thread IR -> LLVM IR (llvmlite) -> PTX -> cubin (ptxas).

    from tessera.backends.nvptx import compile_thread_ir
    artifacts = compile_thread_ir(fn, "sm_90a")      # fn: a thread-IR Function
    artifacts.ptx, artifacts.cubin, artifacts.ptxas_info

Files, in pipeline order:

    validate.py       checks that keep LLVM from aborting (target, dtypes, ops, attrs)
    llvm_codegen.py   the kernel, regions and control flow -> llvmlite.ir
    llvm_ops.py       elementwise ops, math, casts       llvm_types.py  types, constants
    llvm_memory.py    addptr, loads/stores, atomics      llvm_thread.py ids, shuffles, barrier, smem
    intrinsics.py     every intrinsic / libdevice name    lowerings.py   op -> lowering table
    llvm_pipeline.py  parse, libdevice, O3, emit PTX (also runs as an isolated child)
    ptxas.py          ptxas -v -> cubin and register/spill counts
    toolkit.py        where ptxas and libdevice are found
    compile.py        compile_thread_ir, NvptxArtifacts
"""

from .compile import NvptxArtifacts, compile_thread_ir
from .errors import BackendError, LoweringError, PtxasError
from .ptxas import Ptxas, find_ptxas
from .toolkit import find_libdevice

__all__ = [
    "BackendError", "LoweringError", "NvptxArtifacts", "Ptxas", "PtxasError",
    "compile_thread_ir", "find_libdevice", "find_ptxas",
]
