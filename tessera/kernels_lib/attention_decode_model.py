"""A bandwidth model of paged decode attention on an H100 SXM: what a plan and a split count cost, in microseconds.

`modelled(shape, plan, splits)` prices one `attention_decode` call as the
split kernel (the slowest of HBM and the busiest SM's stream, after the
dependent loads that start each program) plus the combine kernel, plus a
fixed cost per call in a CUDA graph. `splits_for` picks the split count the
model times fastest; the op uses it on a GPU (`num_splits=0`).

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

Checked against bench/results/2026-11-26-h100-run9 (B = 1, 32 query heads on
8 KV heads, D = 128, pages of 64, bf16): the run's plan (4 warps repeating
one 16-row tile, 64-key blocks read 8-way bank-conflicted) models 28.2 us at
context 4096 and 89.1 us at 16384 (measured 28.2 and 89.1: FIXED_US +
COMBINE_US and the clock were fitted to those two rows; the other constants
are the card's, shared with `gemm_split_k`'s small-M model, or read off the
SASS). A lone warp's issue rate (CLOCKS_PER_INSTRUCTION) is a guess no run
has checked; bench/attention.py prints the model beside each measured decode
row so the next GPU session does. Ratios between plans are what it is for.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from .gemm_split_k import HBM_GBPS, LATENCY_US, SM_GBPS

HBM_PEAK_GBPS = 3350            # the H100 SXM's HBM3, what "% of HBM" divides by (bench/attention.py's peak)
NUM_SMS = 132
SHARED_PER_SM = 227 * 1024      # a program's ring: as many as fit
REGISTERS_PER_SM = 65536
REGISTERS_PER_THREAD = 256      # the decode kernels use 240-255 (ptxas, every shipped tile)
PROGRAMS_PER_SM = 32
SMEM_GBPS = 128 * 1.665         # shared memory: 128 bytes a clock at the loaded clock
CLOCK_GHZ = 1.665               # the loaded clock (fitted with SMEM_GBPS: run 9)
STEP_BASE, PER_HMMA, PER_CP_ASYNC = 211, 3.1, 12.8   # a warp's loop instructions a step (sm_90a SASS, D = 128)
CLOCKS_PER_INSTRUCTION = 2.0    # a lone warp's issue rate through its dependent chains (estimate, not measured)
CHAIN_LOADS = 3                 # dependent DRAM reads before a program's first block lands: length, table, block
FIXED_US = 3.0                  # a call in a graph: the split kernel's launch and ramp, its tail (fitted, run 9)
COMBINE_US = 2.3                # the combine kernel's launch after the split kernel and its dependent reads (fitted)
MAX_SPLITS = 64                 # the combine kernel's widest tile (attention_decode.MAX_SPLITS)


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
    conflicts (1: conflict-free)."""

    rows: int
    keys: int
    stages: int
    warps: int
    conflicts: int = 1


class Cost(NamedTuple):
    """The model's microseconds for one call, and the bytes it counts."""

    hbm: float              # K, V and the partials through HBM
    sm: float               # the busiest SM's stream
    chain: float            # dependent loads before the first block
    combine: float          # the combine kernel (0 with one split)
    moved: int              # the cache's bytes plus q and O: what the benchmark divides by

    @property
    def total(self) -> float:
        return FIXED_US + self.chain + max(self.hbm, self.sm) + self.combine

    @property
    def hbm_share(self) -> float:
        """The benchmark's figure: moved bytes per second over the HBM peak."""
        return self.moved / (self.total * 1e3) / HBM_PEAK_GBPS


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def step_instructions(d: Decode, tile: Tile) -> float:
    """SASS instructions one warp issues per step of the key loop: both products over its 16 rows (m16n8k16)
    and its share of the block's 16-byte cp.async copies (tests/kernels_lib/test_attention_decode_model.py
    checks the shipped tiles' counts against it)."""
    hmma = 2 * MMA_M * tile.keys * d.D // (16 * 8 * 16)
    copies = 2 * tile.keys * d.D * d.element_bytes // (16 * 32 * tile.warps)
    return STEP_BASE + PER_HMMA * hmma + PER_CP_ASYNC * copies


MMA_M = 16


def modelled(d: Decode, tile: Tile, splits: int, num_sms: int = NUM_SMS) -> Cost:
    """The model's cost of one call with `tile` and `splits` (see the module docstring)."""
    G = d.H // d.H_kv
    row_tiles = _cdiv(G * d.Sq, tile.rows)
    block = 2 * tile.keys * d.D * d.element_bytes                       # K and V of one step
    blocks = _cdiv(_cdiv(d.context, tile.keys), splits)                 # steps per program
    programs = d.B * d.H_kv * row_tiles * splits
    per_sm = _cdiv(programs, num_sms)
    resident = min(PROGRAMS_PER_SM, SHARED_PER_SM // (tile.stages * block),
                   REGISTERS_PER_SM // (REGISTERS_PER_THREAD * 32 * tile.warps), per_sm)
    in_flight = resident * max(tile.stages - 1, 1) * block
    shared = SMEM_GBPS / (1 + tile.warps * tile.conflicts)              # written once, read by every warp
    instructions = step_instructions(d, tile)
    loop = resident * block / (instructions * CLOCKS_PER_INSTRUCTION / CLOCK_GHZ)
    issue = 4 * CLOCK_GHZ * block / (tile.warps * instructions)
    rate = min(SM_GBPS, in_flight / (LATENCY_US * 1e3), shared, loop, issue)   # GB/s of K and V into one SM
    partials = 0 if splits == 1 else splits * d.B * d.Sq * d.H * (d.D + 1) * 4
    cache = 2 * d.B * d.context * d.H_kv * d.D * d.element_bytes
    return Cost(hbm=(cache * row_tiles + partials) / (HBM_GBPS * 1e3),
                sm=per_sm * blocks * block / (rate * 1e3),
                chain=CHAIN_LOADS * LATENCY_US,
                combine=0.0 if splits == 1 else COMBINE_US + partials / (HBM_GBPS * 1e3),
                moved=cache + 2 * d.B * d.Sq * d.H * d.D * d.element_bytes)


@functools.lru_cache(maxsize=1024)
def splits_for(d: Decode, tile: Tile, num_sms: int = NUM_SMS) -> int:
    """The split count (1 .. MAX_SPLITS, and no more than the key blocks) the model times fastest; the fewest
    splits among those within 2% of it (fewer partials to write and combine for the same time). Remembered
    per shape: the op asks on every call, and the search costs ~1 ms of host time."""
    most = max(1, min(MAX_SPLITS, _cdiv(d.context, tile.keys)))
    costs = {s: modelled(d, tile, s, num_sms).total for s in range(1, most + 1)}
    best = min(costs.values())
    return min(s for s, t in costs.items() if t <= best * 1.02)
