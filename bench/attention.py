"""Attention (tessera.kernels_lib) against torch SDPA's flash and cuDNN backends, in one run.

    python bench/attention.py                       # every part: needs an NVIDIA GPU and torch
    python bench/attention.py --part forward --budget 120
    python bench/attention.py --dry-run             # the plan, and each part once on the CPU interpreter

Parts (`--part`, repeatable; default all):
* forward: TFLOP/s of `attention` (bf16, (B, S, H, D)) for S in 512 .. 16k
  and D in {128, 64, 256}, causal and not, with B * S = 16k tokens and
  H * D = 2048 (FlashAttention's benchmark shapes), against SDPA with its
  flash backend and its cuDNN backend on the same tensors (transposed views);
  on Hopper at D in {64, 128} also `tessera_ws`, the warp-specialized plan
  (TESSERA_ATTENTION_WS=1: a producer warpgroup issuing K/V's TMA fills),
  and `tessera_plain`, the other (TESSERA_ATTENTION_WS=0), with `ws_vs_plain`
  the first's speed over the second's (`tessera` is the plan chosen unasked),
  and each in FlashAttention-3's overlapped loop order too
  (TESSERA_ATTENTION_OVERLAP=1: `tessera_ws_overlap`, `tessera_plain_overlap`,
  with `overlap_vs_ws` and `overlap_vs_plain` their speed over the FA2 order's,
  and `tessera_ws_pingpong` (..._PINGPONG=1 too: the consumer warpgroups take
  turns) with `pingpong_vs_overlap` its speed over `tessera_ws_overlap`,
  and the persistent kernel (..._PERSISTENT=1: min(tiles, SMs) programs
  looping over tiles) `tessera_ws_persistent` with `persistent_vs_ws` and
  `tessera_ws_overlap_persistent` with `persistent_vs_overlap`;
  at D = 256, which has no warp-specialized plan, the plain ones only);
* backward: the same shapes, the backward pass alone (dQ, dK, dV from a
  saved forward), TFLOP/s counted as 2.5x the forward's FLOPs; on Hopper
  also `tessera_overlap`, the backward kernels in their OVERLAP order
  (TESSERA_ATTENTION_BWD_OVERLAP=1: S and dP issued together, depth-1 waits;
  docs/perf/attention-backward-h100.md), with `bwd_overlap_vs_fa2` its speed
  over `tessera` (FlashAttention-2's order);
* decode: `attention_decode` over a paged cache (pages of 64 tokens, one new
  token, 32 query heads on 8 key/value heads, D = 128) for batch 1..32 and
  context 4k..64k, with the online softmax and with a unified max (and the
  online one with its splits merged in the split launch, `tessera_in_launch`,
  and by the combine kernel after it, `tessera_two_launch`:
  $TESSERA_DECODE_SEPARATE_COMBINE 0 and 1, side by side; `tessera` is the
  op's own pick, the decode model's), against
  SDPA over the same keys gathered contiguously and a plain
  matmul-softmax-matmul: latency (per eager call and in a CUDA graph) and
  the cache's bytes per second, also as a share of HBM bandwidth;
* fp8: the forward's D = 128 shapes with float8 e4m3 q, k, v and per-tensor
  descales (`attention(..., q_descale=, k_descale=, v_descale=)`, V's
  transposed copy included), against tessera's bf16 forward and SDPA cuDNN
  (bf16) on the same values, checked against SDPA flash within fp8's bound.

The rows run in the order of `schedule`: forward and backward at head dim
128 (the goal's), decode, then the other head dims, so a run cut short by
`--budget` (no new row starts once it is spent) or by the GPU session still
has the rows that matter most (fp8 last). Each row is checked against SDPA (or the reference) before it is
timed (a mismatch is recorded as `wrong`, not timed), appended to
$TESSERA_RESULTS_JSONL as soon as it is measured, and attention.json is
rewritten after every row; attention.png (with matplotlib) shows tessera's
speed over cuDNN's (forward, backward) and over SDPA's (decode) per row.
Goals (issue 16, H100/H200): forward bf16 D=128 >= 1.05x cuDNN; backward >=
SDPA flash; decode >= 85% of HBM bandwidth at long context.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import gpu_common

SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
HEAD_DIMS = [128, 64, 256]
TOKENS, HIDDEN = 16384, 2048                  # B * S and H * D of every forward/backward shape
DECODE = dict(H=32, H_kv=8, D=128, page=64)
DECODE_SHAPES = [(1, 4096), (1, 16384), (1, 65536), (8, 4096), (8, 16384), (8, 65536), (32, 4096), (32, 16384)]
PARTS = ("forward", "backward", "decode", "fp8")
FP8_HEAD_DIM = 128
SDPA_BACKENDS = ("flash", "cudnn")


def cases(part: str) -> list[dict]:
    """The rows of a part, in the order they run."""
    if part == "decode":
        return [dict(B=B, context=context, **DECODE) for B, context in DECODE_SHAPES]
    head_dims = [FP8_HEAD_DIM] if part == "fp8" else HEAD_DIMS
    return [dict(B=TOKENS // S, S=S, H=HIDDEN // D, D=D, causal=causal)
            for D in head_dims for causal in (False, True) for S in SEQLENS]


def schedule(parts: list[str]) -> list[tuple[str, dict]]:
    """(part, case) in the order they run: the goal's head dim (128) of forward and backward, then decode, then
    the other head dims, so a run cut short by its budget has the rows that matter most."""
    dense = [p for p in parts if p in ("forward", "backward")]
    first = [(p, c) for p in dense for c in cases(p) if c["D"] == HEAD_DIMS[0]]
    rest = [(p, c) for p in dense for c in cases(p) if c["D"] != HEAD_DIMS[0]]
    return (first + [("decode", c) for c in cases("decode") if "decode" in parts] + rest
            + [("fp8", c) for c in cases("fp8") if "fp8" in parts])


def forward_flops(case: dict) -> float:
    """Two products of B * H * S^2 * D multiply-adds; causal rows compute half of them."""
    flops = 4.0 * case["B"] * case["H"] * case["S"] ** 2 * case["D"]
    return flops / 2 if case["causal"] else flops


def decode_bytes(case: dict) -> int:
    """What a decode step must read and write: the keys and values of every sequence (bf16), q and O."""
    cache = 2 * case["B"] * case["context"] * case["H_kv"] * case["D"] * 2
    return cache + 2 * case["B"] * case["H"] * case["D"] * 2


def sdpa(torch, backend: str):
    """A (q, k, v, causal) -> O function on (B, S, H, D) tensors through SDPA with only `backend` enabled."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    choice = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def run(q, k, v, causal):
        with sdpa_kernel([choice]):
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
        return o.transpose(1, 2)
    return run


def close(torch, got, expected) -> bool:
    return bool(torch.allclose(got.float(), expected.float(), rtol=2e-2, atol=2e-2))


def timed(torch, row: dict, who: str, fn, flops: float) -> None:
    """`who`'s TFLOP/s into `row` (CUDA events around eager calls: these shapes keep the GPU busy)."""
    row[f"{who}_tflops"] = flops / (gpu_common.device_ms(fn, torch, warmup=3, iters=10) * 1e-3) / 1e12


def with_env(fn, settings: dict):
    """`fn` run with the environment variables `settings` set (TESSERA_ATTENTION_WS, TESSERA_ATTENTION_OVERLAP),
    each restored after."""
    import os

    def run(*args):
        before = {name: os.environ.get(name) for name in settings}
        os.environ.update(settings)
        try:
            return fn(*args)
        finally:
            for name, value in before.items():
                if value is None:
                    del os.environ[name]
                else:
                    os.environ[name] = value
    return run


# Hopper's forward plans at D 64/128 timed beside the one chosen unasked: (warp-specialized?, overlapped?,
# ping-pong?, persistent?)
HOPPER_FORWARDS = {"tessera_ws": ("1", "0", "0", "0"), "tessera_plain": ("0", "0", "0", "0"),
                   "tessera_ws_overlap": ("1", "1", "0", "0"), "tessera_plain_overlap": ("0", "1", "0", "0"),
                   "tessera_ws_pingpong": ("1", "1", "1", "0"), "tessera_ws_persistent": ("1", "0", "0", "1"),
                   "tessera_ws_overlap_persistent": ("1", "1", "0", "1")}
# Hopper's backward orders timed beside the default (FlashAttention-2's): who -> the environment its backward
# pass runs under (set around the timed autograd.grad, where `_backward` reads it)
HOPPER_BACKWARDS = {"tessera_overlap": {"TESSERA_ATTENTION_BWD_OVERLAP": "1"}}


def measure_dense(torch, part: str, case: dict) -> dict:
    """One forward or backward row: tessera (on Hopper's forward at D 64/128 also its warp-specialized plan),
    SDPA flash and SDPA cuDNN, each checked against SDPA flash."""
    from tessera.kernels_lib import attention
    from tessera.kernels_lib.attention import (OVERLAP_ENV, OVERLAP_HEAD_DIMS, PERSISTENT_ENV, PINGPONG_ENV, WS_ENV,
                                               WS_GPU_PLANS)
    row = {"part": part, **case}
    B, S, H, D, causal = case["B"], case["S"], case["H"], case["D"], case["causal"]
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=part == "backward")
               for _ in range(3))
    impls = {"tessera": lambda q, k, v, causal: attention(q, k, v, causal=causal)[0]}
    if part == "forward" and torch.cuda.get_device_capability()[0] == 9:
        for who, (ws, overlap, pingpong, persistent) in HOPPER_FORWARDS.items():
            if (ws == "0" or D in WS_GPU_PLANS) and (overlap == "0" or D in OVERLAP_HEAD_DIMS):
                impls[who] = with_env(impls["tessera"], {WS_ENV: ws, OVERLAP_ENV: overlap, PINGPONG_ENV: pingpong,
                                                         PERSISTENT_ENV: persistent})
    if part == "backward" and torch.cuda.get_device_capability()[0] == 9:
        impls.update({who: impls["tessera"] for who in HOPPER_BACKWARDS})
    impls.update({backend: sdpa(torch, backend) for backend in SDPA_BACKENDS})
    flops = forward_flops(case) * (2.5 if part == "backward" else 1.0)
    expected = None
    grad = None                 # backward: one dO for every implementation, so their dQ compare
    for who, fn in impls.items():
        try:
            out = fn(q, k, v, causal)
            if part == "forward":
                run = lambda: fn(q, k, v, causal)  # noqa: E731
            else:
                grad = torch.randn_like(out) if grad is None else grad
                run = lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)  # noqa: E731
                run = with_env(run, HOPPER_BACKWARDS[who]) if who in HOPPER_BACKWARDS else run
            result = out if part == "forward" else run()[0]
            if expected is None and who != "tessera":
                expected = result
            row[f"{who}_check"] = result
            timed(torch, row, who, run, flops)
        except Exception as error:          # a backend this GPU or torch lacks, or a shape with no plan
            row[f"{who}_error"] = f"{type(error).__name__}: {error}"[:500]
    _check_all(torch, row, expected)
    return row


def quantized(torch, x):
    """(e4m3 codes, float32 descale) of x, per tensor as FA3's users quantize: descale = amax / 448."""
    descale = (x.abs().amax().float() / 448).clamp_min(1e-12)
    return (x.float() / descale).to(torch.float8_e4m3fn), descale


def fp8_close(torch, got, expected, v, S: int) -> bool:
    """Within the fp8 forward's bound (tests/kernels_lib/test_attention_fp8.py): P rounded to e4m3 moves O by at
    most (2^-4 + S 2^-18) max|v|, plus O's bf16 rounding."""
    bound = (2 ** -4 + S * 2 ** -18) * v.float().abs().max() + 2 ** -8 * expected.float().abs() + 1e-3
    return bool(((got.float() - expected.float()).abs() <= bound).all())


def measure_fp8(torch, case: dict) -> dict:
    """One fp8 row: tessera's fp8 forward, its bf16 forward and SDPA cuDNN's on the dequantized values, the fp8
    output checked against SDPA flash's."""
    from tessera.kernels_lib import attention
    row = {"part": "fp8", **case}
    B, S, H, D, causal = case["B"], case["S"], case["H"], case["D"], case["causal"]
    codes = [quantized(torch, torch.randn(B, S, H, D, device="cuda")) for _ in range(3)]
    real = [(c.float() * d).to(torch.bfloat16) for c, d in codes]
    (q8, dq), (k8, dk), (v8, dv) = codes
    impls = {"tessera": lambda: attention(q8, k8, v8, causal=causal, q_descale=dq, k_descale=dk, v_descale=dv)[0],
             "tessera_bf16": lambda: attention(*real, causal=causal)[0],
             "cudnn": lambda: sdpa(torch, "cudnn")(*real, causal)}
    expected = sdpa(torch, "flash")(*real, causal)
    for who, fn in impls.items():
        try:
            out = fn()
            if not (fp8_close(torch, out, expected, real[2], S) if who == "tessera" else close(torch, out, expected)):
                row[f"{who}_wrong"] = f"max abs error {float((out.float() - expected.float()).abs().max()):.3g}"
                continue
            timed(torch, row, who, fn, forward_flops(case))
        except Exception as error:
            row[f"{who}_error"] = f"{type(error).__name__}: {error}"[:500]
    for other in ("tessera_bf16", "cudnn"):
        if "tessera_tflops" in row and f"{other}_tflops" in row:
            row[f"vs_{other}"] = row["tessera_tflops"] / row[f"{other}_tflops"]
    return row


def _check_all(torch, row: dict, expected) -> None:
    """Replace each `<who>_check` output by its verdict: timings of a wrong output are dropped."""
    for key in [k for k in row if k.endswith("_check")]:
        who, got = key[:-len("_check")], row.pop(key)
        if expected is not None and not close(torch, got, expected):
            row[f"{who}_wrong"] = f"max abs error {float((got.float() - expected.float()).abs().max()):.3g}"
            row.pop(f"{who}_tflops", None)
    for backend in SDPA_BACKENDS:
        if "tessera_tflops" in row and f"{backend}_tflops" in row:
            row[f"vs_{backend}"] = row["tessera_tflops"] / row[f"{backend}_tflops"]
    for ratio, (faster, base) in {"ws_vs_plain": ("ws", "plain"), "overlap_vs_plain": ("plain_overlap", "plain"),
                                  "overlap_vs_ws": ("ws_overlap", "ws"),
                                  "pingpong_vs_overlap": ("ws_pingpong", "ws_overlap"),
                                  "persistent_vs_ws": ("ws_persistent", "ws"),
                                  "persistent_vs_overlap": ("ws_overlap_persistent", "ws_overlap")}.items():
        if f"tessera_{faster}_tflops" in row and f"tessera_{base}_tflops" in row:
            row[ratio] = row[f"tessera_{faster}_tflops"] / row[f"tessera_{base}_tflops"]
    if row.get("part") == "backward" and "tessera_overlap_tflops" in row and "tessera_tflops" in row:
        row["bwd_overlap_vs_fa2"] = row["tessera_overlap_tflops"] / row["tessera_tflops"]


def paged_cache(torch, case: dict, device="cuda"):
    """q, k_cache, v_cache, block_table (each sequence's pages scattered over the cache), cache_seqlens, and
    the keys and values gathered contiguously as (B, H_KV, context, D) for the references."""
    B, context, H, H_kv, D, page = (case[k] for k in ("B", "context", "H", "H_kv", "D", "page"))
    per_sequence = math.ceil(context / page)
    k_cache = torch.randn(B * per_sequence, page, H_kv, D, device=device, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(B * per_sequence, device=device).reshape(B, per_sequence).int()
    q = torch.randn(B, 1, H, D, device=device, dtype=torch.bfloat16)
    seqlens = torch.full((B,), context, dtype=torch.int32, device=device)

    def gathered(cache):
        return cache[table.long()].flatten(1, 2)[:, :context].transpose(1, 2).contiguous()
    return (q, k_cache, v_cache, table, seqlens), gathered(k_cache), gathered(v_cache)


def plain_decode(torch, q, k, v):
    """softmax(q k^T / sqrt(D)) v in eager torch, GQA by grouping the query heads: (B, 1, H, D)."""
    B, _, H, D = q.shape
    H_kv = k.shape[1]
    grouped = q.reshape(B, H_kv, H // H_kv, D)
    p = torch.softmax((grouped @ k.transpose(-1, -2)).float() / math.sqrt(D), dim=-1).to(q.dtype)
    return (p @ v).reshape(B, 1, H, D)


def sdpa_decode(torch, q, k, v):
    """SDPA (whichever backend it picks) over the gathered keys, GQA through enable_gqa."""
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k, v, enable_gqa=True)
    return o.transpose(1, 2)


def modelled_decode(case: dict) -> dict:
    """The decode model's figures for the online plan this row launches (tessera.kernels_lib.attention_decode_model,
    with this GPU's constants, `gpus.py`; the reference H100 SXM's without a GPU): its microseconds in a graph and
    share of HBM, to set beside the measured ones; for the merge it picks (model_*) and for each merge at its own
    best split count (model_in_launch_*, model_two_launch_*)."""
    import torch

    from tessera.kernels_lib import attention_decode_model as model, gpus
    from tessera.kernels_lib.attention_decode import DecodeShape, gpu_decode_plan
    shape = DecodeShape(case["B"], 1, case["H"], case["H_kv"], case["D"], case["page"], case["context"] // case["page"])
    plan = gpu_decode_plan(case["D"], False, "nvidia")
    rows, keys = shape.tile(plan)
    decode = model.Decode(case["B"], case["H"], case["H_kv"], case["D"], case["context"])
    tile = model.Tile(rows, keys, plan.stages, plan.num_warps(rows), merge_registers=plan.merge_registers,
                      in_launch=rows <= plan.in_launch_rows, merge_early=plan.merge_early)
    gpu = gpus.of(torch.device("cuda", 0)) if torch.cuda.is_available() else model.REFERENCE
    splits, in_launch = model.plan_for(decode, tile, gpu.sms, None, gpu)
    cost = model.modelled(decode, tile, splits, gpu.sms, in_launch, gpu)
    row = {"model_us": cost.total, "model_hbm_share": cost.hbm_share, "model_splits": splits,
           "model_merge": "in_launch" if in_launch else "two_launch"}
    for merge, flag in (("in_launch", True), ("two_launch", False)):
        s, merged_in_launch = model.plan_for(decode, tile, gpu.sms, flag, gpu)
        row[f"model_{merge}_us"] = model.modelled(decode, tile, s, gpu.sms, merged_in_launch, gpu).total
        row[f"model_{merge}_splits"] = s
    return row


MERGES = {"tessera_in_launch": "0", "tessera_two_launch": "1"}    # $TESSERA_DECODE_SEPARATE_COMBINE for each


def with_merge(value: str, fn):
    """`fn` run with $TESSERA_DECODE_SEPARATE_COMBINE = value (read by the op on every call, so also while a
    CUDA graph captures it), the variable restored after."""
    def run():
        before = os.environ.get("TESSERA_DECODE_SEPARATE_COMBINE")
        os.environ["TESSERA_DECODE_SEPARATE_COMBINE"] = value
        try:
            return fn()
        finally:
            if before is None:
                del os.environ["TESSERA_DECODE_SEPARATE_COMBINE"]
            else:
                os.environ["TESSERA_DECODE_SEPARATE_COMBINE"] = before
    return run


def measure_decode(torch, case: dict, peak_gbps) -> dict:
    """One decode row: tessera (online softmax; unified max) against SDPA and the plain reference."""
    from tessera.kernels_lib import attention_decode
    row = {"part": "decode", **case}
    tensors, k, v = paged_cache(torch, case)
    q = tensors[0]
    impls = {"tessera": lambda: attention_decode(*tensors)[0],
             # the splits merged in the split launch, and by a second kernel: side by side in the same run
             **{who: with_merge(value, lambda: attention_decode(*tensors)[0]) for who, value in MERGES.items()},
             # random unit-variance logits: the largest of a row lies near 4 (its estimate from statistics)
             "tessera_unified": lambda: attention_decode(*tensors, unified_max=4.0)[0],
             "sdpa": lambda: sdpa_decode(torch, q, k, v), "plain": lambda: plain_decode(torch, q, k, v)}
    expected = plain_decode(torch, q, k, v)
    moved = decode_bytes(case)
    for who, fn in impls.items():
        try:
            got = fn()
            if not close(torch, got, expected):
                row[f"{who}_wrong"] = f"max abs error {float((got.float() - expected.float()).abs().max()):.3g}"
                continue
            row[f"{who}_us"] = gpu_common.device_ms(fn, torch) * 1e3
            row[f"{who}_graph_us"] = gpu_common.graph_ms(fn, torch) * 1e3
            row[f"{who}_gbps"] = moved / (row[f"{who}_graph_us"] * 1e-6) / 1e9
        except Exception as error:
            row[f"{who}_error"] = f"{type(error).__name__}: {error}"[:500]
    row.update(modelled_decode(case))
    if "tessera_gbps" in row and peak_gbps:
        row["hbm_share"] = row["tessera_gbps"] / peak_gbps
    if "tessera_graph_us" in row and "sdpa_graph_us" in row:
        row["vs_sdpa"] = row["sdpa_graph_us"] / row["tessera_graph_us"]
    return row


def describe(row: dict) -> str:
    """One line per row for the log."""
    if row["part"] == "decode":
        head = f"decode B={row['B']:>2} context={row['context']:>6}: "
        parts = [f"{who} {row[who + '_graph_us']:.1f} us ({row[who + '_gbps']:.0f} GB/s)"
                 for who in ("tessera", *MERGES, "tessera_unified", "sdpa", "plain") if who + "_graph_us" in row]
        parts += [f"{k} {row[k]}" for k in row if k.endswith(("_error", "_wrong"))]
        parts.append(f"model {row['model_us']:.1f} us ({row['model_hbm_share']:.0%}, {row['model_merge']}; in launch "
                     f"{row['model_in_launch_us']:.1f}, two launches {row['model_two_launch_us']:.1f})"
                     if "model_us" in row else "")
        return head + "; ".join(p for p in parts if p) + (f"; {row['hbm_share']:.0%} of HBM" if "hbm_share" in row
                                                          else "")
    head = (f"{row['part']:>8} B={row['B']:>2} S={row['S']:>5} H={row['H']:>2} D={row['D']:>3} "
            f"{'causal' if row['causal'] else 'full  '}: ")
    whos = (("tessera", "tessera_bf16", "cudnn") if row["part"] == "fp8"
            else ("tessera", *HOPPER_FORWARDS, *HOPPER_BACKWARDS, *SDPA_BACKENDS))
    parts = [f"{who} {row[who + '_tflops']:.0f}" for who in whos if who + "_tflops" in row]
    parts += [f"{k} {row[k]}" for k in row if k.endswith(("_error", "_wrong"))]
    return head + ", ".join(parts) + " TFLOP/s" + (f" ({row['vs_cudnn']:.2f}x cuDNN)" if "vs_cudnn" in row else "")


def label(row: dict) -> str:
    if row["part"] == "decode":
        return f"decode B{row['B']} ctx{row['context']}"
    return f"{row['part'][:3]} D{row['D']} S{row['S']}{' c' if row['causal'] else ''}"


def plot(rows: list[dict], path) -> None:
    """tessera's speed over cuDNN's (forward, backward) and over SDPA's (decode), per row."""
    gpu_common.ratio_plot(path, [label(r) for r in rows],
                          {"tessera / cuDNN (decode: / SDPA)": [r.get("vs_cudnn", r.get("vs_sdpa", 0.0)) for r in rows],
                           "tessera / SDPA flash": [r.get("vs_flash", 0.0) for r in rows]}, "speedup")


def run(parts: list[str], budget_s: float | None) -> dict:
    """Measure the parts' rows in order until the budget is spent, recording each row as it is done."""
    from quant_gemm import hbm_gbps
    torch = gpu_common.require_gpu()
    peak = hbm_gbps(torch.cuda.get_device_name())
    result = {"environment": gpu_common.environment(torch), "hbm_gbps": peak, "rows": [], "not_run": 0}
    start = time.monotonic()
    for part, case in schedule(parts):
        if budget_s is not None and time.monotonic() - start > budget_s:
            result["not_run"] += 1
            continue
        try:
            if part == "decode":
                row = measure_decode(torch, case, peak)
            else:
                row = measure_fp8(torch, case) if part == "fp8" else measure_dense(torch, part, case)
        except Exception as error:          # recorded, not fatal: the next rows still run
            row = {"part": part, **case, "error": f"{type(error).__name__}: {error}"[:2000]}
        torch.cuda.empty_cache()
        result["rows"].append(row)
        gpu_common.record("attention", row)
        gpu_common.write("attention", result)
        print(describe(row), flush=True)
    if result["not_run"]:
        print(f"budget of {budget_s:.0f} s spent: {result['not_run']} rows not run", flush=True)
    plot(result["rows"], gpu_common.results_dir() / "attention.png")
    return result


def dry_run(parts: list[str]) -> None:
    """The plan, and each part once at a tiny size on the CPU interpreter against the references the GPU rows
    use (so a broken benchmark is found before GPU time is spent)."""
    import torch

    from tessera.kernels_lib import attention, attention_decode
    for part in parts:
        rows = cases(part)
        print(f"attention {part}: {len(rows)} rows; first {rows[0]}, last {rows[-1]}")
    q, k, v = (torch.randn(1, 48, 2, 32, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    if "forward" in parts or "backward" in parts:
        out = attention(q, k, v, causal=True)[0]
        expected = torch.nn.functional.scaled_dot_product_attention(
            *(x.float().transpose(1, 2) for x in (q, k, v)), is_causal=True).transpose(1, 2)
        assert close(torch, out, expected), "forward on the interpreter disagrees with SDPA"
        print(f"attention forward on the CPU interpreter: {forward_flops(dict(B=1, S=48, H=2, D=32, causal=True)):.0f}"
              " FLOP, matches SDPA")
    if "backward" in parts:
        grad = torch.randn_like(out)
        ours = torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
        theirs = torch.autograd.grad(expected, (q, k, v), grad.float())
        assert all(close(torch, a, b) for a, b in zip(ours, theirs)), "backward disagrees with SDPA's"
        for who, settings in HOPPER_BACKWARDS.items():
            ours = with_env(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), settings)()
            assert all(close(torch, a, b) for a, b in zip(ours, theirs)), f"{who}'s backward disagrees with SDPA's"
        print("attention backward on the CPU interpreter: dQ, dK, dV match SDPA's (and in each Hopper order: "
              f"{', '.join(HOPPER_BACKWARDS)})")
    if "decode" in parts:
        case = dict(B=2, context=40, H=4, H_kv=2, D=32, page=16)
        tensors, k_gathered, v_gathered = paged_cache(torch, case, device="cpu")
        expected = plain_decode(torch, tensors[0], k_gathered, v_gathered)
        merged = {who: with_merge(value, lambda: attention_decode(*tensors, num_splits=2)[0])()
                  for who, value in MERGES.items()}
        assert torch.equal(*merged.values()), "decode's two merges disagree"
        for name, got in (("online", attention_decode(*tensors)[0]), *merged.items(),
                          ("unified max", attention_decode(*tensors, unified_max=4.0)[0]),
                          ("sdpa", sdpa_decode(torch, tensors[0], k_gathered, v_gathered))):
            assert close(torch, got, expected), f"decode ({name}) disagrees with the plain reference"
        print(f"attention decode on the CPU interpreter: {decode_bytes(case)} bytes a step, online (its splits "
              "merged in the launch and by a second kernel: the same bits) and unified max match the plain "
              "reference and SDPA")
    if "fp8" in parts:
        codes = [quantized(torch, torch.randn(1, 48, 2, 32)) for _ in range(3)]
        real = [(c.float() * d).to(torch.bfloat16) for c, d in codes]
        (q8, dq), (k8, dk), (v8, dv) = codes
        out = attention(q8, k8, v8, causal=True, q_descale=dq, k_descale=dk, v_descale=dv)[0]
        expected = torch.nn.functional.scaled_dot_product_attention(
            *(x.float().transpose(1, 2) for x in real), is_causal=True).transpose(1, 2)
        assert fp8_close(torch, out, expected, real[2], 48), "the fp8 forward disagrees with SDPA"
        print("attention fp8 forward on the CPU interpreter: within fp8's bound of SDPA")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", action="append", choices=PARTS, help="what to measure (default: all)")
    parser.add_argument("--budget", type=float, help="seconds after which no new row starts (default: none)")
    parser.add_argument("--dry-run", action="store_true", help="the plan and a CPU check, no GPU needed")
    args = parser.parse_args()
    parts = [p for p in PARTS if p in (args.part or PARTS)]
    if args.dry_run:
        dry_run(parts)
        return
    run(parts, args.budget)


if __name__ == "__main__":
    main()
