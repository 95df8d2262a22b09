"""merge_mbarrier_inits (tessera/passes/merge_mbarrier_inits.py): the top-level mbarrier init groups of a
thread-IR kernel share the first group's fence and barrier, when nothing else needs the later barriers.

IR text in and out for the rule and its exceptions; then the sm_90a attention forward, whose prologue had one
block barrier per TMA-filled operand (Q's mbarrier, the K/V ring's full ones, warp-specialized also the empty
ones) and now has one, with the merged kernel run by the SIMT simulator, which checks every mbarrier's init,
fence and barrier and every shared-memory race. (The other simulator runs of sm_90a kernels,
tests/kernels_lib/test_attention_compile.py and tests/simt/, run merged kernels too.)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tessera.backends.nvptx.ptxas import find_ptxas
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.verifier import verify_function
from tessera.passes.merge_mbarrier_inits import merge_mbarrier_inits

sys.path.insert(0, str(Path(__file__).parents[1] / "kernels_lib"))

HEADER = """\
func @groups(%p: ptr<f32>) attributes {num_threads = 128, warp_size = 32} {
  %tid = thread_id : i32
  %c0 = constant {value = 0} : i32
  %first = cmp %tid, %c0 {pred = "eq"} : bool
  %c1 = constant {value = 1} : i32
  %a = shared_alloc {align = 8, bytes = 8, offset = -1} : ptr<i64, shared>
  if %first {
    mbarrier_init %a, %c1
    fence_mbarrier_init
    yield
  } {
    yield
  }
  barrier
"""

SECOND_GROUP = """\
  %b = shared_alloc {align = 8, bytes = 16, offset = -1} : ptr<i64, shared>
  if %first {
    mbarrier_init %b, %c1
    %b1 = addptr %b, %c1 : ptr<i64, shared>
    mbarrier_init %b1, %c1
    fence_mbarrier_init
    yield
  } {
    yield
  }
  barrier
"""

MERGED = """\
func @groups(%p: ptr<f32>) attributes {num_threads = 128, warp_size = 32} {
  %tid = thread_id : i32
  %c0 = constant {value = 0} : i32
  %first = cmp %tid, %c0 {pred = "eq"} : bool
  %c1 = constant {value = 1} : i32
  %a = shared_alloc {align = 8, bytes = 8, offset = -1} : ptr<i64, shared>
  %b = shared_alloc {align = 8, bytes = 16, offset = -1} : ptr<i64, shared>
  if %first {
    mbarrier_init %a, %c1
    mbarrier_init %b, %c1
    %b1 = addptr %b, %c1 : ptr<i64, shared>
    mbarrier_init %b1, %c1
    fence_mbarrier_init
    yield
  } {
    yield
  }
  barrier
  %x = load %p : f32
  store %p, %x
  return
}
"""


def _run(text: str) -> tuple[int, str]:
    module = parse_module(text)
    merged = merge_mbarrier_inits(module.functions[0])
    verify_function(module.functions[0])
    return merged, print_module(module)


def test_a_later_group_joins_the_first_behind_its_fence_and_barrier():
    """A global load between the groups needs no block barrier: the second group's inits (and the allocation and
    address they use) move into the first, its fence and barrier go."""
    merged, text = _run(HEADER + "  %x = load %p : f32\n" + SECOND_GROUP + "  store %p, %x\n  return\n}\n")
    assert merged == 1 and text == MERGED


def test_a_group_whose_barrier_also_orders_shared_memory_stays():
    """Every thread stores to shared memory before the second group: its barrier orders those stores too."""
    text = (HEADER + "  %x = load %p : f32\n"
            "  %s = shared_alloc {bytes = 512, offset = -1} : ptr<f32, shared>\n"
            "  %mine = addptr %s, %tid : ptr<f32, shared>\n"
            "  store %mine, %x\n" + SECOND_GROUP + "  %y = load %mine : f32\n  store %p, %y\n  return\n}\n")
    merged, out = _run(text)
    assert merged == 0 and out == print_module(parse_module(text))


def test_a_group_in_a_loop_or_under_another_predicate_stays():
    in_loop = (HEADER + "  %n = constant {value = 4} : i32\n  for %c0, %n, %c1 {\n  ^(%i: i32):\n"
               + "\n".join("  " + line for line in SECOND_GROUP.splitlines()) + "\n    yield\n  }\n  return\n}\n")
    assert _run(in_loop)[0] == 0
    other = HEADER + "  %last = cmp %tid, %c1 {pred = \"eq\"} : bool\n" + \
        SECOND_GROUP.replace("if %first", "if %last") + "  return\n}\n"
    assert _run(other)[0] == 0


# -- the attention forward on sm_90a -----------------------------------------------------------------------------


def _prologue(ptx: str) -> str:
    """The PTX before the first wgmma fence or register reallocation: the setup every thread runs."""
    end = min(ptx.find(marker) for marker in ("wgmma.fence", "setmaxnreg") if marker in ptx)
    return ptx[:end]


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("ws, inits", [(False, 3), (True, 5)], ids=["plain", "warp-specialized"])
def test_the_attention_forward_prologue_has_one_barrier_for_every_mbarrier(ws, inits):
    """Q's mbarrier and the K/V ring's (full; warp-specialized also empty) are initialized together, fenced once,
    and published by one bar.sync (before: 2, warp-specialized 3)."""
    from tessera.kernels_lib.attention import GPU_PLANS, WS_GPU_PLANS
    from test_attention_compile import compile_forward

    plan = (WS_GPU_PLANS if ws else GPU_PLANS["nvidia"])[128]
    prologue = _prologue(compile_forward("sm_90a", 128, plan, "plain").stages["ptx"])
    assert len(re.findall(r"\bmbarrier\.init\.shared", prologue)) == inits
    assert len(re.findall(r"\bfence\.mbarrier_init\b", prologue)) == 1
    assert len(re.findall(r"\b(bar\.sync|barrier\.sync)\b", prologue)) == 1


def test_the_merged_forward_runs_on_the_simulator():
    """The warp-specialized forward, merged (one top-level fence_mbarrier_init for all five mbarriers), computes
    float64 attention on the SIMT simulator."""
    import torch
    from test_attention_compile import forward_on_the_simulator

    def one_group(fn):
        return sum(op.name == "fence_mbarrier_init" for op in fn.walk()) == 1

    o, lse, expected_o, expected_lse = forward_on_the_simulator("sm_90a", 8, 128, ws=True, check_waits=one_group)
    torch.testing.assert_close(o.double(), expected_o, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-4, atol=1e-4)
