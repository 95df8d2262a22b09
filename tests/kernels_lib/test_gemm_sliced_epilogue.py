"""An f32 C of the persistent warp-specialized 128 x 256 GEMM goes out a column block at a time (issue 19).

Specification (`passes/schedule/tma_store.py`, sliced staging): the config's rings (144 KiB) live for the whole
kernel and an overlapped C buffer keeps its own bytes across the tile loop, so a whole 128 x 256 f32 tile
(128 KiB) did not fit (278576 bytes: refused). `thread_passes.lower` now lowers it again with the C staged
through two 128 x 32 slots (16 KiB each): for each 32-column block j, thread 0 waits until at most one bulk
group is still reading (`cp.async.bulk.wait_group.read 1`: the store that last read slot j % 2 has), a
barrier, the consumers' st.shared.v2 pairs of that block into the slot (128B swizzle), fence.proxy.async, a
barrier, thread 0's TMA store of the slot and a commit_group; after the tile loop one wait_group.read 0.

* ptxas (sm_90a) takes the persistent WS 128 x 256 config with an f32 C: 180272 shared bytes (144 KiB of
  rings + 32 KiB of slots + mbarriers) <= 227 KiB, no spills; 8 TMA stores alternating between the two
  slots, each right after a wait_group.read 1 and the st.shared.v2 of its block, then its commit; SASS:
  STS.64 only, 8 UTMASTG.2D and a DEPBAR.LE SB0, 0x1 per block;
* on the SIMT simulator the kernel, several tiles per program over ragged edges, writes what the tile
  interpreter does; dropping a slot's read-wait (within a tile, or the next tile's first block), or the barrier
  after one, is reported as a race;
* asked for (`lower(..., slice_stores=True)`), a one-tile-per-program config slices too: 128 x 128 (4 blocks)
  waits only before the blocks that reuse a slot (2 and 3), then once for all after the last commit, and
  matches the interpreter; without the third block's wait the simulator reports the race;
* a bf16 C slices the same way through stmatrix (two 128 x 64 slots): the config with a 4-stage ring (192 KiB)
  fits only so (229440 bytes, no spills; the whole 64 KiB tile would make 262208), and on the simulator it
  matches the interpreter.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError, run_function
from tessera.backends.simt import run_threads
from tessera.kernels_lib.gemm import CONFIGS, HOPPER_CONFIGS, gemm_kernel
from tessera.passes.thread_passes import lower

from hopper_gemm import NO_EPILOGUE, needs_ptxas, needs_sass
from test_gemm_tma_store import _gemm_args

PERSISTENT_WS_128x256 = [c for c in HOPPER_CONFIGS
                         if c.kwargs["PERSISTENT"] and c.kwargs.get("WS") and c.kwargs["BN"] == 256]
F32_C = "*bf16:16,*bf16:16,*f32:16,*bf16:16,*bf16:16,*f32:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,i32:16,i32:1"
SLOT_BYTES = 128 * 32 * 4
TMA_STORE = re.compile(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.tile\.bulk_group \[%rd\d+, "
                       r"\{%r\d+, %r\d+\}\], \[global_smem\+(\d+)\]")


def _compile(config):
    return gemm_kernel.kernel.compile(signature=F32_C, target="sm_90a", num_warps=config.num_warps,
                                      **NO_EPILOGUE, **config.kwargs)


@pytest.fixture(scope="module")
def compiled():
    needs_ptxas()
    return _compile(PERSISTENT_WS_128x256[0])


def test_the_persistent_ws_128x256_configs_are_the_sliced_ones():
    """hopper3, and hopper7 with CLUSTER_M = 2 (its compile: `test_gemm_tma_store.py`)."""
    assert [c.kwargs.get("CLUSTER_M", 1) for c in PERSISTENT_WS_128x256] == [1, 2]


def test_an_f32_c_fits_beside_the_rings_through_two_column_block_slots(compiled):
    """Before: refused, 'needs 278576 bytes of shared memory, more than the 232448 a block has'."""
    assert compiled.metadata["shared_bytes"] == 147456 + 2 * SLOT_BYTES + 48 <= 227 * 1024
    assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0
    (c_map,) = [m for m in compiled.metadata["tensor_maps"] if m["pointer"] == "c_ptr"]
    assert c_map["box"] == [128, 32] and c_map["swizzle"] == "128B" and c_map["dtype"] == "f32"


def test_each_block_waits_for_its_slots_last_read_then_is_written_fenced_and_stored(compiled):
    lines = compiled.stages["ptx"].splitlines()
    stores = [(i, int(m.group(1))) for i, line in enumerate(lines) if (m := TMA_STORE.search(line))]
    assert len(stores) == 256 // 32 and "st.global" not in compiled.stages["ptx"]
    slots = [offset for _, offset in stores]
    assert slots[0::2] == [slots[0]] * 4 and slots[1::2] == [slots[0] + SLOT_BYTES] * 4
    pairs_per_block = 128 * 256 // (32 * 8) // 2 // 8       # 8 warps: the consumers' pairs of one block
    previous = 0
    for i, _ in stores:
        block = lines[previous:i]
        waits = [k for k, line in enumerate(block) if re.search(r"cp\.async\.bulk\.wait_group\.read\s+1;", line)]
        writes = [k for k, line in enumerate(block) if "st.shared.v2.b32" in line]
        fence = max(k for k, line in enumerate(block) if "fence.proxy.async.shared::cta" in line)
        assert len(waits) == 1 and len(writes) == pairs_per_block and waits[0] < writes[0] < writes[-1] < fence
        assert any("bar.sync" in line for line in block[waits[0]:writes[0]])       # the others wait for thread 0
        assert any("bar.sync" in line for line in block[fence:])
        assert lines[i + 1].strip() == "cp.async.bulk.commit_group;"
        previous = i + 1
    after = "\n".join(lines[stores[-1][0]:])
    assert re.search(r"cp\.async\.bulk\.wait_group\.read\s+0;", after)     # before the block exits


def test_the_sass_writes_c_with_sts64_only_and_waits_per_block(compiled):
    from tessera.backends.nvptx.sass import disassemble
    needs_sass()
    texts = [inst.text for inst in disassemble(compiled.cubin)]
    opcodes = [t.split()[0] for t in texts]
    assert opcodes.count("STS.64") == 128 * 256 // (32 * 8) // 2
    assert not [o for o in opcodes if o.startswith(("STS", "LDS")) and o != "STS.64"]
    assert opcodes.count("UTMASTG.2D") == 8
    assert sum(t.startswith("DEPBAR.LE SB0, 0x1") for t in texts) == 8


# -- on the SIMT simulator ----------------------------------------------------------------------------------

def _lowered(M, N, K, config=PERSISTENT_WS_128x256[0], **options):
    module = gemm_kernel.kernel.specialize(*_gemm_args(M, N, K), **{**NO_EPILOGUE, **config.kwargs}).module
    return module, lower(module, "sm_90a", config.num_warps, **options).functions[0]


def _slot_waits(fn):
    """(block, index) of every `if` in which thread 0 waits for a slot's last read (pending = 1), in order."""
    return [(op.parent, op.parent.ops.index(op)) for op in fn.walk() if op.name == "if"
            and [(o.name, o.attrs.get("pending")) for o in op.regions[0].ops][:1] == [("bulk_wait_group_read", 1)]]


def _assert_simulator_matches_interpreter(module, fn, M, N, K, programs, grid):
    """The lowered kernel `fn` on the SIMT simulator (`programs` programs) writes every element of C, and the
    same C as the interpreter runs the traced `module` to (on `grid` programs)."""
    got = _gemm_args(M, N, K)
    run_threads(fn, got, (programs,))
    want = _gemm_args(M, N, K)
    run_function(module.functions[0], want, (grid,))
    assert not np.isnan(got[5]).any()                          # every element written
    np.testing.assert_allclose(got[5], want[5], rtol=1e-5, atol=1e-4)


def test_a_sliced_f32_c_over_several_ragged_tiles_per_program_is_what_the_interpreter_computes():
    """300 x 400: 3 x 2 tiles of 128 x 256, the last row and column ragged, on 2 programs (3 tiles each)."""
    M, N, K = 300, 400, 64
    module, fn = _lowered(M, N, K)
    names = [op.name for op in fn.walk()]
    assert names.count("tma_store") == 8 and len(_slot_waits(fn)) == 8
    assert sorted(op.attrs["bytes"] for op in fn.walk() if op.name == "shared_alloc" and op.attrs.get("async_reads")) \
        == [2 * SLOT_BYTES]
    _assert_simulator_matches_interpreter(module, fn, M, N, K, programs=2, grid=6)


@pytest.mark.parametrize("change, error", [
    ("drop the third block's wait", r"writes shared byte \d+ .*which a tma_store may still be reading"),
    ("drop the first block's wait", r"writes shared byte \d+ .*which a tma_store may still be reading"),
    ("drop the barrier after the third block's wait", r"thread [1-9]\d* writes shared byte \d+ .*which thread 0 "
                                                      r"read since the last barrier"),
])
def test_rewriting_a_slot_before_its_last_store_has_read_it_is_reported(change, error):
    """128 x 512: two tiles on one program. The third block reuses slot 0 within a tile; the first block of the
    second tile reuses the slot the first tile's seventh block left TMA reading."""
    M, N, K = 128, 512, 64
    _, fn = _lowered(M, N, K)
    block, i = _slot_waits(fn)[0 if "first" in change else 2]
    if change.startswith("drop the barrier"):
        assert block.ops[i + 1].name == "named_barrier"           # the consumers' (the producer warp has left)
        del block.ops[i + 1]
    else:
        del block.ops[i]
    with pytest.raises(InterpreterError, match=error):
        run_threads(fn, _gemm_args(M, N, K), (1,))


def test_a_one_tile_config_sliced_on_request_waits_only_to_reuse_a_slot_and_matches_the_interpreter():
    """config0 (128 x 128, not persistent) at 160 x 144: 2 x 2 programs, the last row and column ragged."""
    M, N, K = 160, 144, 64
    config = CONFIGS[0]
    module, fn = _lowered(M, N, K, config, slice_stores=True)
    assert [op.name for op in fn.walk()].count("tma_store") == 4 and len(_slot_waits(fn)) == 2
    _assert_simulator_matches_interpreter(module, fn, M, N, K, programs=4, grid=4)
    block, i = _slot_waits(fn)[0]                   # the third block's: slot 0, which the first block's store read
    del block.ops[i]
    with pytest.raises(InterpreterError, match=r"writes shared byte \d+ .*which a tma_store may still be reading"):
        run_threads(fn, _gemm_args(M, N, K), (1,))


FOUR_STAGES = dict(PERSISTENT_WS_128x256[0].kwargs, STAGES=4)
BF16_C = "*bf16:16,*bf16:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,i32:16,i32:1"


def test_a_bf16_c_beside_a_4_stage_ring_fits_only_sliced():
    needs_ptxas()
    compiled = gemm_kernel.kernel.compile(signature=BF16_C, target="sm_90a", num_warps=8, **NO_EPILOGUE,
                                          **FOUR_STAGES)
    assert compiled.metadata["shared_bytes"] == 4 * 49152 + 2 * 128 * 64 * 2 + 64 <= 227 * 1024
    assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0
    ptx = compiled.stages["ptx"]
    assert len(re.findall(r"cp\.async\.bulk\.wait_group\.read\s+1;", ptx)) == len(re.findall(
        r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", ptx)) == 256 // 64
    assert ptx.count("stmatrix.sync.aligned.m8n8.x4.shared.b16") == 128 * 256 // (32 * 8) // 8


def test_a_sliced_bf16_c_over_several_tiles_per_program_is_what_the_interpreter_computes():
    """200 x 400: 2 x 2 ragged tiles on one program, C through two 64-column stmatrix slots."""
    from test_gemm_tma_store import _bf16_gemm_args
    from tessera.ir import dtypes as dt
    M, N, K = 200, 400, 64
    module = gemm_kernel.kernel.specialize(*_bf16_gemm_args(M, N, K, typed=True), **NO_EPILOGUE,
                                           **FOUR_STAGES).module
    from tessera.passes.errors import LoweringError
    with pytest.raises(LoweringError, match=r"needs 262208 bytes of shared memory, more than the 232448"):
        lower(module, "sm_90a", 8, slice_stores=False)         # the whole tile beside the 4-stage ring
    fn = lower(module, "sm_90a", 8).functions[0]
    names = [op.name for op in fn.walk()]
    assert names.count("tma_store") == 4 and names.count("stmatrix") == 16 and len(_slot_waits(fn)) == 4
    run = _bf16_gemm_args(M, N, K)
    run_threads(fn, run, (1,))
    got = run[5].array.reshape(M, N)
    want = _bf16_gemm_args(M, N, K)
    run_function(module.functions[0], want, (4,))
    assert (got != 0x7FC0).all()
    np.testing.assert_allclose(dt.bf16.decode(got), dt.bf16.decode(want[5].array.reshape(M, N)), rtol=1e-2, atol=1e-2)
