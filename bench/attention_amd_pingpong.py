"""Registers, scratch and phase structure of the AMD attention forward, 4-wave plan vs the 8-wave ping-pong (CPU only).

    python3 bench/attention_amd_pingpong.py            # a markdown table, then each kernel's phases

For gfx942 and gfx950, head dims 64 and 128: the plan `GPU_PLANS[target]` launches, and
`AMD_PINGPONG_PLANS` (TESSERA_ATTENTION_AMD_PINGPONG=1), compiled as the library compiles them (bf16, batched,
no mask options), with the VGPR/AGPR/SGPR counts, spills, scratch and LDS LLVM reports, and the s_barrier-cut
phases of the AMDGCN (`tests/kernels_lib/amdgcn_phases.py`): `M` MFMAs, `g` global loads, `r`/`w` LDS reads
and writes, `^`/`v` s_setprio 1/0. No AMD GPU has run either plan; timing them is the next AMD session's job.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "kernels_lib")]

from amdgcn_phases import barrier_count, phases  # noqa: E402
from test_attention_compile import FORWARD_SIGNATURE, VARIANTS  # noqa: E402

from tessera.kernels_lib.attention import AMD_PINGPONG_PLANS, GPU_PLANS  # noqa: E402
from tessera.kernels_lib.attention_fwd import attention_fwd_kernel  # noqa: E402


def compile_plan(target: str, D: int, plan):
    return attention_fwd_kernel.compile(target=target, strict=True, signature=FORWARD_SIGNATURE.format(t="bf16"),
                                        num_warps=plan.num_warps, D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages,
                                        WS=False, PINGPONG=plan.pingpong, **VARIANTS["plain"])


def phase_string(assembly: str) -> str:
    out = []
    for p in phases(assembly):
        parts = [f"{k}{n}" for k, n in (("M", p.mfma), ("g", p.global_loads), ("r", p.lds_reads),
                                          ("w", p.lds_writes)) if n]
        parts += ["^" if level else "v" for level in p.priority]
        out.append("[" + " ".join(parts) + "]")
    return " ".join(out)


def main() -> None:
    rows, details = [], []
    for target in ("gfx942", "gfx950"):
        for D in (64, 128):
            for name, plan in (("4-wave", GPU_PLANS[target][D]), ("ping-pong", AMD_PINGPONG_PLANS[D])):
                compiled = compile_plan(target, D, plan)
                m, asm = compiled.metadata, compiled.stages["amdgcn"]
                mfma_phases = [p for p in phases(asm) if p.mfma]
                rows.append(f"| {target} | {D} | {name} (BM {plan.BM}, BN {plan.BN}, {m['num_threads']} threads) | "
                            f"{m['vgpr_count']} | {m.get('agpr_count', 0)} | {m['sgpr_count']} | "
                            f"{m['vgpr_spill_count']} | {m['sgpr_spill_count']} | {m['private_segment_fixed_size']} | "
                            f"{m['group_segment_fixed_size']} | {barrier_count(asm)} | "
                            f"{'/'.join(str(p.mfma) for p in mfma_phases)} | "
                            f"{asm.count('s_setprio')} |")
                details.append(f"{target} D={D} {name}: {phase_string(asm)}")
    print("| target | D | plan | VGPR | AGPR | SGPR | VGPR spills | SGPR spills | scratch B | LDS B | s_barrier | "
          "MFMAs per MFMA phase | s_setprio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("\n".join(details))


if __name__ == "__main__":
    main()
