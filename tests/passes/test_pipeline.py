"""Software-pipelined loops (`tessera.pipeline(..., stages=S)`): the plan and the thread IR it lowers to.

Specification:

* `for k in tessera.pipeline(lo, hi, stages=S)` traces to an IR `for {stages = S}`
  that prints and parses back, runs like `range` in the tile interpreter, and
  the verifier rejects stages < 1; a non-compile-time or < 1 `stages` is a
  CompileError at the user's line that says what to write;
* on a target with cp.async, the A and B blocks of a tensor-core dot in such a
  loop are planned as rings of S slots: 16-byte copies where the alignment
  analysis allows, slot rows along the view's unit-stride dim (B^T: dim 0);
* the lowered loop is: S-1 prologue groups of async_copy + async_commit, then
  a `for` carrying one more i32 (the slot) whose body starts with
  `async_wait {pending = S-2}` and one barrier, issues the copies S-1
  iterations ahead into the slot read last iteration and commits, and reads
  its blocks with ldmatrix from the ring; after the loop, `async_wait
  {pending = 0}` and a barrier;
* stages = 1, a target without cp.async, a non-zero fill, or a load that does
  not feed a dot change nothing; the stages shrink to fit shared memory.
"""

from __future__ import annotations

import dataclasses

import warnings

import numpy as np
import pytest

import tessera
from tessera.backends.interp import run_function
from tessera.ir.errors import VerifyError
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.target import get_target
from tessera.ir.types import ScalarType
from tessera.ir.verifier import verify_module
from tessera.passes.schedule.pipeline_plan import pipeline_plan
from tessera.passes.lowering.vector_facts import VectorFacts
from tessera.passes.thread_passes import lower

from pipeline_kernels import F16_RESULT, matmul_case


def loop_of(fn):
    return next(op for op in fn.walk() if op.name == "for")


def plan_for(case, target="sm_80", num_warps=4):
    fn = case.module.functions[0]
    return pipeline_plan(loop_of(fn), get_target(target), num_warps, VectorFacts(fn).facts)


def names(ops):
    return [op.name for op in ops]


# -- the language ------------------------------------------------------------------


def test_pipeline_records_stages_on_the_for_and_round_trips():
    text = print_module(matmul_case(64, 64, 64, 64, 64, 32, stages=3).module)
    assert "{stages = 3}" in text
    assert print_module(parse_module(text)) == text


def test_pipeline_runs_like_range_in_the_tile_interpreter():
    case = matmul_case(70, 40, 96, 32, 32, 32, stages=4)
    args = case.make_args()
    run_function(case.module.functions[0], args, case.grid)
    np.testing.assert_allclose(args[2].astype(np.float32), case.expected().astype(np.float32), **F16_RESULT)
    assert list(tessera.pipeline(1, 9, 3, stages=2)) == [1, 4, 7]     # outside kernels: range


def test_verifier_rejects_stages_below_one():
    text = print_module(matmul_case(64, 64, 64, 64, 64, 32, stages=3).module).replace("stages = 3", "stages = 0")
    with pytest.raises(VerifyError, match="stages .* must be >= 1"):
        verify_module(parse_module(text))


@tessera.kernel
def runtime_stages(x_ptr, n):
    total = 0.0
    for i in tessera.pipeline(0, n, stages=n):
        total += tessera.load(x_ptr + i)
    tessera.store(x_ptr, total)


@tessera.kernel
def zero_stages(x_ptr, n, S: tessera.constexpr):
    total = 0.0
    for i in tessera.pipeline(0, n, stages=S):
        total += tessera.load(x_ptr + i)
    tessera.store(x_ptr, total)


def test_stages_must_be_a_compile_time_int():
    x = np.zeros(4, np.float32)
    with pytest.raises(tessera.CompileError, match="(?s)kernel 'runtime_stages'.*must be a compile-time int") as info:
        runtime_stages.specialize(x, 4)
    assert info.value.line is not None and "tessera.pipeline" in str(info.value)
    for bad in (0, 1.5):
        with pytest.raises(tessera.CompileError, match=r"stages=\.\.\.\) must be an int >= 1"):
            zero_stages.specialize(x, 4, S=bad)


# -- the plan ----------------------------------------------------------------------------


def test_both_dot_operands_are_planned_as_16_byte_copy_rings():
    plan = plan_for(matmul_case(128, 128, 128, 64, 64, 32, stages=3))
    assert plan.stages == 3 and len(plan.loads) == 2
    a, b = plan.loads
    assert (a.operand, a.contiguous_dim, a.copy_bytes) == (0, 1, 16)
    assert (b.operand, b.contiguous_dim, b.copy_bytes) == (1, 1, 16)
    # 64x32 f16 blocks: 256 chunks of 8 elements, 2 per thread of 128.
    assert a.copies.shape == (64, 4) and a.copies.local_size == 2 and a.copies.num_threads == 128
    assert plan.shared_bytes == 3 * (64 * 32 + 32 * 64) * 2


def test_transposed_b_is_kept_transposed_in_its_slots():
    plan = plan_for(matmul_case(128, 128, 128, 64, 64, 32, stages=3, trans_b=True))
    b = plan.loads[1]
    assert b.contiguous_dim == 0 and b.copy_bytes == 16
    assert b.fragment.want.shape == (64, 32) and not b.fragment.trans     # N x K slots, ldmatrix without .trans


def test_a_whose_rows_are_not_known_to_be_aligned_keeps_the_plain_path():
    # K = 50 is not specialized as a multiple of 16, so A's rows (stride K) have no proven alignment for cp.async;
    # B's rows (stride N = 64) do.
    plan = plan_for(matmul_case(64, 64, 50, 64, 64, 32, stages=2))
    assert [(load.operand, load.copy_bytes) for load in plan.loads] == [(1, 16)]


@pytest.mark.parametrize("K,a_copy_bytes", [(100, 8), (50, 4)])
def test_a_known_k_picks_the_widest_copy_its_alignment_allows(K, a_copy_bytes):
    plan = plan_for(matmul_case(64, 64, K, 64, 64, 32, stages=2, fixed_k=True))
    assert [(load.operand, load.copy_bytes) for load in plan.loads] == [(0, a_copy_bytes), (1, 16)]


def test_stages_shrink_to_fit_shared_memory():
    plan = plan_for(matmul_case(128, 128, 128, 128, 128, 64, stages=16), num_warps=8)
    per_stage = 2 * 128 * 64 * 2
    assert plan.requested_stages == 16 and plan.stages == get_target("sm_80").shared_memory_bytes // per_stage
    assert plan.shared_bytes <= get_target("sm_80").shared_memory_bytes


def test_no_plan_without_async_copies_or_with_one_stage():
    case = matmul_case(64, 64, 64, 64, 64, 32, stages=3)
    assert plan_for(case, "gfx90a") is None             # no direct-to-LDS loads (gfx942 has them)
    amd = plan_for(case, "gfx942")                        # unswizzled row-major slots, 4-byte chunks
    assert amd is not None and {(load.copy_bytes, load.fragment, load.slot_layout.swizzle) for load in amd.loads} \
        == {(4, None, None)}
    fn = case.module.functions[0]
    without = dataclasses.replace(get_target("sm_80"), features=frozenset({"shfl", "mma.sync", "ldmatrix"}))
    assert pipeline_plan(loop_of(fn), without, 4, VectorFacts(fn).facts) is None
    assert plan_for(matmul_case(64, 64, 64, 64, 64, 32, stages=1)) is None


@tessera.kernel
def fill_and_bias(a_ptr, b_ptr, bias_ptr, c_ptr, K, BM: tessera.constexpr, BN: tessera.constexpr,
                  BK: tessera.constexpr):
    a = tessera.view(a_ptr, (BM, K))
    b = tessera.view(b_ptr, (K, BN))
    bias = tessera.view(bias_ptr, (K, BN))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=3):
        a_block = a.block((BM, BK), (0, k)).load(fill=1.0)           # a non-zero fill: not zero-filled by cp.async
        acc = tessera.dot(a_block, b.block((BK, BN), (k, 0)).load(), acc)
        acc += bias.block((1, BN), (k, 0)).load().to(tessera.f32)   # feeds no dot
    tessera.view(c_ptr, (BM, BN)).block((BM, BN), (0, 0)).store(acc)


def test_only_zero_filled_loads_feeding_a_dot_are_pipelined():
    args = [np.zeros((64, 64), np.float16), np.zeros((64, 64), np.float16), np.zeros((64, 64), np.float16),
            np.zeros((64, 64), np.float32), 64]
    fn = fill_and_bias.specialize(*args, BM=64, BN=64, BK=32).module.functions[0]
    plan = pipeline_plan(loop_of(fn), get_target("sm_80"), 4, VectorFacts(fn).facts)
    assert [load.operand for load in plan.loads] == [1]      # B only


# -- the thread IR ---------------------------------------------------------------------------


def test_lowered_loop_is_prologue_then_wait_barrier_refill_read():
    stages = 3
    fn = lower(matmul_case(128, 128, 128, 64, 64, 32, stages=stages).module, "sm_80", 4).functions[0]
    top = fn.body.ops
    loop = next(op for op in top if op.name == "for")
    before, after = top[:top.index(loop)], top[top.index(loop) + 1:]
    # prologue: S-1 groups, each with A's and B's copies (2 + 2 per thread)
    assert names(before).count("async_commit") == stages - 1
    assert names(before).count("async_copy") == (stages - 1) * 4
    assert [op.attrs["bytes"] for op in before if op.name == "shared_alloc"] == [stages * 64 * 32 * 2] * 2
    # the loop carries the slot and starts with the wait and the one barrier
    body = loop.regions[0]
    assert loop.attrs["stages"] == stages and body.args[-1].type == ScalarType(tessera.i32)
    assert names(body.ops[:2]) == ["async_wait", "barrier"] and body.ops[0].attrs["pending"] == stages - 2
    inside = names(body.ops)
    assert inside.count("barrier") == 1 and inside.count("async_commit") == 1 and inside.count("async_copy") == 4
    assert inside.index("async_commit") < inside.index("ldmatrix")
    assert not [op for op in loop.walk() if op.name == "load"]           # no register round trip of A or B
    assert all(op.attrs["bytes"] == 16 for op in loop.walk() if op.name == "async_copy")
    # drained before anything reuses the rings' bytes
    assert names(after[:2]) == ["async_wait", "barrier"] and after[0].attrs["pending"] == 0


@pytest.mark.parametrize("target,stages", [("sm_80", 1), ("gfx90a", 3)])
def test_one_stage_or_no_async_copies_lowers_like_range(target, stages):
    num_warps = 2 if target == "gfx90a" else 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = lower(matmul_case(64, 64, 64, 64, 64, 32, stages=stages).module, target, num_warps).functions[0]
    assert not [op for op in fn.walk() if op.name.startswith("async_")]
    assert "stages" not in loop_of(fn).attrs
    said = "runs as a plain loop on gfx90a (no asynchronous copies): gfx90a has no asynchronous copies"
    notes = fn.attrs.get("lowering_notes", ())
    assert any(said in note for note in notes) == (stages > 1)
    assert [type(w.message) for w in caught] == [tessera.PipelineWarning] * (stages > 1)


def test_reduced_stages_are_noted():
    with pytest.warns(tessera.PipelineWarning, match="5 of the 16 stages fit in sm_80's shared memory"):
        fn = lower(matmul_case(256, 256, 256, 128, 128, 64, stages=16).module, "sm_80", 8).functions[0]
    assert loop_of(fn).attrs["stages"] == 5
    assert any("5 of the 16 stages fit in sm_80's shared memory" in note for note in fn.attrs["lowering_notes"])
