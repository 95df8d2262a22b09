"""K-loop instructions of the MoE expert GEMMs on an AMD target (CPU only: LLVM's AMDGPU backend).

    python3 bench/amd_moe_kloop.py --target gfx942

For gate_up and down at each regime, the target's plan (`moe/plan.gpu_plans`) against the same tiles as 1-stage
loops (what gfx942 ran before its rings): the instructions of the kernel's largest loop (its K loop, found as
the largest span from a label to a branch back to it) and among them MFMAs, direct-to-LDS loads (LDS DMA),
plain global loads, LDS reads and writes, waits and barriers. A count, not a timing: what an AMD GPU would
run per K step.
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "kernels_lib")]

COUNTED = {"MFMA": lambda op: op.startswith("v_mfma"), "LDS DMA": lambda op: op.startswith("global_load_lds"),
           "global loads": lambda op: op.startswith("global_load") and not op.startswith("global_load_lds"),
           "LDS reads": lambda op: op.startswith("ds_read"), "LDS writes": lambda op: op.startswith("ds_write"),
           "waits": lambda op: op == "s_waitcnt", "barriers": lambda op: op == "s_barrier"}


def k_loop(assembly: str) -> list[str]:
    """The opcodes of the largest loop in `assembly`: from a label to the last branch back to it."""
    lines, labels, largest = assembly.splitlines(), {}, []
    for i, line in enumerate(lines):
        if m := re.match(r"^(\.LBB\w+):", line):
            labels[m.group(1)] = i
        if (m := re.match(r"^\s*s_c?branch\w*\s+(\.LBB\w+)", line)) and m.group(1) in labels:
            body = [s.split()[0] for s in (x.strip() for x in lines[labels[m.group(1)]:i + 1])
                    if s and not s.startswith((".", ";"))]
            largest = max(largest, body, key=len)
    return largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="gfx942")
    args = parser.parse_args()
    from test_moe_experts import KERNELS, SIGNATURES, _launch_constexprs
    from tessera.kernels_lib.moe import plan as plans
    from tessera.kernels_lib.targets import amd_plan_target
    print("| kernel | plan | instructions | " + " | ".join(COUNTED) + " |\n|---|---|---" + "|---" * len(COUNTED) + "|")
    for regime, p in plans.gpu_plans(amd_plan_target(args.target)).items():
        for name in ("gate_up", "down"):
            for plan in (p.without_pipelining(), p):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")     # 1-stage loops: no pipeline to warn about
                    compiled = KERNELS[name].compile(signature=SIGNATURES[name], target=args.target, strict=True,
                                                     **_launch_constexprs(name, plan))
                ops = k_loop(compiled.stages["amdgcn"])
                stages = (plan.gate_up if name == "gate_up" else plan.down).stages
                print(f"| {name} {regime} | {stages} stage{'s' * (stages > 1)} | {len(ops)} | "
                      + " | ".join(str(sum(map(count, ops))) for count in COUNTED.values()) + " |", flush=True)


if __name__ == "__main__":
    main()
