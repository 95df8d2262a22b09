"""The TMA fill of pipelined loads (`passes/lowering/tma_fill.py`): which loads qualify, and the thread IR.

Specification:

* on sm_90 / sm_90a the pipelined A and B loads of a matmul whose views are
  kernel pointer parameters with 16-byte aligned rows get a `TmaBox`: a recipe
  naming the parameters (sizes, strides), the box, and the TMA swizzle equal
  to the slot's; sm_80 (no TMA) keeps cp.async;
* the thread IR: the hidden `tensormap` parameters come last; before the
  prologue thread 0 initializes one mbarrier per slot (count 1) and fences
  them for the async proxy, then a barrier; each issue is thread 0 only, for
  a live iteration only: fence_proxy_async, arrive_expect_tx of the boxes'
  bytes, one tma_load per map; the loop carries (slot, phase), waits on the
  slot's mbarrier before the barrier, flips the phase when the slot wraps;
  after the loop thread 0 invalidates the mbarriers before the last barrier;
* the thread IR prints and parses back with its recipes.
"""

from __future__ import annotations

import pytest

import tessera
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.target import get_target
from tessera.ir.tensor_map import kernel_recipes
from tessera.ir.types import TensorMapType
from tessera.passes.lowering.pipeline_plan import pipeline_plan
from tessera.passes.lowering.vector_facts import VectorFacts
from tessera.passes.pipeline_threads import lower

from pipeline_kernels import matmul_case


def plan_for(case, target):
    fn = case.module.functions[0]
    loop = next(op for op in fn.walk() if op.name == "for")
    return pipeline_plan(loop, get_target(target), 4, VectorFacts(fn).facts)


def names(ops):
    return [op.name for op in ops]


def effects(ops):
    """The names of `ops` without the address and index arithmetic between them."""
    return [name for name in names(ops) if name not in ("addptr", "constant", "mul", "add", "cast")]


@pytest.mark.parametrize("target", ["sm_90"])      # sm_90a: wgmma slots, filled by cp.async for now
def test_both_operands_get_a_tma_box_with_the_slot_swizzle(target):
    plan = plan_for(matmul_case(128, 128, 256, 64, 64, 32, 3, tessera.bf16), target)
    boxes = [load.tma for load in plan.loads]
    assert all(boxes) and [b.recipe.box_shape for b in boxes] == [(64, 32), (32, 64)]
    # A's slot rows are 64 bytes (64B swizzle), B's 128 bytes (128B): the swizzle the ldmatrix reads expect
    assert [(b.recipe.swizzle, b.slot_align, b.box_bytes) for b in boxes] == [("64B", 512, 4096),
                                                                               ("128B", 1024, 4096)]
    assert [load.fragment.smem.swizzle.bits for load in plan.loads] == [2, 3]


def test_without_tma_the_slots_are_filled_by_cp_async():
    plan = plan_for(matmul_case(128, 128, 256, 64, 64, 32, 3, tessera.bf16), "sm_80")
    assert [load.tma for load in plan.loads] == [None, None]


def test_thread_ir_of_a_tma_filled_pipeline():
    stages = 3
    fn = lower(matmul_case(128, 128, 256, 64, 64, 64, stages, tessera.bf16).module, "sm_90", 4).functions[0]
    assert [a.type for a in fn.args[-2:]] == [TensorMapType()] * 2 and len(kernel_recipes(fn.attrs)) == 2
    top = fn.body.ops
    loop = next(op for op in top if op.name == "for" and op.attrs.get("stages"))
    before, after = top[:top.index(loop)], top[top.index(loop) + 1:]

    setup = next(op for op in before if op.name == "if")
    assert effects(setup.regions[0].ops) == ["mbarrier_init"] * stages + ["fence_mbarrier_init", "yield"]
    assert names(before)[names(before).index("if") + 1] == "barrier"
    issues = [op for op in before if op.name == "if"][1:]
    assert len(issues) == stages - 1                                 # the prologue: iterations 0 .. S-2
    for issue in issues:
        assert issue.operands[0].owner.name == "and"                 # thread 0 and the iteration is live
        assert effects(issue.regions[0].ops) == ["fence_proxy_async", "mbarrier_arrive_expect_tx", "tma_load",
                                               "tma_load", "yield"]
        assert names(issue.regions[1].ops) == ["yield"]
    assert "async_copy" not in names(fn.walk()) and "async_wait" not in names(fn.walk())

    body = loop.regions[0]
    assert [a.name_hint for a in body.args[-2:]] == ["slot", "phase"]
    assert effects(body.ops)[:2] == ["mbarrier_wait", "barrier"]
    wait = next(op for op in body.ops if op.name == "mbarrier_wait")
    assert wait.operands[1] is body.args[-1]                          # the carried phase parity
    assert [v.owner.attrs["value"] for v in loop.operands[-2:]] == [0, 0]   # slot 0, phase 0
    flip = body.ops[-1].operands[-1].owner                              # the yielded phase
    assert flip.name == "select" and flip.operands[0] is body.ops[-1].operands[-2].owner.operands[0]

    release = next(op for op in after if op.name == "if")
    assert effects(release.regions[0].ops) == ["mbarrier_inval"] * stages + ["yield"]
    assert names(after).index("if") < names(after).index("barrier")


def test_thread_ir_with_tensor_maps_prints_and_parses_back():
    module = lower(matmul_case(64, 64, 128, 64, 64, 64, 2, tessera.bf16, trans_b=True).module, "sm_90", 4)
    text = print_module(module)
    assert "%a_ptr_tma0: tensormap, %b_ptr_tma1: tensormap" in text and "tensor_maps = [[8, 0, \"bf16\"" in text
    again = parse_module(text)
    assert print_module(again) == text
    assert kernel_recipes(again.functions[0].attrs) == kernel_recipes(module.functions[0].attrs)
