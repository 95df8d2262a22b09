"""What a GEMM's arguments let its K loop copy: the row alignment the op checks and states, and whether to pipeline.

A pipelined K loop fills its ring by cp.async or TMA, which copy rows that
start on 16-byte boundaries; the compiler must prove that from the kernel's
specialization, which sees pointers 16-byte aligned and integers that are
multiples of 16. A bf16 row of K = 4104 elements is 8208 bytes, 16-byte
aligned, yet 4104 is not a multiple of 16: the op, which holds the values,
states what each size and stride is a multiple of (`ALIGN`, by
`state_alignment`'s tessera.assume), and where some operand's rows do not
start 16-byte aligned at all (K = 4101), or a pointer is not, it asks for no
pipeline (`pipelined` False) rather than for copies the compiler would have
to refuse (an error in strict mode, a warning otherwise).

The operands are dense (`gemm._strided`): each has a unit stride, and its
other stride is the length of its rows.

Users: the plain, split-K and fused GEMMs (`operand_alignment`,
`state_alignment`); the quantized GEMM (`quant_gemm.aligned_rows`); and the
MoE grouped GEMMs, whose dense operands' rows are H and I long
(`rows_alignment`, `state_multiples`; `moe.mlp.pipelining`).
tests/kernels_lib/test_op_launches_compile.py compiles every launch of each
op for such shapes in strict mode.
"""

from __future__ import annotations

import functools
import math

import torch

import tessera

ROW_BYTES = 16                      # cp.async and TMA copy rows that start on 16-byte boundaries
NOTHING_STATED = (1, 1, 1, 1, 1, 1, 1)


@tessera.func
def state_alignment(M, N, K, stride_am, stride_ak, stride_bk, stride_bn, ALIGN):
    """Promise what the op checked: each of M, N, K, stride_am, stride_ak, stride_bk, stride_bn is a multiple of
    its entry of ALIGN (1: nothing said)."""
    tessera.assume(M % ALIGN[0] == 0 and N % ALIGN[1] == 0 and K % ALIGN[2] == 0 and stride_am % ALIGN[3] == 0
                   and stride_ak % ALIGN[4] == 0 and stride_bk % ALIGN[5] == 0 and stride_bn % ALIGN[6] == 0)


@tessera.func
def state_multiples(sizes, ALIGN):
    """Promise what the op checked of a kernel's row lengths (a grouped GEMM's H and I): each of `sizes` is a
    multiple of its entry of ALIGN (1: nothing said)."""
    for i in tessera.static_range(len(sizes)):
        tessera.assume(sizes[i] % ALIGN[i] == 0)


def alignment(value: int, element_bytes: int) -> int:
    """The largest power of two, up to ROW_BYTES of elements, that divides `value`."""
    return math.gcd(int(value), max(1, ROW_BYTES // element_bytes))


def _rows_aligned(size: int, stride: int, element_bytes: int) -> bool:
    full = max(1, ROW_BYTES // element_bytes)
    return alignment(size, element_bytes) == full and alignment(stride, element_bytes) == full


@functools.lru_cache(maxsize=4096)     # on every launch of the op: ~9 µs of Python computed, ~0.3 µs looked up
def operand_alignment(M: int, N: int, K: int, strides: tuple[int, int, int, int], element_bytes: int,
                      pointers_aligned: bool, b_element_bytes: int | None = None) -> tuple[tuple[int, ...], bool]:
    """(ALIGN, pipelined) for A [M, K] and B [K, N] with `strides` (stride_am, stride_ak, stride_bk, stride_bn)
    and elements of `element_bytes` (B's of `b_element_bytes` where they differ: the fused GEMM's int8 codes
    beside float16 A). ALIGN says what M, N, K and the strides are multiples of (M only where A's rows run along
    M, so decode's many M share one compile); `pipelined` whether both operands have a unit stride and rows that
    start 16-byte aligned (and both pointers are 16-byte aligned)."""
    sam, sak, sbk, sbn = strides
    a_bytes, b_bytes = element_bytes, b_element_bytes or element_bytes
    a_rows = _rows_aligned(K, sam, a_bytes) if sak == 1 else \
        _rows_aligned(M, sak, a_bytes) if sam == 1 else False
    b_rows = _rows_aligned(N, sbk, b_bytes) if sbn == 1 else \
        _rows_aligned(K, sbn, b_bytes) if sbk == 1 else False
    m_align = alignment(M, a_bytes) if sam == 1 and sak != 1 else 1
    k_align = math.gcd(alignment(K, a_bytes), alignment(K, b_bytes))
    align = (m_align, alignment(N, b_bytes), k_align, alignment(sam, a_bytes), alignment(sak, a_bytes),
             alignment(sbk, b_bytes), alignment(sbn, b_bytes))
    return align, pointers_aligned and a_rows and b_rows


def pointers_aligned(*tensors) -> bool:
    """Whether every GPU array among `tensors` (a torch CUDA tensor, or a `__cuda_array_interface__` object)
    starts on a 16-byte boundary (host arrays: the interpreter copies nothing asynchronously, so they count as
    aligned)."""
    for t in tensors:
        if isinstance(t, torch.Tensor):
            if t.is_cuda and t.data_ptr() % ROW_BYTES:
                return False
        elif hasattr(t, "__cuda_array_interface__") and t.__cuda_array_interface__["data"][0] % ROW_BYTES:
            return False
    return True


def rows_alignment(sizes: tuple[int, ...], element_bits: int, pointers_aligned: bool) -> tuple[tuple[int, ...], bool]:
    """(ALIGN, pipelined) for a kernel whose pipelined operands are dense rows of `sizes` elements of at most
    `element_bits` (the narrowest operand's width: its 16 bytes hold the most elements, so its test is the
    strictest, and each stated fact still divides its value): what each size is a multiple of, up to one
    16-byte chunk, and whether every row starts 16-byte aligned (and every pointer is)."""
    full = max(1, ROW_BYTES * 8 // element_bits)
    align = tuple(math.gcd(int(size), full) for size in sizes)
    return align, pointers_aligned and all(a == full for a in align)
