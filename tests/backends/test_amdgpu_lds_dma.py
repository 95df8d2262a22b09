"""async_copy / async_wait on CDNA3: direct global->LDS loads and vmcnt waits in the AMDGCN, linked, no scratch.

The thread IR is NVIDIA's cp.async kernel shape (two groups, a wait for the first, a barrier, a read); the
assembly must keep the second group in flight across the first read: `s_waitcnt vmcnt(1)` (one copy per
group), and no vmcnt(0) before it, neither from the barrier nor from LLVM's own LDS DMA tracking.
"""

from __future__ import annotations

import re

import pytest

from tessera.backends.amdgpu import CodegenError, compile_thread_ir, find_linker
from tessera.backends.amdgpu.lds_dma import copies_per_group, waitcnt_vmcnt
from tessera.ir.parser import parse_module

needs_linker = pytest.mark.skipif(find_linker() is None, reason="no ld.lld found (pip install ziglang)")

KERNEL = """\
func @stage(%x: ptr<f32>, %out: ptr<f32>, %n: i32) attributes {{num_threads = 128, shared_bytes = {smem}}} {{
  %tid = thread_id : i32
  %width = constant {{value = {elements}}} : i32
  %half = constant {{value = {half}}} : i32
  %t = mul %tid, %width : i32
  %in = cmp %tid, %n {{pred = "lt"}} : bool
  %smem = shared_alloc {{bytes = {smem}, offset = 0}} : ptr<f32, shared>
  %s = addptr %smem, %t : ptr<f32, shared>
  %g = addptr %x, %t : ptr<f32>
  async_copy %s, %g, %in {{bytes = {bytes}}}
  async_commit
  %t2 = add %t, %half : i32
  %s2 = addptr %smem, %t2 : ptr<f32, shared>
  %g2 = addptr %x, %t2 : ptr<f32>
  async_copy %s2, %g2, %in {{bytes = {bytes}}}
  async_commit
  async_wait {{pending = 1}}
  barrier
  %v = load %s : f32
  async_wait {{pending = 0}}
  barrier
  %w = load %s2 : f32
  %r = add %v, %w : f32
  %dst = addptr %out, %tid : ptr<f32>
  store %dst, %r
  return
}}
"""


def kernel(nbytes: int):
    elements = nbytes // 4
    text = KERNEL.format(smem=2 * 128 * nbytes, elements=elements, half=128 * elements, bytes=nbytes)
    return parse_module(text).functions[0]


def body(assembly: str) -> list[str]:
    lines = assembly[assembly.index("stage:"):]
    return [line.strip() for line in lines[:lines.index("s_endpgm")].splitlines() if line.strip()]


@needs_linker
@pytest.mark.parametrize("target, nbytes, instruction", [("gfx942", 4, "global_load_lds_dword"),
                                                         ("gfx950", 4, "global_load_lds_dword"),
                                                         ("gfx950", 16, "global_load_lds_dwordx4")])
def test_copies_are_direct_to_lds_loads_and_the_wait_keeps_the_second_group_in_flight(target, nbytes, instruction):
    artifacts = compile_thread_ir(kernel(nbytes), target, link=True)
    lines = body(artifacts.assembly)
    loads = [i for i, line in enumerate(lines) if line.split()[0] == instruction]
    assert len(loads) == 2
    first_barrier = next(i for i, line in enumerate(lines) if line == "s_barrier")
    first_read = next(i for i, line in enumerate(lines) if line.startswith("ds_read"))
    waits = [line for line in lines[loads[-1]:first_read] if line.startswith("s_waitcnt")]
    assert waits and all("vmcnt(1)" in w for w in waits if "vmcnt" in w), waits   # never vmcnt(0) here
    assert loads[-1] < first_barrier < first_read
    assert any("vmcnt(0)" in line for line in lines[first_read:])                  # the second wait
    assert sum(line.startswith("s_mov_b32 m0") for line in lines) == 2            # each copy's wave base in M0
    assert artifacts.hsaco is not None
    assert artifacts.metadata["private_segment_fixed_size"] == 0 and artifacts.metadata["vgpr_spill_count"] == 0


def test_masked_lanes_copy_zeros_from_the_code_objects_zero_constant():
    artifacts = compile_thread_ir(kernel(4), "gfx942", link=False)
    assert "tessera_lds_dma_zeros@rel32" in artifacts.assembly
    assert re.search(r"v_cndmask_b32", artifacts.assembly)


@pytest.mark.parametrize("target, nbytes, why", [
    ("gfx942", 16, "16 bytes a lane has no direct-to-LDS load on gfx942 \\(it has 4 bytes\\)"),
    ("gfx90a", 4, "needs CDNA3 \\(gfx942, gfx950\\); gfx90a lacks it")])
def test_a_width_or_target_without_lds_dma_is_refused_before_llvm(target, nbytes, why):
    with pytest.raises(CodegenError, match=f"kernel 'stage'.*async_copy.*{why}"):
        compile_thread_ir(kernel(nbytes), target, link=False)


def test_the_wait_counts_the_fewest_copies_of_a_group_and_packs_vmcnt_as_gfx9_does():
    assert copies_per_group(kernel(4)) == 1
    assert waitcnt_vmcnt(0) == 0x0F70 and waitcnt_vmcnt(1) == 0x0F71
    assert waitcnt_vmcnt(17) == 0x0F71 | (1 << 14) and waitcnt_vmcnt(500) == waitcnt_vmcnt(63)


def test_a_copy_a_wave_may_skip_makes_every_wait_wait_for_everything():
    text = KERNEL.format(smem=1024, elements=1, half=128, bytes=4).replace(
        "  async_copy %s2, %g2, %in {bytes = 4}\n",
        "  if %in {\n    async_copy %s2, %g2, %in {bytes = 4}\n    yield\n  } {\n    yield\n  }\n")
    fn = parse_module(text).functions[0]
    assert copies_per_group(fn) == 0
    lines = body(compile_thread_ir(fn, "gfx942", link=False).assembly)
    assert [line for line in lines if "vmcnt" in line and "vmcnt(0)" not in line] == []
