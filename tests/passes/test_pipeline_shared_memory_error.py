"""A `tessera.pipeline` whose rings fit shared memory on their own but not beside the kernel's other buffers is a
CompileError naming the kernel, the pipeline's line and the stages that fit (`passes/shared_memory.py`).

The ring depth is chosen from the rings alone (`schedule/pipeline_plan.py`: the other buffers are placed later);
the allocator, which sees every buffer, is where the overflow shows, so it names the loop, not the largest buffer.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import tessera
from tessera import CompileError


@tessera.kernel
def matmul_beside_a_table(a_ptr, b_ptr, c_ptr, t_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                          BK: tessera.constexpr, STAGES: tessera.constexpr, ROWS: tessera.constexpr):
    """C = A @ B + a (ROWS x BN) table staged in shared memory for the whole kernel beside the loop's rings."""
    pid_m = tessera.program_id(0)
    pid_n = tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    table = tessera.shared((ROWS, BN), tessera.f32)
    tessera.async_copy(table, tessera.view(t_ptr, (ROWS, N)).block((ROWS, BN), (0, pid_n)))
    tessera.async_commit()
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.async_wait(0)
    tessera.barrier()
    acc = acc + tessera.sum(table.load(), axis=0)[None, :]
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.bf16))


SIGNATURE = "*bf16:16,*bf16:16,*bf16:16,*f32:16,i32:16,i32:16,i32:16"
TILES = dict(BM=64, BN=64, BK=64)       # 16 KiB of A and B blocks a stage (bf16)


def compile_for(target: str, stages: int, rows: int, BK: int = 64):
    return matmul_beside_a_table.compile(signature=SIGNATURE, target=target, num_warps=4, STAGES=stages, ROWS=rows,
                                         **dict(TILES, BK=BK))


def pipeline_line() -> int:
    lines, first = inspect.getsourcelines(matmul_beside_a_table.fn)
    return first + next(i for i, line in enumerate(lines) if "tessera.pipeline(" in line)


@pytest.mark.parametrize("target, stages", [("gfx942", 3), ("gfx950", 4)])
def test_the_rings_and_the_table_compile_where_the_lds_holds_them(target, stages):
    """A 16 KiB table beside 3 stages of 16 KiB fills gfx942's 64 KiB; beside 4 it fits gfx950's 160 KiB (each
    capacity its target description's)."""
    compiled = compile_for(target, stages, 64)
    assert stages * 16384 + 16384 <= compiled.metadata["shared_bytes"] <= tessera.get_target(target).shared_memory_bytes
    assert "global_load_lds_dword" in compiled.stages["amdgcn"]


@pytest.mark.parametrize("rows, BK, kept, fit", [(64, 64, 4, 3), (128, 128, 2, 1)])
def test_too_many_stages_beside_another_buffer_names_the_pipeline_and_the_stages_that_fit(rows, BK, kept, fit):
    """gfx942 (64 KiB): a 16 KiB table beside 4 stages of 16 KiB, of which 3 fit (48 + 16 KiB); a 32 KiB table
    beside stages of 32 KiB (BK = 128), of which the planner keeps 2 (the rings alone fill the LDS) and none
    fits beside the table."""
    with pytest.raises(CompileError) as info:
        compile_for("gfx942", 4, rows, BK)
    error = info.value
    assert error.kernel == "matmul_beside_a_table" and error.line == pipeline_line(), str(error)
    message = error.message
    assert "more than the 65536 a block has on gfx942" in message, message
    assert f"the pipelined loop at line {pipeline_line()} keeps {kept} stages of its ring buffers (65536 bytes" \
        in message, message
    if fit > 1:
        assert f"pass stages={fit} to that tessera.pipeline" in message, message
    else:
        assert "pass stages=1 to that tessera.pipeline (no ring)" in message, message
    compile_for("gfx942", fit, rows, BK)      # the fix named compiles


def test_the_interpreter_is_unchanged_by_the_stages():
    """The ring depth is a schedule, not a meaning: 1 and 4 stages compute the same C on the tile interpreter."""
    rng = np.random.default_rng(0)
    M, N, K = 64, 64, 192
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    table = rng.standard_normal((64, N)).astype(np.float32)
    outs = []
    for stages in (1, 4):
        c = np.zeros((M, N), np.float32)
        matmul_beside_a_table.interpret(a, b, c, table, M, N, K, grid=(1, 1), STAGES=stages, ROWS=64, **TILES)
        outs.append(c)
    np.testing.assert_allclose(outs[0], a @ b + table.sum(0), rtol=1e-2, atol=1e-1)      # C is stored as bf16
    np.testing.assert_array_equal(outs[0], outs[1])


def test_a_buffer_too_large_even_without_the_ring_is_named_not_the_pipeline():
    """A 64 KiB table fills gfx942's 64 KiB, and the reduction of it needs more, whatever the stages: the error
    names the largest buffers and smaller tiles, at the table's line, not the pipeline's."""
    with pytest.raises(CompileError) as info:
        compile_for("gfx942", 2, 256)
    message = info.value.message
    assert "(largest buffers: 65536 bytes" in message and "use smaller tiles" in message, message
    assert "pipelined loop" not in message and info.value.line != pipeline_line()
