"""Lowering explicit shared buffers (`passes/schedule/shared_buffers.py`): IR text in, thread IR out.

Specification:

* a buffer becomes one `shared_alloc {whole_kernel = true}` of its bytes,
  live for the whole kernel (the allocator never lets another buffer share
  its bytes, since async copies land in it on the author's schedule);
* on sm_80 a copy of a 16-byte aligned view block is one cp.async of 16
  bytes per chunk, commit and wait keep their counts, barrier stays; on
  gfx942 it is one direct-to-LDS load of 4 bytes a lane per chunk (16 on
  gfx950), every wave's lanes on consecutive chunks of an unswizzled buffer,
  commit and wait kept; on gfx90a (no async copy) the copy is a load and a
  shared store and commit and wait disappear;
* the swizzle is chosen to cut bank conflicts: a tile read back transposed
  (a column per thread) has fewer conflicts than in a row-major buffer.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.ir import dtypes as dt
from tessera.ir.builder import Builder
from tessera.ir.layouts import local, spatial
from tessera.ir.parser import parse_module
from tessera.ir.smem_layouts import SmemLayout, bank_conflicts
from tessera.ir.target import get_target
from tessera.ir.types import PointerType
from tessera.passes.thread_passes import lower
from tessera.passes.schedule.shared_buffers import Access, choose_swizzle
from tessera.passes.shared_memory import allocate_shared_memory

COPY = """\
func @k(%a: ptr<f16>, %n: i32) attributes {divisible_by_16 = [0, 1]} {
  %buf = smem_alloc : smem<2x64x32xf16>
  %zero = constant {value = 0} : i32
  %one = constant {value = 1} : i32
  %v = make_view %a, %n, %n, %n, %one : view<f16, 2>
  %s = smem_slot %buf, %one : smem<64x32xf16>
  smem_async_copy %s, %v, %zero, %zero
  smem_async_commit
  smem_async_wait {pending = 0}
  smem_barrier
  %x = smem_load %s : tile<64x32xf16>
  %y = add %x, %x : tile<64x32xf16>
  smem_store %s, %y
  return
}
"""


def thread_ops(target: str):
    fn = lower(parse_module(COPY), target, num_warps=4).functions[0]
    return fn, [op for op in fn.walk()]


def test_on_sm_80_a_block_copy_is_16_byte_cp_async_chunks():
    fn, ops = thread_ops("sm_80")
    (alloc,) = [op for op in ops if op.name == "shared_alloc"]
    assert alloc.attrs["bytes"] == 2 * 64 * 32 * 2 and alloc.attrs["whole_kernel"] is True
    copies = [op for op in ops if op.name == "async_copy"]
    assert len(copies) == 64 * 32 * 2 // 16 // 128 and {op.attrs["bytes"] for op in copies} == {16}
    names = [op.name for op in ops]
    assert names.count("async_commit") == 1 and names.count("barrier") == 1
    assert [op.attrs["pending"] for op in ops if op.name == "async_wait"] == [0]


@pytest.mark.parametrize("target, nbytes", [("gfx942", 4), ("gfx950", 16)])
def test_on_cdna3_a_block_copy_is_direct_to_lds_chunks_consecutive_per_wave(target, nbytes):
    fn, ops = thread_ops(target)
    copies = [op for op in ops if op.name == "async_copy"]
    assert len(copies) == 64 * 32 * 2 // nbytes // 256 and {op.attrs["bytes"] for op in copies} == {nbytes}
    names = [op.name for op in ops]
    assert names.count("async_commit") == 1 and [op.attrs["pending"] for op in ops if op.name == "async_wait"] == [0]
    shared_stores = [op for op in ops if op.name == "store" and op.operands[0].type.element.address_space == "shared"]
    assert len(shared_stores) == 1                  # the smem_store's: the copy writes LDS itself


def test_on_gfx90a_a_block_copy_is_a_load_and_a_shared_store():
    fn, ops = thread_ops("gfx90a")
    names = {op.name for op in ops}
    assert not names & {"async_copy", "async_commit", "async_wait"}
    shared_stores = [op for op in ops if op.name == "store" and op.operands[0].type.element.address_space == "shared"]
    assert len(shared_stores) == 2                  # the copy's and the smem_store's
    assert "barrier" in names


def test_explicit_buffers_share_bytes_with_nothing():
    fn = lower(parse_module(COPY), "sm_80", num_warps=4).functions[0]
    temp = fn.body.ops[-1]
    # a temporary buffer used only after the explicit one's last use would normally reuse its bytes
    b = Builder()
    with b.at(fn.body):
        late = b.create("shared_alloc", [], {"bytes": 4096, "offset": -1}, [PointerType(dt.f32, "shared")])
        b.create("load", [late.result])
    fn.body.ops.remove(temp)
    fn.body.ops.append(temp)
    allocate_shared_memory(fn, 1 << 20)
    (explicit,) = [op for op in fn.walk() if op.name == "shared_alloc" and op.attrs.get("whole_kernel")]
    start, end = late.attrs["offset"], late.attrs["offset"] + 4096
    assert end <= explicit.attrs["offset"] or start >= explicit.attrs["offset"] + explicit.attrs["bytes"]


def test_the_swizzle_cuts_the_conflicts_of_a_transposed_read():
    rows = spatial(32, 4) * local(1, 8)          # thread t: row t // 4, 8 contiguous elements (two 16-byte stores)
    cols = (spatial(4, 32) * local(8, 1)).permute((1, 0))   # thread t: row t % 32: a warp reads down a column
    weights = np.array([32, 1])
    write = (rows.table() * weights).sum(-1)     # (threads, registers): element numbers
    read = (cols.table() * weights).sum(-1)
    accesses = [Access(32 * 32, write.reshape(128, 2, 4).transpose(1, 0, 2).reshape(-1, 4)[..., None]),
                Access(32 * 32, read.T.reshape(-1, 1)[..., None])]
    swizzle = choose_swizzle(accesses, tessera.f32, get_target("sm_80").shared_memory_banks, 32, 128)

    def worst_read(layout):
        return max(bank_conflicts(layout, read.T[j, w:w + 32, None, None], 4) for j in range(8)
                   for w in range(0, 128, 32))

    assert worst_read(SmemLayout((1024,), (1,))) == 32
    assert worst_read(SmemLayout((1024,), (1,), swizzle)) <= 4
