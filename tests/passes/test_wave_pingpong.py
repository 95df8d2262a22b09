"""wave_pingpong: two programs a block, their wave groups one s_barrier apart around a `pingpong` loop.

A hand-written thread-IR kernel (one wave a program, 64 threads; wave64 as on AMD) whose loop exchanges values
through shared memory between barriers and whose trip count depends on the program (so the groups' counts
differ and the balancing barriers matter) computes on the SIMT simulator, after the pass, what it computes
before it (with twice the programs); what the pass cannot balance is refused with the reason.
(The attention forward with the pass, on the simulator and in AMDGCN: tests/kernels_lib/test_attention_amd_pingpong.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

from tessera.backends.simt import run_threads
from tessera.ir.verifier import verify_function
from tessera.passes.errors import LoweringError
from tessera.passes.wave_pingpong import stagger_wave_groups

from ir_text import kernel

# out[pid * 64 + t] = sum over i < 3 + pid of (the value thread 63 - t wrote in iteration i) = sum (63 - t + i)
EXCHANGE = """\
func @exchange(%out: ptr<f32>) attributes {{num_threads = 64, warp_size = 64, shared_bytes = 256}} {{
  %c0 = constant {{value = 0}} : i32
  %c1 = constant {{value = 1}} : i32
  %c3 = constant {{value = 3}} : i32
  %c63 = constant {{value = 63}} : i32
  %c64 = constant {{value = 64}} : i32
  %z = constant {{value = 0.0}} : f32
  %pid = program_id {{axis = 0}} : i32
  %t = thread_id : i32
  %hi = add %c3, %pid : i32
  %s = shared_alloc {{bytes = 256, offset = 0}} : ptr<f32, shared>
  %r = for %c0, {hi}, %c1, %z {{pingpong = true}} : f32 {{
  ^(%i: i32, %acc: f32):
    %v = add %t, %i : i32
    %vf = cast %v : f32
    %mine = addptr %s, %t : ptr<f32, shared>
    store %mine, %vf
    barrier
    %u = sub %c63, %t : i32
    %theirs = addptr %s, %u : ptr<f32, shared>
    %w = load %theirs : f32
    barrier
    %acc2 = add %acc, %w : f32
    yield %acc2
  }}
  %base = mul %pid, %c64 : i32
  %at = add %base, %t : i32
  %p = addptr %out, %at : ptr<f32>
  store %p, %r
  return
}}
"""


def expected(programs: int) -> np.ndarray:
    t = np.arange(64)
    return np.concatenate([sum(63 - t + i for i in range(3 + pid)) for pid in range(programs)]).astype(np.float32)


def test_the_staggered_groups_compute_what_the_plain_loop_computes():
    plain = kernel(EXCHANGE.format(hi="%hi"))
    out = np.zeros(4 * 64, np.float32)
    run_threads(plain, [out], 4)
    np.testing.assert_array_equal(out, expected(4))

    fn = kernel(EXCHANGE.format(hi="%hi"))
    assert stagger_wave_groups(fn, shared_memory_bytes=65536)
    verify_function(fn)
    assert fn.attrs["num_threads"] == 128 and fn.attrs["programs_per_block"] == 2 and fn.attrs["shared_bytes"] == 512
    out = np.zeros(4 * 64, np.float32)
    run_threads(fn, [out], 2)               # 4 programs in 2 blocks
    np.testing.assert_array_equal(out, expected(4))


def test_an_odd_grid_runs_one_program_past_its_end():
    """3 programs in 2 blocks: program 3 runs too (the kernel must tolerate it; here it writes past 3 * 64)."""
    fn = kernel(EXCHANGE.format(hi="%hi"))
    stagger_wave_groups(fn, shared_memory_bytes=65536)
    out = np.zeros(4 * 64, np.float32)
    run_threads(fn, [out], 2)
    np.testing.assert_array_equal(out[:3 * 64], expected(3))


def test_what_cannot_be_balanced_is_refused():
    with pytest.raises(LoweringError, match="its own shared memory: 2 x 256 bytes, more than the target's 300"):
        stagger_wave_groups(kernel(EXCHANGE.format(hi="%hi")), shared_memory_bytes=300)
    nested = EXCHANGE.format(hi="%hi").replace("    barrier\n    %acc2", "    %q = if %c1 : i32 {\n      barrier\n"
                                              "      yield %c0\n    } {\n      yield %c0\n    }\n    %acc2", 1)
    with pytest.raises(LoweringError, match="nested in control flow"):
        stagger_wave_groups(kernel(nested.replace("%q = if %c1", "%cb = cmp %c1, %c0 {pred = \"eq\"} : bool\n"
                                                                 "    %q = if %cb")), shared_memory_bytes=65536)
    by_thread = EXCHANGE.format(hi="%t")
    with pytest.raises(LoweringError, match="bounds depend on 'thread_id'"):
        stagger_wave_groups(kernel(by_thread), shared_memory_bytes=65536)
