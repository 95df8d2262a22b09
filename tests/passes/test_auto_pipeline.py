"""Plain `range` loops feeding a dot are software-pipelined without asking (`passes/schedule/auto_pipeline.py`).

Specification:

* a `for` with no `stages` (what `range` traces to) whose block loads feed a
  tensor-core dot lowers on sm_80 exactly as `tessera.pipeline(...,
  stages=3)` would: a cp.async ring three deep, `async_wait {pending = 1}`,
  the thread-IR `for {stages = 3}`; on sm_90a the ring is filled by TMA and
  read by wgmma; on gfx942 it stays a plain loop, without a word;
* `tessera.pipeline(..., stages=1)` records `stages = 1` and keeps the loop
  plain; `stages=2` overrides the default depth;
* a loop that feeds a dot and cannot be pipelined stays plain and says why at
  its line: a store that may write what a load reads (the alias facts:
  distinct `noalias` parameters do not alias, one array passed twice does),
  a load address chased through memory, a `while` whose trip count is read
  from memory at every iteration. The reason is in `lowering_notes`; strict
  mode raises it as a CompileError at the loop's line, otherwise nothing is
  shown. A `for` whose bound is loaded from memory before it starts is
  pipelined (its trip count is known on entry). Blocks read through tiles
  of pointers (Triton's pointer arithmetic) are named as the reason; a loop
  that copies into shared memory itself is left as written, silently;
* every kernel here computes numpy's product on the tile interpreter.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tessera
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.passes.schedule.auto_pipeline import DEFAULT_STAGES, may_alias
from tessera.passes.thread_passes import lower

from auto_pipeline_kernels import (aliasing_store, chased_offsets, half_by_hand, loaded_trip_count, matmul_args,
                                   plain_matmul, pointer_matmul, staged_matmul, while_from_memory)

# A 64x64 <- 64xK @ Kx64 f16 matmul: the loop has no `stages`, as `range` traces it. {STORE} is where the
# refused variant writes A inside the loop.
BEFORE = """\
func @mm(%a_ptr: ptr<f16>, %b_ptr: ptr<f16>, %c_ptr: ptr<f16>, %K: i32) attributes {divisible_by_16 = [0, 1, 2, 3], noalias = [0, 1, 2]} {
  %c0 = constant {value = 0} : i32
  %c1 = constant {value = 1} : i32
  %c32 = constant {value = 32} : i32
  %c64 = constant {value = 64} : i32
  %a = make_view %a_ptr, %c64, %K, %K, %c1 : view<f16, 2>
  %b = make_view %b_ptr, %K, %c64, %c64, %c1 : view<f16, 2>
  %zero = constant {value = 0.0} : tile<64x64xf32>
  %steps = div %K, %c32 : i32
  %acc = for %c0, %steps, %c1, %zero : tile<64x64xf32> {
  ^(%k: i32, %sum: tile<64x64xf32>):
    %kk = mul %k, %c32 : i32
    %ablock = view_load %a, %c0, %kk {shape = [64, 32]} : tile<64x32xf16>
    %bblock = view_load %b, %kk, %c0 {shape = [32, 64]} : tile<32x64xf16>
    %next = dot %ablock, %bblock, %sum : tile<64x64xf32>{STORE}
    yield %next
  }
  %c = make_view %c_ptr, %c64, %c64, %c64, %c1 : view<f16, 2>
  %out = cast %acc : tile<64x64xf16>
  view_store %c, %c0, %c0, %out
  return
}
"""
STORE_INTO_A = "\n    %zeros = constant {value = 0.0} : tile<64x32xf16>\n    view_store %a, %c0, %kk, %zeros"


def lowered(text: str, target: str = "sm_80", num_warps: int = 4):
    """(thread-IR text, lowering notes, warnings) of tile-IR `text` lowered for `target`."""
    module = parse_module(text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = lower(module, target, num_warps)
    fn = threads.functions[0]
    return print_module(threads), fn.attrs.get("lowering_notes", ()), [str(w.message) for w in caught]


def test_unannotated_loop_lowers_to_a_three_deep_cp_async_ring_on_sm_80():
    before = BEFORE.replace("{STORE}", "")
    assert "stages" not in before
    after, notes, _ = lowered(before)
    assert DEFAULT_STAGES == 3
    assert after.count("async_commit") == DEFAULT_STAGES        # two prologue groups, one per iteration
    assert "async_wait {pending = 1}" in after and "async_wait {pending = 0}" in after
    assert "{stages = 3}" in after and "ldmatrix" in after and "= mma " in after
    assert "view_load" not in after and not notes


def test_a_store_into_a_loaded_array_keeps_the_loop_plain_and_says_why():
    after, notes, shown = lowered(BEFORE.replace("{STORE}", STORE_INTO_A))
    body = after.split("\n", 1)[1]                          # below the attributes, which hold the notes
    assert "async_copy" not in body and "stages" not in body
    (note,) = notes
    assert "feeds a tensor-core dot but is not software-pipelined" in note
    assert "the store at" in note and "may write memory the block load at" in note
    assert "stages=1" in note                                   # how to opt out
    assert shown and "may write memory" in shown[0]             # a warning the compile driver filters


def test_unannotated_loop_on_sm_90a_is_tma_into_wgmma_and_on_gfx942_plain():
    after, notes, _ = lowered(BEFORE.replace("{STORE}", ""), "sm_90a")
    assert "tma_load" in after and "wgmma" in after and not notes
    after, notes, shown = lowered(BEFORE.replace("{STORE}", ""), "gfx942", num_warps=2)
    assert "async" not in after and not notes and not shown


def test_alias_facts():
    assert not may_alias(frozenset({0}), frozenset({2}), {0, 1, 2})
    assert may_alias(frozenset({0}), frozenset({0}), {0, 1, 2})       # the same parameter
    assert may_alias(frozenset({0}), frozenset({2}), {2})             # A shares memory with some argument
    assert may_alias(None, frozenset({2}), {0, 1, 2})                 # a pointer of unknown origin


# -- from the DSL ---------------------------------------------------------------------------------------------


def compile_strict(kernel, *args, target="sm_80", **constexprs):
    return kernel.compile(*args, target=target, strict=True, **constexprs)


def test_range_loop_traces_without_stages_and_pipeline_one_opts_out():
    args = matmul_args(64, 64, 64)
    assert "stages" not in plain_matmul.ir(*args, BM=64, BN=64, BK=32)
    assert "{stages = 1}" in staged_matmul.ir(*args, BM=64, BN=64, BK=32, STAGES=1)
    plain = staged_matmul.compile(*args, target="sm_80", BM=64, BN=64, BK=32, STAGES=1)
    assert "async_copy" not in plain.stages["thread_ir"] and "lowering_notes" not in plain.stages["thread_ir"]
    two = staged_matmul.compile(*args, target="sm_80", BM=64, BN=64, BK=32, STAGES=2)
    assert "{stages = 2}" in two.stages["thread_ir"]
    auto = compile_strict(plain_matmul, *args, BM=64, BN=64, BK=32)
    assert f"{{stages = {DEFAULT_STAGES}}}" in auto.stages["thread_ir"]


def test_a_store_that_may_alias_a_load_is_a_strict_mode_error_at_the_loop():
    a, b, c = (np.zeros((64, 64), np.float16) for _ in range(3))
    # c is another array: the launch finds the memory disjoint, so the store cannot change what A and B read
    compiled = compile_strict(aliasing_store, a, b, c, 64, BM=64, BN=64, BK=32)
    assert "async_copy" in compiled.stages["thread_ir"]
    with pytest.raises(tessera.CompileError, match="(?s)kernel 'aliasing_store'.*the store at line .* may write "
                                                   "memory the block load at line .* reads.*stages=1") as info:
        compile_strict(aliasing_store, a, b, a, 64, BM=64, BN=64, BK=32)      # c is A: the store writes A
    assert info.value.line == aliasing_store.loop_line
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # outside strict mode: nothing shown
        compiled = aliasing_store.compile(a, b, a, 64, target="sm_80", strict=False, BM=64, BN=64, BK=32)
    assert "async_copy" not in compiled.stages["thread_ir"]
    assert "not software-pipelined: the store at line" in compiled.stages["thread_ir"]      # kept as a note


def test_a_load_address_chased_through_memory_is_refused_with_its_reason():
    a, b, c = (np.zeros((64, 64), np.float16) for _ in range(3))
    order = np.arange(1, 3, dtype=np.int32)
    with pytest.raises(tessera.CompileError, match="(?s)not software-pipelined: the block load at line .* has a "
                                                   "view or offsets the loop cannot compute for iterations ahead") \
            as info:
        compile_strict(chased_offsets, a, b, c, order, 64, BM=64, BN=64, BK=32)
    assert info.value.line == chased_offsets.loop_line


def test_a_while_whose_trip_count_is_read_from_memory_is_refused_and_a_for_from_memory_is_pipelined():
    a, b, c = (np.zeros((64, 64), np.float16) for _ in range(3))
    steps = np.array([2], np.int32)
    with pytest.raises(tessera.CompileError, match="(?s)its trip count is not known when it starts") as info:
        compile_strict(while_from_memory, a, b, c, steps, 64, BM=64, BN=64, BK=32)
    assert info.value.line == while_from_memory.loop_line
    compiled = compile_strict(loaded_trip_count, a, b, c, steps, 64, BM=64, BN=64, BK=32)
    assert "async_copy" in compiled.stages["thread_ir"]


@pytest.mark.parametrize("kernel", ["aliasing_store", "chased_offsets", "while_from_memory", "loaded_trip_count",
                                    "half_by_hand", "pointer_matmul"])
def test_refused_and_pipelined_kernels_compute_what_numpy_computes(kernel):
    """The kernels of these tests are real programs: the tile interpreter runs each against numpy."""
    import auto_pipeline_kernels as kernels

    expected, run = getattr(kernels, f"run_{kernel}")()
    np.testing.assert_allclose(run, expected, rtol=2e-3, atol=2e-3)


def test_blocks_read_through_pointer_tiles_are_named_as_the_reason():
    a, b, c = (np.zeros((64, 64), np.float16) for _ in range(3))
    with pytest.raises(tessera.CompileError, match=r"(?s)operand A of the dot at line .* is read through a tile of "
                                                   r"pointers .*only block loads of views") as info:
        compile_strict(pointer_matmul, a, b, c, 64, BM=64, BN=64, BK=32)
    assert info.value.line == pointer_matmul.loop_line


def test_a_loop_that_moves_data_through_shared_memory_itself_is_left_as_written():
    """A by hand through tessera.shared + async_copy, B a block load the dot takes as it is: the compiler adds
    no ring of its own (its cp.async groups would mix with the author's), and says nothing even in strict mode."""
    compiled = compile_strict(half_by_hand, *matmul_args(64, 64, 64)[:3], 64, BM=64, BN=64, BK=32)
    thread_ir = compiled.stages["thread_ir"]
    assert "stages" not in thread_ir and "lowering_notes" not in thread_ir
    assert thread_ir.count("async_commit") == compiled.stages["tile_ir"].count("smem_async_commit") == 1
