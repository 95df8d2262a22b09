"""pingpong: each warpgroup's copy of a `pingpong` loop waits for its turn before its first wgmma and hands the turn
on after its last commit before a wait (IR text in, IR text out); the DSL's `pingpong=` asks for it and says
what it needs.

(The copies, their balance and the simulated kernel: tests/kernels_lib/test_attention_overlap.py.)
"""

from __future__ import annotations

import pytest

import tessera
from tessera.ir.core import Module
from tessera.ir.printer import print_module
from tessera.passes.pingpong import insert_pingpong_barriers

from ir_text import kernel

LOOP = """\
func @turns(%sa: ptr<bf16, shared>, %out: ptr<f32>, %n: i32) attributes {{num_threads = 256}} {{
  %0 = constant {{value = 0.0}} : f32
  %c0 = constant {{value = 0}} : i32
  %c1 = constant {{value = 1}} : i32
  %z = splat %0 : regs<32xf32>
  %d = wgmma_desc %sa {{lbo = 16, sbo = 1024, swizzle = 128}} : i64
  %r = for %c0, %n, %c1, %z {{pingpong_turn = [3, 4]}} : regs<32xf32> {{
  ^(%i: i32, %y: regs<32xf32>):
{sync}    wgmma_fence
    %x = wgmma %d, %d, %z {{dtype = "bf16", k = 16, m = 64, n = 64}} : regs<32xf32>
    wgmma_commit
    wgmma_fence
    %y2 = wgmma %d, %d, %y {{dtype = "bf16", k = 16, m = 64, n = 64}} : regs<32xf32>
    wgmma_commit
{arrive}    wgmma_wait {{pending = 1}}
    %e = exp2 %x : regs<32xf32>
    wgmma_wait {{pending = 0}}
    %s = add %y2, %e : regs<32xf32>
    yield %s
  }}
  %o = extract %r {{index = 0}} : f32
  store %out, %o
  return
}}
"""


def printed(fn) -> str:
    return print_module(Module([fn]))


def test_a_turn_brackets_the_issue_of_both_products():
    fn = kernel(LOOP.format(sync="", arrive=""))
    assert insert_pingpong_barriers(fn) == 1
    after = LOOP.format(sync="    named_barrier {{count = 256, id = 3}}\n",
                        arrive="    named_barrier {{arrive = true, count = 256, id = 4}}\n")
    assert printed(fn) == printed(kernel(after.replace("{{", "{").replace("}}", "}")))


def test_unmarked_loops_are_left_alone():
    fn = kernel(LOOP.format(sync="", arrive="").replace(" {pingpong_turn = [3, 4]}", ""))
    before = printed(fn)
    assert insert_pingpong_barriers(fn) == 0 and printed(fn) == before


@tessera.kernel
def turns_without_producer(a_ptr, N, BK: tessera.constexpr):
    acc = tessera.zeros((64, 64), tessera.f32)
    for k in tessera.pipeline(0, N, stages=2, pingpong=True):
        acc += 1.0
    tessera.view(a_ptr, (64, 64), (64, 1)).block((64, 64), (0, 0)).store(acc)


def test_pingpong_needs_warp_specialization_on_nvidia_and_one_stage_on_amd():
    """Without warp_specialize=True, pingpong=True is AMD's wave-group ping-pong (`passes/wave_pingpong.py`):
    refused on NVIDIA (its ping-pong is between warp-specialized warpgroups), and with a ring (stages=2) on AMD."""
    with pytest.raises(tessera.CompileError, match=r"without warp_specialize=True is AMD's wave-group ping-pong, "
                                                   r"which sm_90a does not run; on sm_90a pass warp_specialize=True"):
        turns_without_producer.compile(target="sm_90a", signature="*f32:16,i32", BK=16)
    with pytest.raises(tessera.CompileError, match=r"needs tessera.pipeline\(stages=1\)"):
        turns_without_producer.compile(target="gfx942", signature="*f32:16,i32", BK=16, num_warps=8)
