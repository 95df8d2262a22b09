"""Compiling the library GEMM for Hopper and reading what came out (PTX text, SASS instructions): helpers of
the issue-19 tests (`test_gemm_hopper*.py`)."""

from __future__ import annotations

import importlib
import re

import pytest

from tessera.backends.nvptx import find_ptxas
from tessera.backends.nvptx.sass import disassemble, find_cuobjdump, loop_containing
from tessera.kernels_lib.gemm import gemm_kernel

# stride_am, stride_ak, stride_bk, stride_bn: B row-major (K x N), or B^T stored (N x K)
SIGNATURE = "*bf16:16,*bf16:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,{b}"
B_STRIDES = {"b-row-major": "i32:16,i32:1", "b-transposed": "i32:1,i32:16"}
NO_EPILOGUE = dict(HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none")


def needs_ptxas():
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")


def needs_sass():
    needs_ptxas()
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")


def compile_gemm(config, target="sm_90a", b_layout="b-row-major", **constexprs):
    """The library kernel compiled for `target` with `config` (a tessera.Config), no epilogue unless asked."""
    kwargs = {**NO_EPILOGUE, **config.kwargs, **constexprs}
    return gemm_kernel.kernel.compile(signature=SIGNATURE.format(b=B_STRIDES[b_layout]), target=target,
                                      num_warps=config.num_warps, **kwargs)


def ptx_lines(ptx: str, pattern: str) -> list[int]:
    """Indices of the PTX lines matching `pattern`."""
    return [i for i, line in enumerate(ptx.splitlines()) if re.search(pattern, line)]


def sass_k_loop(compiled) -> list:
    """The SASS of the innermost loop holding the HGMMAs (the K loop)."""
    loop = loop_containing(disassemble(compiled.cubin), "HGMMA")
    assert loop, "no loop around the HGMMAs"
    return loop


def first(code, prefix: str) -> int:
    """Index of the first instruction whose opcode starts with `prefix` (-1: none)."""
    return next((i for i, inst in enumerate(code) if inst.opcode.startswith(prefix)), -1)


def last(code, prefix: str) -> int:
    return max((i for i, inst in enumerate(code) if inst.opcode.startswith(prefix)), default=-1)


def lowered_gemm(M, N, K, config, trans_a=False, trans_b=False, seed=0, target="sm_90a"):
    """(thread-IR function of the library kernel for `target`, its arguments, numpy's C, the grid) for random
    f16 operands; C is float32."""
    import numpy as np

    from tessera.passes.thread_passes import lower
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    a_stored, (sam, sak) = (np.ascontiguousarray(a.T), (1, M)) if trans_a else (a, (K, 1))
    b_stored, (sbk, sbn) = (np.ascontiguousarray(b.T), (1, K)) if trans_b else (b, (N, 1))
    unused = np.zeros(1, np.float32)
    args = [a_stored, b_stored, unused, unused, unused, np.zeros((M, N), np.float32), M, N, K, 1.0,
            sam, sak, sbk, sbn]
    module = gemm_kernel.kernel.specialize(*args, **{**NO_EPILOGUE, **config.kwargs}).module
    fn = lower(module, target, config.num_warps).functions[0]
    grid = importlib.import_module("tessera.kernels_lib.gemm")._grid(M, N, config.kwargs, 2)   # persistent: 2 SMs
    return fn, args, a.astype(np.float32) @ b.astype(np.float32), grid


def simulate(fn, args, grid):
    """Run `fn` on the SIMT simulator; the C it wrote."""
    from tessera.backends.simt import run_threads
    run_threads(fn, args, grid)
    return args[5]


def compile_signature(kernel, config, signature, target="sm_90a", **constexprs):
    """`kernel` (a tessera.kernel) compiled for `signature` with `config`, no epilogue unless asked."""
    return kernel.compile(signature=signature, target=target, num_warps=config.num_warps,
                          **{**NO_EPILOGUE, **config.kwargs, **constexprs})


def opcode_counts(code) -> dict[str, int]:
    """SASS instruction count per opcode (without modifiers)."""
    counts: dict[str, int] = {}
    for inst in code:
        op = inst.opcode.split(".")[0]
        counts[op] = counts.get(op, 0) + 1
    return counts
