"""Pipelined loads whose address goes through a table in memory (a paged KV cache's block table).

Specification: a scalar `load` in the address computation of a pipelined
view load counts as pure when nothing in the loop body writes memory, so
the block is still copied ahead; the table entry of an iteration ahead is
read ahead too, masked off past the end of the loop, so a table exactly as
long as the loop is never read out of bounds. A loop that also stores keeps
the plain path. The pipelined loop computes on the SIMT
simulator what the interpreter computes.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.ir.target import get_target
from tessera.passes.lowering.vector_facts import VectorFacts
from tessera.passes.schedule.pipeline_plan import pipeline_plan
from tessera.passes.thread_passes import lower


@tessera.kernel
def paged_sum(a_ptr, table_ptr, b_ptr, c_ptr, blocks, BM: tessera.constexpr, BK: tessera.constexpr,
              N: tessera.constexpr, STORE_IN_LOOP: tessera.constexpr):
    """c = sum over blocks j of a[table[j]] @ b[j]: the A blocks live where the table says."""
    acc = tessera.zeros((BM, N), tessera.f32)
    b = tessera.view(b_ptr, (blocks * BK, N))
    for j in tessera.pipeline(0, blocks, stages=3):
        page = tessera.load(table_ptr + j)
        a = tessera.view(a_ptr + page * BM * BK, (BM, BK)).block((BM, BK), (0, 0)).load()
        acc = tessera.dot(a, b.block((BK, N), (j, 0)).load(), acc)
        if STORE_IN_LOOP:
            tessera.store(c_ptr, 0.0)
    tessera.view(c_ptr, (BM, N)).block((BM, N), (0, 0)).store(acc)


def case(store_in_loop=False, blocks=5, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((blocks + 2, 32, 32)).astype(np.float16)
    table = rng.permutation(blocks + 2)[:blocks].astype(np.int32)
    b = rng.standard_normal((blocks * 32, 32)).astype(np.float16)
    args = [a, table, b, np.zeros((32, 32), np.float32), blocks]      # the table: one entry per iteration
    module = paged_sum.specialize(*args, BM=32, BK=32, N=32, STORE_IN_LOOP=store_in_loop).module
    return module, args


def plan_of(module):
    fn = module.functions[0]
    loop = next(op for op in fn.walk() if op.name == "for")
    return pipeline_plan(loop, get_target("sm_80"), 4, VectorFacts(fn).facts)


def test_a_block_found_through_the_table_is_copied_ahead():
    plan = plan_of(case()[0])
    assert plan is not None and len(plan.loads) == 2
    table_read = [op for load in plan.loads for op in load.slice if op.name == "load"]
    assert len(table_read) == 1, "the table entry is part of the A block's address slice"


def test_a_loop_that_writes_memory_keeps_the_plain_path_for_that_block():
    plan = plan_of(case(store_in_loop=True)[0])
    assert plan is not None and len(plan.loads) == 1          # only B, whose address reads nothing


@pytest.mark.parametrize("target, num_warps", [("sm_80", 4), ("sm_90a", 4)])
def test_the_pipelined_paged_loop_matches_the_interpreter(target, num_warps):
    """The simulator checks every read in bounds: the entries of the iterations past the end are not read."""
    module, expected = case()
    _, actual = case()
    run_function(module.functions[0], expected, (1,))
    fn = lower(module, target, num_warps).functions[0]
    assert any(op.name == "async_copy" for op in fn.walk())
    run_threads(fn, actual, (1,))
    np.testing.assert_allclose(actual[3], expected[3], rtol=1e-3, atol=1e-3)
