"""Registers, spills and scratch of every shipped library kernel on an AMD target (CPU only: LLVM's AMDGPU backend).

    python3 bench/amd_registers.py                      # gfx942, every group: a markdown table
    python3 bench/amd_registers.py --only moe attention --target gfx950 --json bench/results/amd_registers.json
    python3 bench/amd_registers.py --only fp8 --target gfx950       # the e4m3 GEMM, MoE and attention kernels

Each row is one shipped config compiled as the library (and its compile tests) compile it for the target, with
the target's own plans where they differ (`kernels_lib/targets.py`: gfx950's deeper rings): SGPR / VGPR / AGPR
counts, SGPR and VGPR spills, the scratch bytes a work-item needs and the LDS bytes a workgroup needs (against
`tessera.get_target(target).shared_memory_bytes`), from the code object's `.amdhsa` metadata
(`tessera/backends/amdgpu/elf.py`). An SGPR spill on AMD goes to a lane of a VGPR (`v_writelane_b32` /
`v_readlane_b32`), so it costs no scratch but an instruction each way; a VGPR spill goes to scratch memory.
The shipped configs must spill neither: the AMD compile tests check it (`tests/kernels_lib/amd_spills.py`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "kernels_lib")]

from tessera.kernels_lib.targets import amd_plan_target  # noqa: E402

COLUMNS = ("sgpr_count", "vgpr_count", "agpr_count", "sgpr_spill_count", "vgpr_spill_count",
           "private_segment_fixed_size", "shared_bytes")
Case = tuple[str, str, Callable[[str], object]]      # (group, config name, target -> compiled kernel)


def _quiet(compile_: Callable[[], object]):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # AMD runs pipelines as plain loops; those warnings are expected
        return compile_()


def gemm_cases(target: str) -> Iterator[Case]:
    from test_gemm import B_STRIDES, GEMM_SIGNATURE
    from tessera.kernels_lib.gemm import CONFIGS, gemm_kernel
    for config in CONFIGS:
        yield "gemm", str(config), lambda t, c=config: gemm_kernel.kernel.compile(
            signature=GEMM_SIGNATURE.format(b=B_STRIDES["b-row-major"]), target=t, num_warps=c.num_warps,
            strict=False, HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none", **c.kwargs)


def split_k_cases(target: str) -> Iterator[Case]:
    """The split-K paths' tiles and the stream-K tile the target runs (`gemm_configs.small_m_tiles` / `split_k_tile`
    / `stream_k_tile`: fitted to its LDS), bf16 with B row-major, K split 3 ways into the workspace."""
    from test_gemm_amd_caps import _amd_tiles, _compile
    for name in _amd_tiles(amd_plan_target(target)):
        yield "gemm split/stream K", name, lambda t, n=name: _compile(n, t)[0]


def attention_cases(target: str) -> Iterator[Case]:
    from test_attention_compile import (BACKWARD_KERNELS, compile_checked, compile_decode, compile_forward,
                                        decode_tiles)
    from attention_amd_pingpong import compile_plan
    from tessera.kernels_lib.attention import AMD_PINGPONG_PLANS, GPU_PLANS
    for D, plan in sorted(GPU_PLANS[amd_plan_target(target)].items()):
        for variant in ("plain", "window-softcap-varlen"):
            yield "attention fwd", f"D={D} 4-wave {variant}", \
                lambda t, D=D, p=plan, v=variant: compile_forward(t, D, p, v)
    for D, plan in sorted(AMD_PINGPONG_PLANS.items()):
        yield "attention fwd", f"D={D} 8-wave ping-pong", lambda t, D=D, p=plan: compile_plan(t, D, p)
    for name, (_, kernel, signature, D, plan, extra) in BACKWARD_KERNELS.items():
        if name.startswith(amd_plan_target(target)):
            yield "attention bwd", name, lambda t, k=kernel, s=signature, D=D, p=plan, e=extra: compile_checked(
                k, t, signature=s.format(t="bf16"), num_warps=p.num_warps, D=D, BM=p.BM, BN=p.BN, STAGES=p.stages,
                **e, HAS_LEFT=True, HAS_RIGHT=True, SOFTCAP=True, VARLEN=True)
    for softmax, D, rows, keys, stages, warps in decode_tiles(amd_plan_target(target)):
        yield "attention decode", f"{softmax} D={D} rows={rows} keys={keys} warps={warps} stages={stages}", \
            lambda t, a=(softmax, D, rows, keys, stages, warps): compile_decode(t, *a)


def moe_cases(target: str) -> Iterator[Case]:
    import tessera
    from test_moe_experts import KERNELS, SIGNATURES, _launch_constexprs
    from test_moe_one_launch import ROUTING
    from tessera.kernels_lib.moe import plan as plans
    from tessera.kernels_lib.moe.align import (PREFIX_EXPERTS, align_kernel, count_kernel, prefix_chunks,
                                               prefix_kernel)
    from tessera.kernels_lib.moe.persistent import SIGNATURE, constexprs_for, moe_layer_kernel
    from tessera.kernels_lib.moe.routing import routing_kernel, tokens_per_program
    for E, K, grouped in ((8, 2, False), (128, 8, False), (256, 8, True)):
        n_group = 8 if grouped else 1
        yield "moe routing", f"E={E} K={K}", lambda t, E=E, K=K, g=grouped, n=n_group: routing_kernel.compile(
            signature="*f32:16,*f32:16,*f32:16,*i32:16,*i32:16,*i32:16,i32,i32,i32,f32", target=t, strict=True,
            K=K, SCORING="sigmoid" if g else "softmax", HAS_BIAS=g, N_GROUP=n, TOPK_GROUP=4 if g else 1,
            RENORMALIZE=True, BT=tokens_per_program(E, K), E_PAD=tessera.next_power_of_2(E),
            K_PAD=tessera.next_power_of_2(K), NG_PAD=n, num_warps=4)
    for E, K in ((8, 2), (128, 8), (256, 8)):
        chunk = tokens_per_program(E, K) * K
        E_PAD = 1 << (E - 1).bit_length()
        sizes = dict(CHUNK=chunk, CHUNK_PAD=1 << (chunk - 1).bit_length(), E_PAD=E_PAD)
        EB = min(PREFIX_EXPERTS, E_PAD)
        for kernel, signature, constexprs in (
                (count_kernel, "*i32:16,*i32:16,*i32:16,i32,i32", sizes),
                (prefix_kernel, "*i32:16,*i32:16,i32,i32", dict(CB=prefix_chunks(1 << 20, EB), EB=EB)),
                (align_kernel, "*i32:16,*i32:16,*i32:16,*i32:16,*i32:16,*i32:16,i32,i32,i32",
                 dict(BM=64, **sizes))):
            yield "moe align", f"{kernel.__name__} E={E}", lambda t, k=kernel, s=signature, c=constexprs: \
                k.compile(signature=s, target=t, strict=True, **c)
    for regime, p in plans.gpu_plans(amd_plan_target(target)).items():   # the target's rings (`plan.gpu_plans`)
        for name in (("gate_up", "down") if regime != "middle" else KERNELS):
            stages = (p.gate_up if name in ("gate_up", "weight_grad") else p.down).stages
            yield "moe experts", f"{name} {regime} stages={stages}", lambda t, n=name, p=p: KERNELS[n].compile(
                signature=SIGNATURES[n], target=t, strict=True, **_launch_constexprs(n, p))
    yield from _moe_quantized_cases(plans.gpu_plans(amd_plan_target(target), "quantized"))
    for regime, shipped in plans.AMD_ONE_LAUNCH[amd_plan_target(target)].items():   # the layer's plans on target
        stages = f"stages={shipped.gate_up.stages}/{shipped.down.stages} BK={shipped.gate_up.BK}"
        for model, (E, K, options) in ROUTING.items():
            yield "moe one-launch", f"{model} {regime} {stages}", lambda t, p=shipped, E=E, K=K, o=options: \
                moe_layer_kernel.compile(signature=SIGNATURE, target=t, strict=True, num_warps=p.gate_up.num_warps,
                                         **constexprs_for(p, E, K, 1, route=True, **o))


def _moe_quantized_cases(regimes: dict) -> Iterator[Case]:
    """The int4 / fp8-weight expert GEMMs (`moe/quantized_mlp.py`) at the target's plans, group 128."""
    from test_moe_quant import _signature
    from tessera.kernels_lib.moe.quantized_mlp import down_quant_kernel, gate_up_quant_kernel
    for regime, p in regimes.items():
        for fmt in ("int4", "fp8"):
            for name, kernel, g, extra in (("gate_up", gate_up_quant_kernel, p.gate_up, dict(ACTIVATION="silu")),
                                           ("down", down_quant_kernel, p.down, dict(TOP_K=8, ATOMIC=False))):
                yield "moe quantized experts", f"{fmt} {name} {regime} stages={g.stages}", \
                    lambda t, k=kernel, n=name, f=fmt, p=p, g=g, e=extra: k.compile(
                        signature=_signature(n, f), target=t, strict=True, FORMAT=f, G=128, ZEROS=f == "int4",
                        BM=p.BM, BN=g.BN, BK=g.BK, STAGES=g.stages, num_warps=g.num_warps, **e)


def quant_cases(target: str) -> Iterator[Case]:
    from test_quant_gemm import KERNELS, _signature
    from tessera.kernels_lib.quant_gemm import fp4_gemm_kernel, plan, w4a8_kernel
    for case in ("w4a16-decode", "w4a16-large", "mxfp4"):
        kernel, M = KERNELS[case]
        group = 32 if kernel is fp4_gemm_kernel else 128
        p = plan(M, 4096, 4096, group, 132, w4a8=kernel is w4a8_kernel, target=amd_plan_target(target))
        signature, extra = _signature(kernel, p, "e8m0")
        yield "quant gemm", f"{case} stages={p.stages}", \
            lambda t, k=kernel, s=signature, g=group, p=p, e=extra: k.compile(
                signature=s, target=t, G=g, BM=p.BM, BN=p.BN, SPLIT_K=p.split_k, STAGES=p.stages,
                num_warps=p.num_warps, **e)


def fp8_cases(target: str) -> Iterator[Case]:
    """The e4m3 kernels: the GEMM's configs with torch._scaled_mm's K-contiguous B (on MFMA where the target has
    OCP fp8 MFMA, gfx950; gfx942 runs them on FMA), and where the library runs them (`targets.fp8_matrix_cores`)
    the fp8 MoE expert GEMMs, the fp8 attention forward and the W4A8 quant GEMM."""
    from test_attention_fp8_compile import VARIANTS, compile_fp8 as compile_attention
    from test_gemm_fp8 import FP8_SIGNATURE
    from test_moe_fp8 import SIGNATURES
    from tessera.kernels_lib import gemm_configs
    from tessera.kernels_lib.attention_fp8 import FP8_GPU_PLANS
    from tessera.kernels_lib.gemm import gemm_kernel
    from tessera.kernels_lib.moe import plan as plans
    from tessera.kernels_lib.moe.fp8_mlp import down_fp8_kernel, gate_up_fp8_kernel
    from tessera.kernels_lib.targets import fp8_matrix_cores
    for config in gemm_configs.BY_AMD_TARGET[amd_plan_target(target)]:
        yield "gemm e4m3", str(config), lambda t, c=config: gemm_kernel.kernel.compile(
            signature=FP8_SIGNATURE.format(b="i32:1,i32:16"), target=t, num_warps=c.num_warps, strict=False,
            HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none", **c.kwargs)
    if not fp8_matrix_cores(target):
        return
    for regime, p in plans.FP8.items():
        for name, kernel, tiles, extra in (("gate_up", gate_up_fp8_kernel, p.gate_up, dict(ACTIVATION="silu")),
                                           ("down", down_fp8_kernel, p.down, dict(TOP_K=8, ATOMIC=False))):
            yield "moe fp8 experts", f"{name} {regime} stages={tiles.stages}", \
                lambda t, k=kernel, n=name, p=p, g=tiles, e=extra: k.compile(
                    signature=SIGNATURES[n], target=t, strict=True, G=128, WG=128, BM=p.BM, BN=g.BN,
                    STAGES=g.stages, num_warps=g.num_warps, **e)
    for D, plan in sorted(FP8_GPU_PLANS.get(target, {}).items()):
        for variant in VARIANTS:
            yield "attention fp8 fwd", f"D={D} {variant} stages={plan.stages}", \
                lambda t, D=D, p=plan, v=variant: compile_attention(t, D, p, v)
    from test_quant_gemm import KERNELS, _signature
    from tessera.kernels_lib.quant_gemm import plan as quant_plan
    kernel, M = KERNELS["w4a8"]
    p = quant_plan(M, 4096, 4096, 128, 132, w4a8=True, target=amd_plan_target(target))
    signature, extra = _signature(kernel, p, "e8m0")
    yield "quant gemm", f"w4a8 stages={p.stages}", lambda t, s=signature, p=p, e=extra: kernel.compile(
        signature=s, target=t, G=128, BM=p.BM, BN=p.BN, SPLIT_K=p.split_k, STAGES=p.stages, num_warps=p.num_warps,
        **e)


GROUPS = {"gemm": gemm_cases, "split_k": split_k_cases, "attention": attention_cases, "moe": moe_cases,
          "quant": quant_cases, "fp8": fp8_cases}


def measure(target: str, groups) -> list[dict]:
    rows = []
    for group in groups:
        for kind, name, compile_ in GROUPS[group](target):
            start = time.perf_counter()
            try:
                m = _quiet(lambda: compile_(target)).metadata
                row = {c: m.get(c, 0) for c in COLUMNS}
            except Exception as e:  # noqa: BLE001  (a config that no longer compiles is a row too)
                row = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
            rows.append({"group": kind, "config": name, "target": target,
                         "compile_s": round(time.perf_counter() - start, 1), **row})
            print(_markdown_row(rows[-1]), flush=True)
    return rows


HEADER = ("| group | config | SGPR | VGPR | AGPR | SGPR spills | VGPR spills | scratch B | LDS B |\n"
          "|---|---|---|---|---|---|---|---|---|")


def _markdown_row(r: dict) -> str:
    if "error" in r:
        return f"| {r['group']} | {r['config']} | {r['error']} | | | | | | |"
    return f"| {r['group']} | {r['config']} | " + " | ".join(str(r[c]) for c in COLUMNS) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="gfx942")
    parser.add_argument("--only", nargs="*", choices=list(GROUPS), default=list(GROUPS))
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    print(HEADER, flush=True)
    rows = measure(args.target, args.only)
    spilling = [r for r in rows if r.get("sgpr_spill_count") or r.get("vgpr_spill_count")
                or r.get("private_segment_fixed_size") or "error" in r]
    print(f"\n{len(rows)} configs on {args.target}, {len(spilling)} spill, need scratch or fail")
    if args.json:
        args.json.write_text(json.dumps({"target": args.target, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
