"""The NVPTX backend: thread IR -> LLVM IR (llvmlite) -> PTX -> cubin (ptxas). It may import
`tessera.ir` and the LLVM core (`tessera.backends.llvm`) only.

    from tessera.backends.nvptx import compile_thread_ir
    artifacts = compile_thread_ir(fn, "sm_90a")      # fn: a thread-IR Function
    artifacts.ptx, artifacts.cubin, artifacts.ptxas_info

The target-neutral work (values, control flow, elementwise ops, casts,
memory, LLVM's optimization) is the LLVM core's (`tessera.backends.llvm`);
this package supplies what is NVIDIA's. Files, in the order they run:

    validate.py       NVIDIA targets (triple, CPU, PTX features)
    dialect.py        NvptxDialect: ptx_kernel, %tid/%ctaid, bar.sync, shfl.sync, dynamic smem
    codegen_table.py  the NVPTX codegen table: common ops + mma.sync, ldmatrix, stmatrix, cp.async
    bulk_async.py     mbarriers and TMA box copies (sm_90+)
    cluster.py        thread-block clusters: .reqnctapercluster, %cluster_ctarank, barrier.cluster, remote arrive
    math.py           libdevice calls, or MUFU approximations without it
    intrinsics.py     every llvm.nvvm.* intrinsic and libdevice name
    ptxas.py          ptxas -v -> cubin and register/spill counts
    toolkit.py        where ptxas and libdevice are found
    compile.py        compile_thread_ir, NvptxArtifacts
"""

import importlib

# Each public name and the module defining it. They are imported on first use (PEP 562), so that asking
# where ptxas is (`toolkit`) does not load LLVM: a process launching a cached binary needs only that.
_EXPORTS = {
    "NvptxArtifacts": "compile", "compile_thread_ir": "compile", "BackendError": "errors",
    "CodegenError": "errors", "PtxasError": "errors", "Ptxas": "ptxas", "find_ptxas": "ptxas",
    "find_libdevice": "toolkit",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
