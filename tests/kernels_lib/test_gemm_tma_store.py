"""The library GEMM's epilogue on TMA targets (issue 19): C goes registers -> shared memory -> one TMA store.

Specification (`passes/schedule/tma_store.py`):

* on sm_90a every shipped config stores its bf16 C tile with one cp.async.bulk.tensor ... global.shared::cta ...
  bulk_group per 64-column block (a 128-byte box row, 128B swizzle), after stmatrix x4 of the accumulator's
  registers (no st.shared, no layout conversion through shared memory first: no ld.shared after the K loop),
  fence.proxy.async and a barrier, followed by one commit_group and, in the one-tile-per-program configs, at
  once by wait_group.read 0; no thread stores C to global memory itself; ptxas spills nothing and the shared
  memory (ring + C buffer) fits in 227 KiB;
* the persistent config lets TMA read a tile's C buffer while the next tile's K loop runs: the tile loop's
  one wait_group.read comes before the next tile's stmatrix (then a barrier), none after the commit_group,
  and one more after the tile loop (SASS: DEPBAR.LE SB0 before the STSMs and after the loop, none between
  UTMACMDFLUSH and the back edge); the C buffer has bytes of its own, 131096 bytes in all (96 KiB of ring,
  32 KiB of C), as before; on the SIMT simulator a bf16 C over ragged tiles, several per program, is what
  the interpreter computes, and dropping that wait, placing it after the stmatrix, or dropping the barrier
  after it is reported as a race;
* in the SASS of every shipped config the epilogue's shared stores are BM x BN / (32 x 8 x num_warps) STSM
  (16 bytes a lane each) and nothing else: no STS and no LDS anywhere in the kernel (the accumulator used to
  go through shared memory as f32 first: 32 STS.64 + 16 LDS.128 + 8 STS.128 a thread at 128 x 128);
* sm_90 (mma.sync accumulators) stores C the same way;
* an f32 C (no stmatrix: 32-bit elements) goes the same way with st.shared.v2 of the accumulator's register
  pairs (`pair_store.py`) into a 128B-swizzled tile, one TMA store per 32-column block (box [BM, 32]): in
  every shipped config's PTX BM x BN / (64 x warps) st.shared.v2.b32 a thread, no other st.shared and no
  ld.shared (no layout conversion through shared memory), no spills; in the SASS as many STS.64, no LDS.
  The allocator's shared bytes: the persistent config 163864 (96 KiB of ring + the 64 KiB C tile + 24 of
  mbarriers; 229400 with the conversion's 64 KiB buffer before), config0 98328 before and after (both
  buffers reuse the ring's bytes after the K loop); the persistent warp-specialized 128 x 256 configs, whose
  whole f32 tile does not fit beside their rings, stage it a column block at a time through two 16 KiB
  slots instead (180272 bytes; `test_gemm_sliced_epilogue.py`);
* the kernel's hidden tensor maps, and so what its launcher builds, are exactly A's and B's (read by the K
  loop's TMA loads) and C's (written by the store); where C's rows are not provably 16-byte aligned the
  epilogue keeps the threads' stores and there is no map of C;
* sm_80 keeps the threads' st.global (no TMA there);
* the store clips at the matrix edges: on the SIMT simulator a GEMM whose M and N are not multiples of the
  tile writes what the tile interpreter writes (to f32 rounding of the sums' order), every element of C;
  a bf16 C stored through stmatrix is bit for bit what the threads' st.shared path (the kernel before
  stmatrix: the target without the feature) stores.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.kernels_lib.gemm import CONFIGS, HOPPER_CONFIGS, gemm_kernel
from tessera.passes.thread_passes import lower

from hopper_gemm import NO_EPILOGUE, compile_gemm, needs_ptxas, needs_sass
from tma_maps import launcher_map_uses, maps_by_use

SHIPPED = {**{f"config{i}": c for i, c in enumerate(CONFIGS)}, **{f"hopper{i}": c for i, c in enumerate(HOPPER_CONFIGS)}}
TMA_STORE = r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.tile\.bulk_group \[%rd\d+, \{%r\d+, %r\d+\}\]"


@pytest.mark.parametrize("name", SHIPPED)
def test_sm_90a_stores_c_with_stmatrix_and_a_tma_store_per_column_block_and_no_thread_global_stores(name):
    needs_ptxas()
    config = SHIPPED[name]
    compiled = compile_gemm(config, target="sm_90a")
    ptx = compiled.stages["ptx"]
    stores = [m.start() for m in re.finditer(TMA_STORE, ptx)]
    assert len(stores) == config.kwargs["BN"] // 64                  # one 128-byte-wide box per column block
    assert "st.global" not in ptx
    fence = ptx.rindex("fence.proxy.async.shared::cta", 0, stores[0])
    per_thread = config.kwargs["BM"] * config.kwargs["BN"] // (32 * config.num_warps) // 8
    assert ptx.count("stmatrix.sync.aligned.m8n8.x4.shared.b16") == per_thread
    # the K loop reads shared memory only through wgmma descriptors, so any st/ld.shared would be the
    # epilogue's: none, no conversion through shared memory
    assert "st.shared" not in ptx and "ld.shared" not in ptx
    assert "bar.sync" in ptx[fence:stores[0]]
    commit = ptx.index("cp.async.bulk.commit_group;", stores[-1])
    assert ptx.count("cp.async.bulk.commit_group;") == 1
    following = ptx[commit:].splitlines()[1].strip()
    if config.kwargs["PERSISTENT"]:                 # waited for before the next tile's writes (test below)
        assert not following.startswith("cp.async.bulk.wait_group.read")
    else:                                           # one tile: the program waits for the read at once
        assert re.fullmatch(r"cp\.async\.bulk\.wait_group\.read\s+0;", following)
    assert compiled.metadata["spill_stores"] == 0
    assert compiled.metadata["shared_bytes"] <= 227 * 1024
    assert maps_by_use(ptx, compiled.metadata["tensor_maps"]) == {"load": ["a_ptr", "b_ptr"], "store": ["c_ptr"]}


PERSISTENT = next(name for name, config in SHIPPED.items() if config.kwargs["PERSISTENT"])
READ_WAIT = re.compile(r"cp\.async\.bulk\.wait_group\.read\s+0;")


@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
def test_the_persistent_kernel_waits_for_a_tiles_c_store_only_before_writing_the_next_tiles(target):
    from tessera.backends.nvptx.sass import disassemble, loop_containing
    needs_sass()
    compiled = compile_gemm(SHIPPED[PERSISTENT], target=target)
    lines = compiled.stages["ptx"].splitlines()
    waits = [i for i, line in enumerate(lines) if READ_WAIT.search(line)]
    stmatrix = [i for i, line in enumerate(lines) if "stmatrix" in line]
    commit = next(i for i, line in enumerate(lines) if "cp.async.bulk.commit_group;" in line)
    mma = max(i for i, line in enumerate(lines) if re.search(r"\b(wgmma\.mma_async|mma\.sync)", line))
    assert len(waits) == 2 and mma < waits[0] < stmatrix[0] < commit < waits[1]
    assert any("bar.sync" in line for line in lines[waits[0]:stmatrix[0]])     # the others wait for thread 0's
    code = disassemble(compiled.cubin)
    tiles = loop_containing(code, "HGMMA" if target == "sm_90a" else "HMMA", outermost=True)
    opcodes = [i.text for i in tiles]
    in_loop = [i for i, text in enumerate(opcodes) if text.startswith("DEPBAR.LE SB0")]
    flush = next(i for i, text in enumerate(opcodes) if text.startswith("UTMACMDFLUSH"))
    first_stsm = next(i for i, text in enumerate(opcodes) if text.startswith("STSM"))
    assert len(in_loop) == 1 and in_loop[0] < first_stsm < flush      # nothing waits between the store and the K loop
    after = [i for i in code if i.address > tiles[-1].address]
    assert any(i.text.startswith("DEPBAR.LE SB0") for i in after)       # the last tile's store, before EXIT
    assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0
    # the C buffer's own 32 KiB beside the whole-kernel rings (96 KiB) and the 3 mbarriers: as before, since the
    # rings never shared bytes with it
    assert compiled.metadata["shared_bytes"] == 3 * 32768 + 32768 + 24 <= 227 * 1024


@pytest.mark.parametrize("name", SHIPPED)
def test_the_sass_epilogue_stores_c_with_stmatrix_only(name):
    from tessera.backends.nvptx.sass import disassemble
    needs_sass()
    config = SHIPPED[name]
    compiled = compile_gemm(config, target="sm_90a")
    opcodes = [inst.opcode for inst in disassemble(compiled.cubin)]
    per_thread = config.kwargs["BM"] * config.kwargs["BN"] // (32 * config.num_warps) // 8
    assert opcodes.count("STSM.16.M88.4") == per_thread
    assert not [o for o in opcodes if o.startswith(("STS.", "LDS")) or o == "STS"]
    assert opcodes.count("UTMASTG.2D") == config.kwargs["BN"] // 64
    assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0


@pytest.mark.parametrize("name", ["config0", "config3"])
def test_sm_90_stores_the_mma_sync_accumulator_with_stmatrix_too(name):
    """sm_90 without the `a` features computes with mma.sync: its m16n8 accumulator fragments are the same 8x8
    matrices, so C goes out the same way."""
    needs_ptxas()
    config = SHIPPED[name]
    compiled = compile_gemm(config, target="sm_90")
    ptx = compiled.stages["ptx"]
    per_thread = config.kwargs["BM"] * config.kwargs["BN"] // (32 * config.num_warps) // 8
    assert ptx.count("stmatrix.sync.aligned.m8n8.x4.shared.b16") == per_thread and "st.shared" not in ptx
    assert len(re.findall(TMA_STORE, ptx)) == config.kwargs["BN"] // 64
    assert compiled.metadata["spill_stores"] == 0


def _compile_f32_c(config, target="sm_90a"):
    return gemm_kernel.kernel.compile(signature=F32_C, target=target, num_warps=config.num_warps,
                                      **NO_EPILOGUE, **config.kwargs)


# The persistent warp-specialized 128 x 256 configs keep their rings (144 KiB) for the whole kernel and an
# overlapped C buffer its own bytes across the tile loop: a whole f32 C tile (128 KiB) does not fit beside them
# (278576 bytes: refused until the sliced staging). Their C goes out a column block at a time through two
# 128 x 32 slots instead (`test_gemm_sliced_epilogue.py`: the schedule, SASS and simulator checks); the
# whole-tile facts below are the other configs'.
F32_C_SLICED = {name for name, config in SHIPPED.items()
                if config.kwargs["PERSISTENT"] and config.kwargs.get("WS") and config.kwargs["BN"] == 256}
F32_C_CONFIGS = [name for name in SHIPPED if name not in F32_C_SLICED]


@pytest.mark.parametrize("name", sorted(F32_C_SLICED))
def test_an_f32_c_of_the_persistent_ws_128x256_config_fits_through_two_column_block_slots(name):
    """Before: 'needs 278576 bytes of shared memory, more than the 232448 a block has'. Now the rings, two
    16 KiB slots and the mbarriers; a TMA store per 32-column block, each slot rewritten only after a read-wait
    leaves at most the other slot's store reading."""
    needs_ptxas()
    compiled = _compile_f32_c(SHIPPED[name])
    assert compiled.metadata["shared_bytes"] == 147456 + 2 * 128 * 32 * 4 + 48 <= 227 * 1024
    assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0
    ptx = compiled.stages["ptx"]
    assert len(re.findall(TMA_STORE, ptx)) == len(re.findall(r"cp\.async\.bulk\.wait_group\.read\s+1;", ptx)) == 8


@pytest.mark.parametrize("name", F32_C_CONFIGS)
def test_an_f32_c_is_stored_by_register_pairs_into_a_swizzled_tile_and_a_tma_store_per_32_columns(name):
    needs_ptxas()
    config = SHIPPED[name]
    compiled = _compile_f32_c(config)
    ptx = compiled.stages["ptx"]
    stores = [m.start() for m in re.finditer(TMA_STORE, ptx)]
    assert len(stores) == config.kwargs["BN"] // 32 and "stmatrix" not in ptx and "st.global" not in ptx
    fence = ptx.rindex("fence.proxy.async.shared::cta", 0, stores[0])
    pairs = config.kwargs["BM"] * config.kwargs["BN"] // (32 * config.num_warps) // 2
    assert len(re.findall(r"st\.shared\.v2\.b32", ptx[:fence])) == len(re.findall(r"st\.shared", ptx)) == pairs
    assert "ld.shared" not in ptx                    # no conversion of the accumulator through shared memory
    (c_map,) = [m for m in compiled.metadata["tensor_maps"] if m["pointer"] == "c_ptr"]
    assert c_map["box"] == [config.kwargs["BM"], 32] and c_map["swizzle"] == "128B" and c_map["dtype"] == "f32"
    assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0
    assert compiled.metadata["shared_bytes"] <= 227 * 1024


@pytest.mark.parametrize("name, shared_bytes", [("config0", 3 * 32768 + 24), (PERSISTENT, 3 * 32768 + 65536 + 24)])
def test_an_f32_c_allocates_no_conversion_buffer(name, shared_bytes):
    """Before: the persistent config took 229400 bytes (its own 64 KiB C tile beside a 64 KiB conversion
    buffer); config0's conversion and C tile reused the ring's bytes (98328 either way)."""
    needs_ptxas()
    config = SHIPPED[name]
    args = _gemm_args(160, 144, 64)
    module = gemm_kernel.kernel.specialize(*args, **{**NO_EPILOGUE, **config.kwargs}).module
    fn = lower(module, "sm_90a", config.num_warps).functions[0]
    tile = config.kwargs["BM"] * config.kwargs["BN"] * 4
    buffers = sorted(op.attrs["bytes"] for op in fn.walk() if op.name == "shared_alloc")
    assert buffers.count(tile) == 1              # the C tile; no conversion buffer (a row-major f32 tile, as big)
    assert [op.name for op in fn.walk()].count("tma_store") == config.kwargs["BN"] // 32
    assert _compile_f32_c(config).metadata["shared_bytes"] == shared_bytes


@pytest.mark.parametrize("name", ["config0", PERSISTENT, "hopper0"])
def test_the_sass_of_an_f32_c_epilogue_is_sts64_only(name):
    from tessera.backends.nvptx.sass import disassemble
    needs_sass()
    config = SHIPPED[name]
    compiled = _compile_f32_c(config)
    opcodes = [inst.opcode for inst in disassemble(compiled.cubin)]
    pairs = config.kwargs["BM"] * config.kwargs["BN"] // (32 * config.num_warps) // 2
    assert opcodes.count("STS.64") == pairs
    assert not [o for o in opcodes if o.startswith(("STS", "LDS")) and o != "STS.64"]
    assert opcodes.count("UTMASTG.2D") == config.kwargs["BN"] // 32


@pytest.mark.parametrize("name", ["config0", "config3"])
def test_sm_90_stores_an_f32_mma_sync_accumulator_by_pairs_too(name):
    needs_ptxas()
    config = SHIPPED[name]
    ptx = _compile_f32_c(config, target="sm_90").stages["ptx"]
    pairs = config.kwargs["BM"] * config.kwargs["BN"] // (32 * config.num_warps) // 2
    assert len(re.findall(r"st\.shared\.v2\.b32", ptx)) == pairs and "ld.shared" not in ptx
    assert len(re.findall(TMA_STORE, ptx)) == config.kwargs["BN"] // 32


F32_C = "*bf16:16,*bf16:16,*f32:16,*bf16:16,*bf16:16,*f32:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,i32:16,i32:1"


# B stored transposed ([N, K], rows of K elements), so B's rows stay 16-byte aligned when N is not
UNALIGNED_N = "*bf16:16,*bf16:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,i32:16,i32,i32:16,f32,i32:16,i32:1,i32:1,i32:16"


def test_the_launcher_builds_the_maps_of_the_tma_loads_and_of_c_only_when_c_is_stored_by_tma():
    """What `test_gemm_tma_on_gpu.py` checks of the launchers on a GPU, here on launchers built (not loaded)
    from CPU compiles: N a multiple of 16 gives A's, B's and C's maps; N of unknown alignment leaves C to
    the threads' stores (its rows may not start 16-byte aligned, which TMA needs), so only A's and B's."""
    from tessera.dsl.gpu_launch import launch_parameters
    from tessera.ir import dtypes as dt
    from tessera.ir.types import PointerType, ScalarType
    from tessera.runtime.launcher import Launcher

    needs_ptxas()
    aligned = compile_gemm(CONFIGS[0], target="sm_90a", b_layout="b-transposed")
    unaligned = gemm_kernel.kernel.compile(signature=UNALIGNED_N, target="sm_90a", num_warps=CONFIGS[0].num_warps,
                                           **NO_EPILOGUE, **CONFIGS[0].kwargs)
    uses = []
    for compiled in (aligned, unaligned):
        names = ["a_ptr", "b_ptr", "bias_ptr", "scale_a_ptr", "scale_b_ptr", "c_ptr", "M", "N", "K", "alpha",
                 "stride_am", "stride_ak", "stride_bk", "stride_bn"]
        params = ([PointerType(t) for t in (dt.bf16, dt.bf16, dt.f32, dt.bf16, dt.bf16, dt.bf16)]
                  + [ScalarType(dt.i32)] * 3 + [ScalarType(dt.f32)] + [ScalarType(dt.i32)] * 4)
        types, names, recipes = launch_parameters(params, names, compiled.metadata)
        uses.append(launcher_map_uses(Launcher(compiled, types, backend=None, names=names, tensor_maps=recipes)))
    assert uses == [{"load": ["a_ptr", "b_ptr"], "store": ["c_ptr"]}, {"load": ["a_ptr", "b_ptr"], "store": []}]
    assert "st.global" in unaligned.stages["ptx"]


def test_sm_80_keeps_the_threads_global_stores():
    compiled = compile_gemm(CONFIGS[0], target="sm_80")
    ptx = compiled.stages["ptx"]
    assert "st.global" in ptx and "cp.async.bulk" not in ptx


def _gemm_args(M, N, K, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    unused = np.zeros(1, np.float32)
    c = np.full((M, N), np.nan, np.float32)
    return [a, b, unused, unused, unused, c, M, N, K, 1.0, K, 1, N, 1]


@pytest.mark.parametrize("name, M, N, K", [("config3", 160, 96, 64), ("config0", 192, 160, 128),
                                           ("config5", 320, 144, 64), ("hopper0", 160, 272, 64)])
def test_a_gemm_with_ragged_m_and_n_stores_what_the_interpreter_stores_on_the_simt_simulator(name, M, N, K):
    config = SHIPPED[name]
    bm, bn = config.kwargs["BM"], config.kwargs["BN"]
    assert M % bm and N % bn                         # the last row and column of tiles hang over the edges
    args = _gemm_args(M, N, K)
    module = gemm_kernel.kernel.specialize(*args, **{**NO_EPILOGUE, **config.kwargs}).module
    fn = lower(module, "sm_90a", config.num_warps).functions[0]
    assert [op.name for op in fn.walk()].count("tma_store") == bn // 32          # f32 C: a box per 32 columns
    tiles = -(-M // bm) * -(-N // bn)
    run_threads(fn, args, (min(tiles, 2),) if config.kwargs["PERSISTENT"] else (tiles,))
    want = _gemm_args(M, N, K)
    run_function(module.functions[0], want, (tiles,))
    assert not np.isnan(args[5]).any()               # every element written
    # the same sums, in the tensor cores' order on the simulator and the interpreter's: f32 rounding apart
    np.testing.assert_allclose(args[5], want[5], rtol=1e-5, atol=1e-4)



def _bf16_gemm_args(M, N, K, seed=0, typed=False):
    """The GEMM's arguments with bf16 A, B and C as the interpreter and simulator take them (`Memory`s of bit
    patterns), or as `specialize` reads their dtype (`typed`)."""
    from tessera.backends.interp.storage import Memory
    from tessera.dsl.arguments import TypedArray
    from tessera.ir import dtypes as dt
    rng = np.random.default_rng(seed)
    a = dt.bf16.encode(rng.standard_normal((M, K)).astype(np.float32))
    b = dt.bf16.encode(rng.standard_normal((K, N)).astype(np.float32))
    unused = np.zeros(1, np.float32)
    c = np.full((M, N), 0x7FC0, np.uint16)                      # bf16 NaN: what no element of C may keep
    a, b, c = ((TypedArray if typed else Memory)(x, dt.bf16) for x in (a, b, c))
    return [a, b, unused, unused, unused, c, M, N, K, 1.0, K, 1, N, 1]


@pytest.mark.parametrize("name", ["config0", "config5"])
def test_a_bf16_c_stored_through_stmatrix_is_bit_for_bit_the_threads_shared_stores_on_the_simt_simulator(name):
    """config0 (128 x 128, 8 warps) and config5 (the persistent one) at M = 160, N = 144 (ragged in both: the
    last column block's second box lies wholly outside C), against the same kernel lowered for an sm_90a
    without stmatrix (the row-major st.shared tile of the kernel before it) and against the tile interpreter."""
    import dataclasses

    from tessera.ir import dtypes as dt
    from tessera.ir.target import get_target
    config, (M, N, K) = SHIPPED[name], (160, 144, 64)
    bm, bn = config.kwargs["BM"], config.kwargs["BN"]
    module = gemm_kernel.kernel.specialize(*_bf16_gemm_args(M, N, K, typed=True),
                                           **{**NO_EPILOGUE, **config.kwargs}).module
    tiles = -(-M // bm) * -(-N // bn)
    grid = (min(tiles, 2),) if config.kwargs["PERSISTENT"] else (tiles,)
    sm_90a = get_target("sm_90a")
    results = []
    for target in (sm_90a, dataclasses.replace(sm_90a, features=sm_90a.features - {"stmatrix"})):
        fn = lower(module, target, config.num_warps).functions[0]
        names = [op.name for op in fn.walk()]
        assert ("stmatrix" in names) == (target is sm_90a)
        assert names.count("tma_store") == (bn // 64 if target is sm_90a else 1)
        run = _bf16_gemm_args(M, N, K)
        run_threads(fn, run, grid)
        results.append(run[5].array.reshape(M, N))
    assert (results[0] != 0x7FC0).all()                       # every element written
    np.testing.assert_array_equal(results[0], results[1])
    want = _bf16_gemm_args(M, N, K)
    run_function(module.functions[0], want, (tiles,))
    np.testing.assert_allclose(dt.bf16.decode(results[0]), dt.bf16.decode(want[5].array.reshape(M, N)),
                               rtol=1e-2, atol=1e-2)


# -- the persistent kernel's store overlapped with the next tile (its schedule on the simulator) -------------

def _lowered_persistent_bf16(M, N, K):
    """(the persistent config lowered for sm_90a with a bf16 C, the tile module, its tile loop)."""
    config = SHIPPED[PERSISTENT]
    module = gemm_kernel.kernel.specialize(*_bf16_gemm_args(M, N, K, typed=True),
                                           **{**NO_EPILOGUE, **config.kwargs}).module
    fn = lower(module, "sm_90a", config.num_warps).functions[0]
    tiles = next(op for op in fn.body.ops if op.name == "for")
    return fn, module, tiles


def _read_wait(tiles):
    """Index in the tile loop's body of the `if` in which thread 0 waits for the last tile's store to read C."""
    ops = tiles.regions[0].ops
    return next(i for i, op in enumerate(ops) if op.name == "if"
                and [o.name for o in op.regions[0].ops] == ["bulk_wait_group_read", "yield"])


def test_the_persistent_kernel_stores_c_while_the_next_tile_runs_as_the_interpreter_on_the_simt_simulator():
    """300 x 272: 3 x 3 tiles, the last row and column of them ragged, on 2 programs (5 and 4 tiles each)."""
    from tessera.ir import dtypes as dt
    M, N, K = 300, 272, 96
    fn, module, tiles = _lowered_persistent_bf16(M, N, K)
    body = tiles.regions[0].ops
    wait = _read_wait(tiles)
    store = next(i for i, op in enumerate(body) if any(o.name == "tma_store" for o in op.walk()))
    first_write = next(i for i, op in enumerate(body) if op.name == "stmatrix")
    assert body[wait + 1].name == "barrier" and wait < first_write < store
    assert not any(o.name == "bulk_wait_group_read" for o in body[store].walk())      # the store does not wait
    after = fn.body.ops[fn.body.ops.index(tiles) + 1:]
    assert any(o.name == "bulk_wait_group_read" for op in after for o in op.walk())
    staging = [op for op in fn.walk() if op.name == "shared_alloc" and op.attrs.get("async_reads")]
    assert len(staging) == 1 and staging[0].parent is fn.body                      # its bytes span the tile loop
    run = _bf16_gemm_args(M, N, K)
    run_threads(fn, run, (2,))
    got = run[5].array.reshape(M, N)
    assert (got != 0x7FC0).all()
    want = _bf16_gemm_args(M, N, K)
    run_function(module.functions[0], want, (9,))
    np.testing.assert_allclose(dt.bf16.decode(got), dt.bf16.decode(want[5].array.reshape(M, N)), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("change, error", [
    ("drop the wait", r"writes shared byte \d+ .*which a tma_store may still be reading"),
    ("wait after the writes", r"writes shared byte \d+ .*which a tma_store may still be reading"),
    ("drop the barrier after the wait", r"thread [1-9]\d* writes shared byte \d+ .*which thread 0 read since the "
                                        r"last barrier"),
])
def test_a_persistent_tile_rewriting_c_before_the_last_store_has_read_it_is_reported(change, error):
    from tessera.backends.interp import InterpreterError
    M, N, K = 256, 256, 64                           # 4 tiles on one program: the second tile's C rewrites the first's
    fn, _, tiles = _lowered_persistent_bf16(M, N, K)
    body = tiles.regions[0].ops
    wait = _read_wait(tiles)
    if change == "drop the barrier after the wait":
        del body[wait + 1]
    else:
        op = body.pop(wait)
        if change == "wait after the writes":
            body.insert(max(i for i, o in enumerate(body) if o.name == "stmatrix") + 1, op)
    with pytest.raises(InterpreterError, match=error):
        run_threads(fn, _bf16_gemm_args(M, N, K), (1,))
