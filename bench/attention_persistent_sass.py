"""The persistent sm_90a attention forward beside the one-tile warp-specialized one, as ptxas built them (no GPU).

    PYTHONPATH=. python bench/attention_persistent_sass.py

For head dims 64 and 128 (`WS_GPU_PLANS`), bf16, plain and window-softcap, FlashAttention-2's order and the
overlapped one: registers (of the 384-thread entry; the consumers run under `setmaxnreg.inc 232`), spill bytes,
SASS instructions in all, in the consumers' key loop (the innermost loop holding HGMMAs: `sass.loop_containing`)
and a census of the whole kernel (HGMMA, UTMALDG, UTMASTG, STSM, BAR, SYNCS: the mbarrier ops). Needs ptxas and
cuobjdump (`tessera doctor`). What the persistent kernel adds: the tile loop in both roles; per tile, in FlashAttention-3's order, the
producer's TMA loads of the peeled first K block (overlapped order), the tile's first K/V fill, Q behind Q's
empty mbarrier (which the consumers arrive on after the key loop), the other fills and the last V block
(overlapped order), each once-a-tile block behind an empty mbarrier of its own (`schedule/tile_operands.py`).
docs/perf/attention-forward-h100.md tabulates the output.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels_lib"))

from test_attention_compile import FORWARD_SIGNATURE, WS_VARIANTS  # noqa: E402
from test_attention_persistent import PERSISTENT_SIGNATURE, VARIANTS  # noqa: E402

from tessera.backends.nvptx.sass import disassemble, loop_containing  # noqa: E402
from tessera.kernels_lib.attention import WS_GPU_PLANS  # noqa: E402
from tessera.kernels_lib.attention_fwd import attention_fwd_kernel  # noqa: E402
from tessera.kernels_lib.attention_fwd_persistent import attention_fwd_persistent_kernel  # noqa: E402

KINDS = ("HGMMA", "UTMALDG", "UTMASTG", "STSM", "BAR", "SYNCS", "LDG")


def built(persistent: bool, D: int, variant: str, overlap: bool):
    plan = WS_GPU_PLANS[D]
    common = dict(target="sm_90a", strict=True, num_warps=plan.num_warps, D=D, BM=plan.BM, BN=plan.BN,
                  STAGES=plan.stages, WS=True, OVERLAP=overlap)
    if persistent:
        return attention_fwd_persistent_kernel.compile(signature=PERSISTENT_SIGNATURE.format(t="bf16"), **common,
                                                       **VARIANTS[variant])
    return attention_fwd_kernel.compile(signature=FORWARD_SIGNATURE.format(t="bf16"), **common,
                                        **WS_VARIANTS[variant])


def main() -> None:
    print("| D | variant | order | kernel | registers | spills st/ld B | SASS | key loop | "
          + " | ".join(KINDS) + " |")
    print("|" + "---|" * (8 + len(KINDS)))
    for D in sorted(WS_GPU_PLANS):
        for variant in VARIANTS:
            for overlap in (False, True):
                for persistent in (False, True):
                    compiled = built(persistent, D, variant, overlap)
                    meta, code = compiled.metadata, disassemble(compiled.binary)
                    counts = Counter(i.opcode.split(".")[0] for i in code)
                    loop = loop_containing(code, "HGMMA")
                    print(f"| {D} | {variant} | {'overlap' if overlap else 'FA2'} | "
                          f"{'persistent' if persistent else 'one tile'} | {meta['registers']} | "
                          f"{meta['spill_stores']}/{meta['spill_loads']} | {len(code)} | {len(loop)} | "
                          + " | ".join(str(counts[k]) for k in KINDS) + " |", flush=True)


if __name__ == "__main__":
    main()
