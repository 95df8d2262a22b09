"""Compiling the library GEMM for Hopper and reading what came out (PTX text, SASS instructions): helpers of
the issue-19 tests (`test_gemm_hopper*.py`)."""

from __future__ import annotations

import re

import pytest

from tessera.backends.nvptx import find_ptxas
from tessera.backends.nvptx.sass import disassemble, find_cuobjdump, loop_containing
from tessera.kernels_lib.gemm import gemm_kernel

# stride_am, stride_ak, stride_bk, stride_bn: B row-major (K x N), or B^T stored (N x K)
SIGNATURE = "*bf16:16,*bf16:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,{b}"
B_STRIDES = {"b-row-major": "i32:16,i32:1", "b-transposed": "i32:1,i32:16"}
NO_EPILOGUE = dict(HAS_BIAS=False, HAS_SCALE_A=False, HAS_SCALE_B=False, ACTIVATION="none")


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
