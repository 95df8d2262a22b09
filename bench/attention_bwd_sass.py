"""What ptxas made of the shipped sm_90a attention backward kernels, per iteration of their wgmma loop (no GPU).

    PYTHONPATH=. python bench/attention_bwd_sass.py            # FlashAttention-2's order (the default)
    PYTHONPATH=. python bench/attention_bwd_sass.py --overlap  # the OVERLAP order (TESSERA_ATTENTION_BWD_OVERLAP=1)

For each kernel a plan of `BWD_GPU_PLANS["sm_90a"]` launches (the dK/dV kernel, with and without atomic dQ,
and the dQ pass), bf16, plain and window-softcap-varlen: registers, spill bytes, and in the innermost SASS
loop holding HGMMAs (`sass.loop_containing`: the query loop of dK/dV, the key loop of dQ) its instructions,
HGMMAs, `WARPGROUP.DEPBAR.LE` waits by depth, MUFU, BAR and global atomics (REDG, ATOMG); then the loop's
order as H<n> (n HGMMAs in a row), [i]W<depth> (a wait at the loop's i-th instruction) and B (a barrier).
docs/perf/attention-backward-h100.md tabulates the output. Needs ptxas and cuobjdump (`tessera doctor`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels_lib"))

from test_attention_compile import VARIANTS, backward_kernels, compile_checked  # noqa: E402

from tessera.backends.nvptx.sass import disassemble, loop_containing  # noqa: E402


def census(loop) -> tuple[Counter, str]:
    """(counts by kind, the order of HGMMAs, waits and barriers) of one SASS loop."""
    counts, order = Counter(), []
    for at, inst in enumerate(loop):
        op = inst.opcode
        if op.startswith("HGMMA"):
            counts["HGMMA"] += 1
            order.append("H")
        elif op.startswith("WARPGROUP.DEPBAR"):
            depth = inst.text.split(",")[-1].strip()
            counts[f"wait {depth}"] += 1
            order.append(f"[{at}]W{int(depth, 16)}")
        elif op.startswith(("MUFU", "BAR", "RED", "ATOM")):
            counts[op.split(".")[0]] += 1
            order.append("B" if op.startswith("BAR") else "")
    return counts, re.sub(r"H+", lambda m: f"H{len(m.group())}", "".join(order))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overlap", action="store_true", help="compile the kernels with OVERLAP=True")
    args = parser.parse_args()
    for name, kernel, signature, D, plan, extra in backward_kernels("sm_90a"):
        for variant, masks in VARIANTS.items():
            compiled = compile_checked(kernel, "sm_90a", signature=signature.format(t="bf16"),
                                       num_warps=plan.num_warps, D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages,
                                       OVERLAP=args.overlap, **extra, **masks)
            meta = compiled.metadata
            loop = loop_containing(disassemble(compiled.binary), "HGMMA")
            counts, order = census(loop)
            print(f"{name:20} {variant:22} {meta['registers']:3} registers, spills {meta['spill_stores']}/"
                  f"{meta['spill_loads']} B; loop {len(loop)} instructions {dict(sorted(counts.items()))}; {order}")


if __name__ == "__main__":
    main()
