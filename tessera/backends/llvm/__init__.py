"""The target-neutral LLVM core that the NVPTX and AMDGPU backends share: thread IR -> LLVM IR -> assembly or
object for any GPU target a `TargetDialect` describes. It may import `tessera.ir` only (`optimize.py`
nothing of tessera, so that it also runs alone as the compile worker process).

Thread IR -> LLVM IR (llvmlite.ir) -> assembly / object, for any GPU target
whose differences a `TargetDialect` describes. Files, in the order they run:

    dialect.py     TargetDialect: the hooks a target supplies (kernel, ids, barrier, shuffle, smem, math, scopes)
    validate.py    checks common to every target that keep LLVM from aborting; resolve_target
    codegen.py     the kernel, regions and structured control flow; `Codegen`, `codegen_function`
    codegen_table.py COMMON: op -> codegen function (an ir OpTable); each target layers its own over it
    ops.py         elementwise ops, math, casts      types.py    types, constants
    memory.py      addptr, loads/stores, atomics     thread.py   ids, registers, shuffles, barrier, smem
    small_floats.py fp8/fp6/fp4/e8m0 <-> f32 in integer IR  intrinsics.py  IntrinsicTable, common families
    low_bit.py     byte_address, bit_offset, unpack_bits (fast conversions), pack_bits
    optimize.py    parse, link a bitcode library, O3, emit (also runs as the compile worker process)
    worker.py      the compile worker: a child process reused across compiles, restarted when it dies
    run.py         run optimize.py in the worker (the default, with a time limit) or here
    errors.py      BackendError, CodegenError
"""
