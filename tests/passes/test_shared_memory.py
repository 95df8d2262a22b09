"""Shared-memory allocation: offsets by liveness, 16-byte alignment, loops, capacity."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.verifier import verify_module
from tessera.passes.errors import LoweringError
from tessera.passes.manager import PassManager
from tessera.passes.shared_memory import SharedMemoryAllocation, allocate_shared_memory


def allocated(text: str, capacity: int | None = None) -> tuple[dict[str, int], int]:
    module = parse_module(text)
    verify_module(module)
    fn = module.functions[0]
    total = allocate_shared_memory(fn, capacity)
    verify_module(module)
    offsets = {op.result.name_hint: op.attrs["offset"] for op in fn.walk() if op.name == "shared_alloc"}
    assert fn.attrs["shared_bytes"] == total
    return offsets, total


SEQUENTIAL = """\
func @k(%p: ptr<f32>) attributes {num_threads = 32, warp_size = 32} {
  %a = shared_alloc {bytes = 100, offset = -1} : ptr<f32, shared>
  %x = load %a : f32
  barrier
  %b = shared_alloc {bytes = 64, offset = -1} : ptr<f32, shared>
  store %b, %x
  barrier
  return
}
"""


def test_buffers_that_are_not_live_together_share_bytes():
    offsets, total = allocated(SEQUENTIAL)
    assert offsets == {"a": 0, "b": 0}
    assert total == 100


OVERLAPPING = """\
func @k(%p: ptr<f32>) attributes {num_threads = 32, warp_size = 32} {
  %a = shared_alloc {bytes = 100, offset = -1} : ptr<f32, shared>
  %b = shared_alloc {bytes = 64, offset = -1} : ptr<f32, shared>
  %c = shared_alloc {bytes = 8, offset = -1} : ptr<f32, shared>
  %four = constant {value = 4} : i32
  %a4 = addptr %a, %four : ptr<f32, shared>
  %x = load %b : f32
  store %c, %x
  barrier
  store %a4, %x
  barrier
  return
}
"""


def test_live_buffers_get_disjoint_aligned_offsets():
    offsets, total = allocated(OVERLAPPING)
    # Largest first: a at 0, b after a (rounded up to 16), c after b.
    assert offsets == {"a": 0, "b": 112, "c": 176}
    assert all(offset % 16 == 0 for offset in offsets.values())
    assert total == 184


def test_a_use_through_a_derived_pointer_keeps_the_buffer_live():
    late = "  %late = shared_alloc {bytes = 16, offset = -1} : ptr<f32, shared>\n  store %late, %x\n"
    text = OVERLAPPING.replace("  store %a4, %x\n", late + "  store %a4, %x\n")
    offsets, _ = allocated(text)
    assert offsets["late"] not in range(0, 100)         # a is still live (through %a4) when late is


LOOP = """\
func @k(%p: ptr<f32>, %n: i32) attributes {num_threads = 32, warp_size = 32} {
  %a = shared_alloc {bytes = 64, offset = -1} : ptr<f32, shared>
  %zero = constant {value = 0} : i32
  %one = constant {value = 1} : i32
  %f = constant {value = 1.0} : f32
  store %a, %f
  barrier
  %r = for %zero, %n, %one, %f : f32 {
  ^(%i: i32, %acc: f32):
    %x = load %a : f32
    barrier
    %b = shared_alloc {bytes = 64, offset = -1} : ptr<f32, shared>
    store %b, %x
    barrier
    %y = load %b : f32
    barrier
    %s = add %acc, %y : f32
    yield %s
  }
  %c = shared_alloc {bytes = 64, offset = -1} : ptr<f32, shared>
  store %c, %r
  barrier
  return
}
"""


def test_a_buffer_read_in_a_loop_stays_live_for_the_whole_loop():
    offsets, total = allocated(LOOP)
    assert offsets["a"] != offsets["b"]          # b's writes in iteration 1 would clobber a for iteration 2
    assert offsets["c"] in (offsets["a"], offsets["b"])   # after the loop both are dead
    assert total == 128


def test_capacity_is_checked():
    with pytest.raises(LoweringError, match="needs 184 bytes of shared memory, more than the 128"):
        allocated(OVERLAPPING, capacity=128)


def test_the_target_attribute_gives_the_capacity():
    text = OVERLAPPING.replace("warp_size = 32}", 'target = "sm_80", warp_size = 32}')
    text = text.replace("bytes = 100,", f"bytes = {200 * 1024},")
    with pytest.raises(LoweringError, match="166912"):      # sm_80: 163 KiB per block
        allocated(text)


def test_no_buffers_is_zero_bytes_and_the_pass_object_works():
    module = parse_module("func @k(%p: ptr<f32>) {\n  return\n}\n")
    PassManager([SharedMemoryAllocation()]).run(module)
    assert module.functions[0].attrs["shared_bytes"] == 0
    module = parse_module(SEQUENTIAL)
    PassManager([SharedMemoryAllocation()]).run(module)
    assert "offset = -1" not in print_module(module)


def test_allocated_kernels_run_race_free_on_the_simulator():
    simt = pytest.importorskip("tessera.backends.simt")
    module = parse_module(LOOP)
    fn = module.functions[0]
    allocate_shared_memory(fn)
    out = np.zeros(1, np.float32)
    simt.run_threads(fn, [out, 3], (1,))      # no race or bounds error
