"""A bandwidth model of paged decode attention: what a plan and a split count cost on a GPU, in microseconds.

`modelled(shape, plan, splits, in_launch)` prices one `attention_decode`
call as the split kernel (the slowest of HBM and the busiest SM's stream,
after the dependent loads that start each program) plus the merge of the
splits, plus a fixed cost per call in a CUDA graph. `plan_for` picks the
split count, and where the splits are merged, that the model times fastest;
the op uses it on a GPU (`num_splits=0`, $TESSERA_DECODE_SEPARATE_COMBINE
unset), with that GPU's row of `gpus.py` (HBM bandwidth and peak, SM count,
one SM's fill rate, DRAM latency, the shared memory an SM holds rings in);
the rest below was fitted on an H100 SXM (sm_90a SASS, its clock) and is
carried to other GPUs as is.

An SM streams at the least of:
* its resident programs' bytes in flight over DRAM latency (Little's law:
  (stages - 1) ring slots of K and V each);
* its shared memory: every block of K and V is written once by cp.async
  and read once by ldmatrix per warp that walks it (times the bank
  conflicts of those reads), 128 bytes a clock;
* its programs' loops: a warp's step (one block of keys) issues
  `step_instructions` (fitted to the sm_90a SASS of the decode loop: a
  fixed part, ~3 per mma.sync, ~13 per cp.async of 16 bytes a lane, whose
  address and bounds each warp computes), one every CLOCKS_PER_INSTRUCTION
  for a lone warp, and the SM's four schedulers issue at most four a clock;
* SM_GBPS, what one SM's fills reach whatever is in flight.

The merge (`merge_splits` in attention_split_kv.py) reads every split's
partial rows once, `merge_chunk` splits a step (one round trip; the first
step's loads go out with the reference max's). Two ways:
* two launches: the combine kernel, one packed row a program over 4 warps
  (a step holds all 64 splits at head dim 128): LAUNCH_US, then the steps'
  round trips (one);
* in the split launch: the last program of each row group to count itself
  in (one acquire-release atomic, a round trip) merges its rows' splits; no
  launch, but one program (one warp in the shipped head-dim-128 plan) reads
  them all: 1 + steps round trips, steps ~ splits / 8 at 4 packed rows.
  It breaks even with the combine kernel where steps round trips cost
  LAUNCH_US: at ~37 splits (B = 1) that is a round trip of 1.3 / 5 = 0.26
  us, at 5 splits (B = 8, one step) any.

Constants and where they come from:
* LAUNCH_US = 1.3: one more kernel in a CUDA graph, from
  bench/results/2026-11-26-h100-run8 (fusion, "horizontal": 8 launches of
  small elementwise kernels in a graph 10.79 us against 1.83 us for one,
  and 11.93 against 2.37: 1.28 and 1.37 us per launch);
* ROUND_TRIP_US = LATENCY_US (0.8, DRAM under load, fitted on run 7 by
  `gemm_split_k`): the partials are L2 hits, so this is an upper bound, and
  the model's only measured latency;
* FIXED_US = 2.4: run 9 (B = 1, 32 query heads on 8 KV heads, D = 128, pages
  of 64, bf16; its plan of 4 warps repeating one 16-row tile, 64-key blocks
  read 8-way bank-conflicted) measured 28.2 us at context 4096 and 89.1 us at
  16384 with the old combine kernel (one query row a program, two dependent
  round trips). Those two rows fixed the split kernel's fixed cost plus the
  combine's at 5.3 us (with the clock); the combine's share is LAUNCH_US + 2
  ROUND_TRIP_US = 2.9 us, which leaves 2.4 us for the split kernel's launch,
  ramp and tail. (The old model split the 5.3 us as 3.0 + 2.3 by guess.)
* CHAIN_LOADS x LATENCY_US: the dependent loads that start each program:
  the sequence's length, then its block-table entry of the split's first
  block (the split's first block is cdiv(length, blocks) away: it needs the
  length), then that block. Not hoistable without guessing the length: every
  later table entry is loaded inside the pipeline, a stage ahead, and K's and
  V's loads of a block issue together.
A lone warp's issue rate (CLOCKS_PER_INSTRUCTION) is a guess no run has
checked; bench/attention.py prints the model beside each measured decode row
(both merges, side by side) so the next GPU session does. Ratios between
plans are what it is for.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from . import gpus

REFERENCE = gpus.H100_SXM       # the GPU a model given none prices plans on (the one its constants were fitted on)
HBM_PEAK_GBPS = REFERENCE.hbm_peak_gbps     # what "% of HBM" divides by (bench/attention.py's peak)
HBM_GBPS, LATENCY_US, SM_GBPS = REFERENCE.hbm_gbps, REFERENCE.latency_us, REFERENCE.sm_gbps
NUM_SMS = REFERENCE.sms
SHARED_PER_SM = REFERENCE.shared_per_sm     # a program's ring: as many as fit
REGISTERS_PER_SM = 65536
REGISTERS_PER_THREAD = 256      # the decode kernels use 240-255 (ptxas, every shipped tile)
PROGRAMS_PER_SM = 32
SMEM_GBPS = 128 * 1.665         # shared memory: 128 bytes a clock at the loaded clock
CLOCK_GHZ = 1.665               # the loaded clock (fitted with SMEM_GBPS: run 9)
STEP_BASE, PER_HMMA, PER_CP_ASYNC = 211, 3.1, 12.8   # a warp's loop instructions a step (sm_90a SASS, D = 128)
CLOCKS_PER_INSTRUCTION = 2.0    # a lone warp's issue rate through its dependent chains (estimate, not measured)
CHAIN_LOADS = 3                 # dependent DRAM reads before a program's first block lands: length, table, block
LAUNCH_US = 1.3                 # one more kernel in a CUDA graph (run 8: 8 small launches against 1)
ROUND_TRIP_US = LATENCY_US      # a merge step's loads of the partials (L2 hits: DRAM's loaded latency as a bound)
FIXED_US = 2.4                  # a call in a graph: the split kernel's launch, ramp and tail (run 9, see above)
MAX_SPLITS = 64                 # the merge's widest reference-max tile (attention_decode.MAX_SPLITS)
MERGE_REGISTERS = 144           # float32 registers a thread of the split kernel gives the merge (`merge_chunk`)
MERGE_MOST = 16                 # ... and at most this many splits a step (its loads unrolled: more spilled at D = 64)
COMBINE_WARPS = 4               # the combine kernel's programs (one packed row each)
COMBINE_REGISTERS = 72          # ... and what each thread gives the merge: at head dim 128, all 64 splits a step


class Decode(NamedTuple):
    """The sizes the model needs of a decode call (`attention_decode.DecodeShape` has them)."""

    B: int
    H: int
    H_kv: int
    D: int
    context: int                # keys per sequence (every sequence this long)
    Sq: int = 1
    element_bytes: int = 2


class Tile(NamedTuple):
    """A launch's tile: packed rows per program, keys per step, ring slots, warps, and how many warps read
    each K/V block from shared memory (all of them: each walks every key of the block), times the reads' bank
    conflicts (1: conflict-free); the registers a thread gives the merge in the launch, and whether it may."""

    rows: int
    keys: int
    stages: int
    warps: int
    conflicts: int = 1
    merge_registers: int = MERGE_REGISTERS
    in_launch: bool = True      # whether the split launch may merge (the plan's tile has the registers for it)
    merge_early: bool = True    # ... with the first step's loads issued with the max's


class Cost(NamedTuple):
    """The model's microseconds for one call, and the bytes it counts."""

    hbm: float              # K, V and the partials through HBM
    sm: float               # the busiest SM's stream
    chain: float            # dependent loads before the first block
    combine: float          # the merge of the splits, in the launch or by the combine kernel (0 with one split)
    moved: int              # the cache's bytes plus q and O: what the benchmark divides by
    peak_gbps: float = HBM_PEAK_GBPS    # the GPU's HBM peak, what `hbm_share` divides by

    @property
    def total(self) -> float:
        return FIXED_US + self.chain + max(self.hbm, self.sm) + self.combine

    @property
    def hbm_share(self) -> float:
        """The benchmark's figure: moved bytes per second over the HBM peak."""
        return self.moved / (self.total * 1e3) / self.peak_gbps


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def merge_chunk(packed: int, D: int, rows: int, warps: int, splits: int, registers: int, most: int = MAX_SPLITS) -> int:
    """Splits `merge_splits` adds per step for a program of `rows` packed rows of which `packed` exist: as many
    as fit `registers` float32 registers a thread beside the running sum, so that one step's loads (one round
    trip to L2) are in flight together; a power of two, at most the splits' padded count. (The plans' budgets
    are ptxas's: tests/kernels_lib/test_attention_compile.py compiles every tile at the most splits without
    spills.)"""
    per_split = min(rows, _next_power_of_2(packed)) * D / (32 * warps)          # a thread's share of a split
    fit = max(1, min(int((registers - per_split) // per_split), most))
    return min(1 << (fit.bit_length() - 1), _next_power_of_2(splits))


def merge_us(d: Decode, tile: Tile, splits: int, in_launch: bool, gpu: gpus.Gpu = REFERENCE) -> float:
    """The merge's microseconds after the split loop on `gpu` (its bytes are counted with HBM's; a round trip
    is the GPU's DRAM latency, ROUND_TRIP_US on the reference): see the module docstring."""
    round_trip = gpu.latency_us
    if splits == 1:
        return 0.0
    packed = d.H // d.H_kv * d.Sq
    if in_launch:
        steps = _cdiv(splits, merge_chunk(packed, d.D, tile.rows, tile.warps, splits, tile.merge_registers,
                                          MERGE_MOST))
        # the counter's atomic, the steps (the max's loads with the first, or a round trip of their own)
        return (1 + steps + (0 if tile.merge_early else 1)) * round_trip
    steps = _cdiv(splits, merge_chunk(packed, d.D, 1, COMBINE_WARPS, splits, COMBINE_REGISTERS))
    return LAUNCH_US + steps * round_trip


def step_instructions(d: Decode, tile: Tile) -> float:
    """SASS instructions one warp issues per step of the key loop: both products over its 16 rows (m16n8k16)
    and its share of the block's 16-byte cp.async copies (tests/kernels_lib/test_attention_decode_model.py
    checks the shipped tiles' counts against it)."""
    hmma = 2 * MMA_M * tile.keys * d.D // (16 * 8 * 16)
    copies = 2 * tile.keys * d.D * d.element_bytes // (16 * 32 * tile.warps)
    return STEP_BASE + PER_HMMA * hmma + PER_CP_ASYNC * copies


MMA_M = 16


def modelled(d: Decode, tile: Tile, splits: int, num_sms: int = NUM_SMS, in_launch: bool = False,
             gpu: gpus.Gpu = REFERENCE) -> Cost:
    """The model's cost of one call with `tile` and `splits` on `gpu` (`num_sms` of them), the splits merged in
    the split launch or by the combine kernel (see the module docstring)."""
    G = d.H // d.H_kv
    row_tiles = _cdiv(G * d.Sq, tile.rows)
    block = 2 * tile.keys * d.D * d.element_bytes                       # K and V of one step
    blocks = _cdiv(_cdiv(d.context, tile.keys), splits)                 # steps per program
    programs = d.B * d.H_kv * row_tiles * splits
    per_sm = _cdiv(programs, num_sms)
    resident = min(PROGRAMS_PER_SM, gpu.shared_per_sm // (tile.stages * block),
                   REGISTERS_PER_SM // (REGISTERS_PER_THREAD * 32 * tile.warps), per_sm)
    in_flight = resident * max(tile.stages - 1, 1) * block
    shared = SMEM_GBPS / (1 + tile.warps * tile.conflicts)              # written once, read by every warp
    instructions = step_instructions(d, tile)
    loop = resident * block / (instructions * CLOCKS_PER_INSTRUCTION / CLOCK_GHZ)
    issue = 4 * CLOCK_GHZ * block / (tile.warps * instructions)
    rate = min(gpu.sm_gbps, in_flight / (gpu.latency_us * 1e3), shared, loop, issue)  # GB/s of K, V into an SM
    partials = 0 if splits == 1 else splits * d.B * d.Sq * d.H * (d.D + 1) * 4
    cache = 2 * d.B * d.context * d.H_kv * d.D * d.element_bytes
    return Cost(hbm=(cache * row_tiles + partials) / (gpu.hbm_gbps * 1e3),
                sm=per_sm * blocks * block / (rate * 1e3),
                chain=CHAIN_LOADS * gpu.latency_us,
                combine=merge_us(d, tile, splits, in_launch, gpu) + (partials / (gpu.hbm_gbps * 1e3)
                                                                     if splits > 1 else 0),
                moved=cache + 2 * d.B * d.Sq * d.H * d.D * d.element_bytes, peak_gbps=gpu.hbm_peak_gbps)


@functools.lru_cache(maxsize=1024)
def plan_for(d: Decode, tile: Tile, num_sms: int = NUM_SMS, in_launch: bool | None = None,
             gpu: gpus.Gpu = REFERENCE) -> tuple[int, bool]:
    """(splits, whether the split launch merges them) the model times fastest on `gpu`: the split count 1 .. MAX_SPLITS
    (no more than the key blocks) and the merge (`in_launch`: only that one; none in the launch where the tile
    may not); the fewest splits among those
    within 2% of the best (fewer partials to write and merge for the same time), in the launch on a tie.
    Remembered per shape: the op asks on every call, and the search costs ~1 ms of host time."""
    most = max(1, min(MAX_SPLITS, _cdiv(d.context, tile.keys)))
    merges = ((True, False) if in_launch is None else (in_launch,)) if tile.in_launch else (False,)
    costs = {(s, m): modelled(d, tile, s, num_sms, m, gpu).total for s in range(1, most + 1) for m in merges}
    best = min(costs.values())
    splits, two_launches = min((s, not m) for (s, m), t in costs.items() if t <= best * 1.02)
    return splits, not two_launches


def splits_for(d: Decode, tile: Tile, num_sms: int = NUM_SMS, in_launch: bool | None = None,
               gpu: gpus.Gpu = REFERENCE) -> int:
    """The split count of `plan_for`."""
    return plan_for(d, tile, num_sms, in_launch, gpu)[0]
