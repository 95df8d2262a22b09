"""Launch plans of the expert GEMMs: the row tile BM (which `align` pads to) and each GEMM's tiles.

Three regimes, by how many rows an active expert gets on average (pairs
= tokens * top_k over min(pairs, experts) experts):

* decode (<= 8 rows per expert on average: 1-64 tokens of a fine-grained
  MoE): 16-row tiles, so an expert with a few tokens still reads each of
  its weight tiles once (`plan` says why 8, not 16), in K steps of 128
  bytes (`DECODE` says why); mma.sync m16n8k16;
* middle (<= 128 rows): 64-row tiles, 4 warps (wgmma m64 on sm_90a);
* prefill: 128-row tiles, 8 warps (two wgmma warpgroups on sm_90a).

`QUANTIZED` holds the same regimes' tiles for int4 and fp8 weights. Each plan
compiles without register spills for sm_80, sm_90a (TMA-filled
rings read by wgmma for 64+ row tiles), gfx942 and gfx950 (tests/kernels_lib/
test_moe_experts.py compiles every one). A GPU runs its plan target's plans
(`targets.plan_target`; `gpu_plans` is the one choice): the same tiles
everywhere, with rings (direct-to-LDS loads on AMD) as deep as the target's
LDS holds (`GFX942`); the one-launch layer has plans of its own per AMD
target (`AMD_ONE_LAUNCH`). float32 operands (the CPU tests' dtype)
multiply on FMA units, which no pipeline feeds: STAGES = 1. The
first H100 run (2026-11-26) timed the plans before the decode changes
noted at `DECODE` and `plan`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional


@dataclass(frozen=True)
class GemmTiles:
    """One grouped GEMM's tiles: BN output columns (gate_up: BN of each of gate and up), BK of K per step."""

    BN: int
    BK: int
    stages: int
    num_warps: int


@dataclass(frozen=True)
class Plan:
    """BM rows per block (the alignment's tile), and the tiles of the gate_up and down GEMMs."""

    BM: int
    gate_up: GemmTiles
    down: GemmTiles

    def without_pipelining(self) -> "Plan":
        return replace(self, gate_up=replace(self.gate_up, stages=1), down=replace(self.down, stages=1))


# K steps of 64 bf16, 128 bytes: a weight block's rows fit TMA's 128-byte swizzle and ldmatrix reads them without
# bank conflicts. With BK = 128 the rows were 256 bytes (no TMA swizzle spans them) and sat 256 bytes apart, the
# eight rows of each ldmatrix matrix in one bank: 8-way conflicts, 3072 shared-memory wavefronts per 36 KB step,
# which held an SM to ~20 GB/s of weights; the H100 streamed at 45-64% of HBM (2026-11-26; the dense decode
# GEMM's K-contiguous weights: 39-53% at 256-byte K steps, 91-96% at 128). gate_up's 4 stages of 18 KB let 3
# programs share an H100 SM (2 on an A100), ~160 KB in flight per SM; down's BN = 32 doubles its programs
# (Mixtral at 1 token: 256, not 128, for 132 SMs) and keeps the one-launch kernel within 128 registers on sm_80.
DECODE = Plan(16, GemmTiles(64, 64, 4, 4), GemmTiles(32, 64, 4, 4))
MIDDLE = Plan(64, GemmTiles(64, 64, 3, 4), GemmTiles(128, 64, 3, 4))
PREFILL = Plan(128, GemmTiles(64, 64, 3, 8), GemmTiles(128, 64, 3, 8))
SHIPPED = {"decode": DECODE, "middle": MIDDLE, "prefill": PREFILL}

# Quantized weights (`quantized_mlp.py`) are dequantized in registers, next to the accumulator: at decode and
# middle sizes gate_up's B block (2BN x BK) and, in the middle, down's BN are halved so that sm_80 (where
# e4m3 -> bf16 is emulated in integer ops) does not spill; prefill's 8 warps have the registers.
QUANTIZED = {"decode": Plan(16, GemmTiles(32, 128, 4, 4), GemmTiles(64, 128, 4, 4)),
             "middle": Plan(64, GemmTiles(32, 64, 3, 4), GemmTiles(64, 64, 3, 4)),
             "prefill": PREFILL}

# fp8 activations times fp8 weights (`fp8_mlp.py`) step K by the activations' scale group (128): the B block is
# held at <= 64 rows (gate_up's BN = 32, down's 64; 16 and 32 at decode), where sm_90a spilled at 128.
FP8 = {"decode": Plan(16, GemmTiles(16, 128, 4, 4), GemmTiles(32, 128, 4, 4)),
       "middle": Plan(64, GemmTiles(32, 128, 3, 4), GemmTiles(64, 128, 3, 4)),
       "prefill": Plan(128, GemmTiles(32, 128, 3, 8), GemmTiles(64, 128, 3, 8))}

# gfx942 (MI300: 64 KiB of LDS) runs the shipped tiles at the deepest rings its LDS holds (`ring_bytes`), each
# compiling without spills or scratch (bench/results/amd_registers_gfx942.md): decode's gate_up 3 stages (55,296
# bytes; 4 would be 73,728) and down 4 as shipped (24,576); middle 2 and 2 (49,152; 3: 73,728); prefill 2 and 2
# (65,536, the whole LDS; 3: 98,304). Deeper rings at BK = 32 compile clean too (middle 5 stages, 61,440 bytes),
# but halve the K step to 64 bytes and double the loop's trips and barriers; which wins needs an MI300. The int4 /
# fp8-weight plans ring only x (the weight codes feed a cast into one dequantized B block), so decode and middle
# fit as shipped (33,280 / 33,272 bytes) and prefill's x ring takes 2 stages (50,168; 3 need 66,552). A ring over
# 32 KiB leaves one workgroup a CU where the 1-stage loops let two or three share it; whether the rings' loads in
# flight outweigh that is for an MI300 to say (the 1-stage plans: `Plan.without_pipelining`).
GFX942 = {"decode": Plan(16, GemmTiles(64, 64, 3, 4), GemmTiles(32, 64, 4, 4)),
          "middle": Plan(64, GemmTiles(64, 64, 2, 4), GemmTiles(128, 64, 2, 4)),
          "prefill": Plan(128, GemmTiles(64, 64, 2, 8), GemmTiles(128, 64, 2, 8))}
GFX942_QUANTIZED = {**QUANTIZED, "prefill": GFX942["prefill"]}


@dataclass(frozen=True)
class TargetPlans:
    """One plan target's multi-kernel plans by regime: bf16 weights, int4 / fp8 weights (`quantized_mlp.py`), and
    fp8 activations (`fp8_mlp.py`; None where the target runs none: gfx942's fp8 MFMA reads fnuz fp8)."""

    bf16: dict[str, Plan]
    quantized: dict[str, Plan]
    fp8: Optional[dict[str, Plan]]


# The multi-kernel plans by plan target (`targets.plan_target`): gfx950's 160 KiB of LDS holds the shipped rings
# (73,728 bytes at decode and middle, 98,304 at prefill; the quantized plans' 33,776 and 67,568; fp8 activations'
# 12,536 / 33,272 / 57,848), each compiling without spills.
BY_TARGET = {"nvidia": TargetPlans(SHIPPED, QUANTIZED, FP8),
             "gfx950": TargetPlans(SHIPPED, QUANTIZED, FP8),
             "gfx942": TargetPlans(GFX942, GFX942_QUANTIZED, None)}


def gpu_plans(target: str, weights: str = "bf16") -> dict[str, Plan]:
    """The regimes' plans that plan target `target` (`targets.plan_target`) runs for `weights`: "bf16",
    "quantized" (int4 / fp8 weights) or "fp8" (fp8 activations and weights)."""
    if target not in BY_TARGET:
        raise ValueError(f"tessera::moe: no expert GEMM plans for plan target {target!r}; use one of "
                         f"{sorted(BY_TARGET)} (`targets.plan_target` gives a device's)")
    if weights not in ("bf16", "quantized", "fp8"):
        raise ValueError(f"tessera::moe: weights must be 'bf16', 'quantized' or 'fp8', got {weights!r}")
    chosen = getattr(BY_TARGET[target], weights)
    if chosen is None:
        raise ValueError(f"tessera::moe: {target} runs no fp8-activation expert GEMMs (fp8_mlp.target_refusal); "
                         f"use bf16 activations with the fp8 weights (fp8_activations=False)")
    return chosen


# The one-launch layer (`persistent.py`) on AMD, by plan target (`targets.plan_target`): one kernel holds every
# phase's registers, and at 8 waves (512 threads) a wave gets at most 256 VGPRs, which prefill's 128-row tiles
# overran on gfx942 (18-29 VGPR spills and 76-120 B of scratch, whatever the BN). Prefill runs 4 waves, each with
# up to 512 VGPRs and AGPRs (about 450 used), and down's BN is 64 (at 128, 4 waves spilled SGPRs 738 times). The
# phases share one LDS allocation, so the kernel needs the larger of its two rings (`ring_bytes`).
# gfx950 (160 KiB) runs the multi-kernel plans' rings, 4 stages at decode and 3 beyond (73,728 / 73,728 / 98,304
# bytes), without spills or scratch for Qwen3's and DeepSeek-V3's routing (tests/kernels_lib/test_moe_one_launch.py,
# bench/results/amd_registers_gfx950.md). gfx942 (64 KiB; LDS DMA of 4 bytes a lane, 4x the copy instructions of
# gfx950's 16) runs the deepest rings that compile clean: decode 2 stages at BK = 64 (36,864 bytes), middle 3 at
# BK = 32 (36,864), prefill 2 at BK = 32 (32,768). One step deeper each fits its LDS but spills SGPRs with Qwen3's
# routing: decode 3 stages 3, middle 4 stages 3 (2 stages at BK = 64: 2), prefill 3 stages 4 (2 stages at BK = 64,
# 65,536 bytes: 4). What spills is the gate_up tile's coordinates, live across its K loop for the epilogue and the
# h_done[block] increment (block's byte offset, block * BM, the column tile): written to VGPR lanes before the loop
# and read back after it, not in it, but the rule is no spills (bench/results/amd_registers_gfx942.md).
AMD_ONE_LAUNCH = {
    "gfx942": {"decode": Plan(16, GemmTiles(64, 64, 2, 4), GemmTiles(32, 64, 2, 4)),
               "middle": Plan(64, GemmTiles(64, 32, 3, 4), GemmTiles(128, 32, 3, 4)),
               "prefill": Plan(128, GemmTiles(64, 32, 2, 4), GemmTiles(64, 32, 2, 4))},
    "gfx950": {"decode": DECODE, "middle": MIDDLE,
               "prefill": Plan(128, GemmTiles(64, 64, 3, 4), GemmTiles(64, 64, 3, 4))},
}
RING_ELEMENT_BYTES = 2      # the bf16 / f16 operands the expert GEMMs' rings hold


def gemm_ring_bytes(p: Plan, gemm: str) -> int:
    """LDS bytes of plan `p`'s ring for `gemm` ("gate_up" or "down"): STAGES x (a BM x BK block of rows and the
    weights' block, gate_up's 2BN x BK (gate and up) or down's BN x BK) of bf16. On AMD this is the whole LDS of
    the multi-kernel GEMM (the compile tests compare)."""
    t = getattr(p, gemm)
    weight_rows = 2 * t.BN if gemm == "gate_up" else t.BN
    return RING_ELEMENT_BYTES * t.stages * (p.BM + weight_rows) * t.BK


def ring_bytes(p: Plan) -> int:
    """LDS bytes of plan `p`'s larger K-loop ring (`gemm_ring_bytes`). A pipelined one-launch kernel's LDS is this
    (the compile tests compare)."""
    return max(gemm_ring_bytes(p, "gate_up"), gemm_ring_bytes(p, "down"))


# The interpreter's plan: small tiles keep the interpreted dots cheap (and give the tests several blocks).
CPU_PLAN = Plan(16, GemmTiles(16, 16, 1, 4), GemmTiles(16, 16, 1, 4))


def plan(tokens: int, top_k: int, num_experts: int, *, pipelined: bool = True) -> Plan:
    """The plan for `tokens` tokens routed to `top_k` of `num_experts` experts (see the module docstring);
    `pipelined=False` for targets or dtypes without asynchronous copies."""
    pairs = tokens * top_k
    # Decode's 16-row blocks up to a mean of 8 rows per expert, half the block: the counts scatter around the mean
    # and an expert with 17 rows takes two blocks, each reading all its weights. At a mean of 16 (Mixtral at 64
    # tokens, DeepSeek-V3 at 512) 43% of the experts overflowed, 1.4x the weight bytes: 35% and 45% of HBM where
    # their neighbours reached ~60% (H100, 2026-11-26). At a mean of 8, 0.4% do.
    rows_per_expert = pairs / max(1, min(pairs, num_experts))
    chosen = DECODE if rows_per_expert <= 8 else MIDDLE if rows_per_expert <= 128 else PREFILL
    return chosen if pipelined else chosen.without_pipelining()
