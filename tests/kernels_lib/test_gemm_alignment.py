"""What a GEMM's arguments let its K loop copy (`tessera/kernels_lib/gemm_alignment.py`).

Specification: the op states what each size and stride is a multiple of (up to one 16-byte chunk of
elements), and asks for a pipelined K loop only where both operands' rows start 16-byte aligned; so for any
legal shape the tiled kernel compiles in strict mode -- pipelined by TMA on sm_90a and cp.async on sm_80 where
the rows allow it (K = 4104, M = 200: multiples of 8 bf16, not of 16, which the specialization alone cannot
see), a plain loop where they do not (K = 4101, M = 202) -- and the interpreter, which checks each stated
fact, computes the same product.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tessera.kernels_lib.gemm import CONFIGS, gemm, gemm_kernel  # noqa: E402
from tessera.kernels_lib.gemm_alignment import alignment, operand_alignment  # noqa: E402

from hopper_gemm import NO_EPILOGUE  # noqa: E402
from test_gemm import check, operands, reference  # noqa: E402
from tma_maps import maps_by_use  # noqa: E402


def test_alignment_is_the_power_of_two_up_to_a_16_byte_chunk():
    assert [alignment(v, 2) for v in (4104, 4101, 4102, 4100, 4096, 1)] == [8, 1, 2, 4, 8, 1]
    assert alignment(4104, 1) == 8 and alignment(4096, 1) == 16 and alignment(6, 4) == 2


@pytest.mark.parametrize("M, N, K, strides, expected", [
    (16, 1000, 4104, (4104, 1, 1, 4104), ((1, 8, 8, 8, 1, 1, 8), True)),       # B an nn.Linear weight
    (16, 1000, 4104, (4104, 1, 1000, 1), ((1, 8, 8, 8, 1, 8, 1), True)),
    (16, 1000, 4101, (4101, 1, 1000, 1), ((1, 8, 1, 1, 1, 8, 1), False)),      # A's rows: 8202 bytes
    (200, 144, 336, (1, 200, 144, 1), ((8, 8, 8, 1, 8, 8, 1), True)),          # A transposed: rows along M
    (202, 144, 336, (1, 202, 144, 1), ((2, 8, 8, 1, 2, 8, 1), False)),
    (64, 64, 64, (64, 64, 64, 1), ((1, 8, 8, 8, 8, 8, 1), False)),             # A has no unit stride
])
def test_the_op_states_what_it_checked_and_pipelines_only_aligned_rows(M, N, K, strides, expected):
    assert operand_alignment(M, N, K, strides, 2, pointers_aligned=True) == expected
    assert operand_alignment(M, N, K, strides, 2, pointers_aligned=False)[1] is False


def int_hint(value: int) -> str:
    return "i32:1" if value == 1 else "i32:16" if value % 16 == 0 else "i32"


# the GPU tests' tiled shapes (test_gemm_tma_on_gpu.py), as (M, N, K, trans_a, trans_b), and K = 4101
SHAPES = [(208, 144, 336, False, False), (1008, 272, 1008, False, True), (1008, 272, 1008, True, False),
          (200, 144, 336, True, False), (202, 144, 336, True, False), (256, 1000, 4101, False, True)]


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_the_tiled_kernel_compiles_in_strict_mode_for_every_shape_it_is_given(target):
    """The op's launch of the tiled kernel (config 0) for each shape, compiled as the GPU would in strict mode:
    pipelined exactly where the rows allow (TMA maps for A and B on sm_90a, cp.async on sm_80), else a plain
    loop with no copies; no CompileError either way."""
    from tessera.backends.nvptx import find_ptxas
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    for M, N, K, trans_a, trans_b in SHAPES:
        strides = (*((1, M) if trans_a else (K, 1)), *((1, K) if trans_b else (N, 1)))
        align, pipelined = operand_alignment(M, N, K, strides, 2, pointers_aligned=True)
        assert pipelined == (M % 8 == 0 and K % 8 == 0), (M, K)
        signature = ",".join(["*bf16:16", "*bf16:16", "*f32:16", "*bf16:16", "*bf16:16", "*bf16:16",
                              int_hint(M), int_hint(N), int_hint(K), "f32", *map(int_hint, strides)])
        compiled = gemm_kernel.kernel.compile(signature=signature, target=target, num_warps=CONFIGS[0].num_warps,
                                              strict=True, **NO_EPILOGUE, **CONFIGS[0].kwargs, ALIGN=align,
                                              PIPELINED=pipelined)
        ptx = compiled.stages["ptx"]
        if target == "sm_90a":
            loads = ["a_ptr", "b_ptr"] if pipelined else []
            assert maps_by_use(ptx, compiled.metadata["tensor_maps"]) == {"load": loads, "store": ["c_ptr"]}
        else:
            assert ("cp.async.cg" in ptx) == pipelined, (M, N, K)


@pytest.mark.parametrize("M, N, K, trans_a, trans_b", [(202, 24, 37, True, False), (40, 30, 4101 % 64, False, True),
                                                       (72, 40, 24, False, False)])
def test_the_interpreter_checks_the_stated_facts_and_computes_the_product(M, N, K, trans_a, trans_b):
    """On the CPU the op passes the same ALIGN to the interpreter, which fails on a false `tessera.assume`."""
    a, b = operands(M, N, K, torch.bfloat16, trans_a, trans_b, seed=M)
    check(gemm(a, b, trans_a=trans_a, trans_b=trans_b), reference(a, b, trans_a=trans_a, trans_b=trans_b))


def test_a_false_statement_is_an_error_on_the_interpreter():
    """The check the previous test relies on: ALIGN claiming K = 37 is a multiple of 8 fails at the promise."""
    import numpy as np
    import tessera
    from tessera.kernels_lib.gemm import CPU_CONFIG

    M, N, K = 16, 16, 37
    a, b, c = np.ones((M, K), np.float32), np.ones((K, N), np.float32), np.zeros((M, N), np.float32)
    with pytest.raises(tessera.InterpreterError, match="assume"):
        gemm_kernel.kernel[(1,)](a, b, c, c, c, c, M, N, K, 1.0, K, 1, N, 1, **NO_EPILOGUE,
                                 **CPU_CONFIG.as_dict(), ALIGN=(1, 1, 8, 1, 1, 1, 1))
