"""The MoE layer (tessera.kernels_lib.moe) against torch reference layers and Triton's fused MoE, in one run.

    python bench/moe.py                          # every model and token count: needs an NVIDIA GPU and torch
    python bench/moe.py --model mixtral --tokens 1 --tokens 4096
    python bench/moe.py --dry-run                # the plans, and one small layer on the CPU interpreter

Models (`--model`, repeatable): Mixtral-8x7B (hidden 4096, intermediate
14336, 8 experts, top-2, softmax), DeepSeek-V3 (7168, 2048, 256 experts,
top-8, sigmoid scores with a correction bias, 8 groups of which 4 are
kept, scaling 2.5) and Qwen3-30B-A3B (2048, 768, 128 experts, top-8), at
1, 16, 64, 512 and 4096 tokens (`--tokens`), bf16. Each side maps (x [T, H],
router logits [T, E]) to the layer's output, routing included:

* torch-loop: torch top-k, then a loop over the experts (index_select,
  three matmuls, index_add) -- the reference layer;
* torch-grouped-mm: torch top-k, tokens sorted by expert, `torch._grouped_mm`
  for gate/up and down (where this torch and GPU have it);
* triton: vLLM's (or SGLang's) Triton `fused_experts`, if importable;
* tessera: `route` + `experts` (routing, alignment, permute, gate_up, down, combine);
* tessera-one-launch: the same in one persistent kernel (`moe.persistent.moe_layer`: tickets from a device
  counter, the grid sized by the occupancy query), where launches dominate at 1-64 tokens;
* tessera-int4, tessera-fp8: the same with the experts quantized (int4 groups of 128; fp8 e4m3 with
  DeepSeek-V3's 128 x 128 block scales), each checked against the loop over its dequantized weights, with
  the bytes of its codes and scales per second (`tessera-int4_graph_gbps`); tessera-w8a8: the fp8 weights
  times fp8 activations quantized per token group (sm_89 and newer), against a float64 loop that quantizes
  x and h exactly as the op does, within an allowance derived from accumulation order and fp8 rounding
  (`W8A8Reference`; not the bf16 loop: activation quantization alone moves a few outputs per thousand
  past its 3%).

Every side is checked against torch-loop fed tessera's routing before it is
timed (a mismatch is recorded with `tessera.testing.diagnose`'s description),
then timed per eager call and per call inside a CUDA graph (torch-loop
syncs with the host each expert and is not captured). A row reports ms,
TFLOP/s (2 * T * top_k * 3 * H * I), the speedup over torch-grouped-mm (else
torch-loop), and, from the graph time, the bytes of the experts the tokens
reach (their weights read once) per second as a share of HBM
(`quant_gemm.HBM_GBPS`). Rows go to $TESSERA_RESULTS_JSONL as measured; the
run writes moe.json and, with matplotlib, moe.png.
Goals (issue 17, H100/H200): >= 1.5x torch-grouped-mm at prefill, >= 80% of HBM at decode.
"""

from __future__ import annotations

import argparse

import gpu_common
import moe_references as refs
from quant_gemm import hbm_gbps

MODELS = {  # hidden, intermediate, experts, top_k, routing options
    "mixtral": (4096, 14336, 8, 2, dict(scoring="softmax")),
    "deepseek_v3": (7168, 2048, 256, 8, dict(scoring="sigmoid", n_group=8, topk_group=4, scaling_factor=2.5)),
    "qwen3": (2048, 768, 128, 8, dict(scoring="softmax")),
}
TOKENS = [1, 16, 64, 512, 4096]


def weights_of(torch, model: str, device: str = "cuda", dtype=None) -> dict:
    """Random weights (bf16) in both layouts (gate/up concatenated for the references, interleaved for
    tessera), and the correction bias where the model has one."""
    from tessera.kernels_lib.moe import interleave_gate_up

    H, I, E, _, options = MODELS[model]
    dtype = dtype or torch.bfloat16
    w1, w3 = (torch.randn(E, I, H, device=device, dtype=dtype) * H ** -0.5 for _ in range(2))
    w = {"w13_cat": torch.cat([w1, w3], 1), "w2": torch.randn(E, H, I, device=device, dtype=dtype) * I ** -0.5}
    w["w13"] = interleave_gate_up(w1, w3)
    w["bias"] = torch.randn(E, device=device) * 0.01 if options["scoring"] == "sigmoid" else None
    return w


QUANTIZED = {      # name -> quantize_experts options, bytes read per weight (codes and scales)
    "int4": (dict(format="int4", group_size=128), 0.5 + 2 / 128),
    "fp8": (dict(format="fp8", scales="block"), 1 + 4 / 128),
}
SIDE_BYTES = {"int4": QUANTIZED["int4"][1], "fp8": QUANTIZED["fp8"][1], "w8a8": QUANTIZED["fp8"][1]}


def quantized_weights(torch, w: dict, chunk: int = 16, group: int = 128) -> dict:
    """name -> (w13, w2) as QuantizedExperts, quantized on the GPU from w's bf16 weights `chunk` experts at a
    time (float32 copies of all of DeepSeek-V3's experts at once would not fit); `group`: the int4 group and
    fp8 block size (smaller for the dry run's tiny layers)."""
    from tessera.kernels_lib.moe import quantize_experts
    from tessera.kernels_lib.moe.quantized import QuantizedExperts, interleave

    def quantized(t, options):
        sized = {**options, "group_size" if options["format"] == "int4" else "block": group}
        parts = [quantize_experts(t[i:i + chunk], **sized) for i in range(0, t.shape[0], chunk)]
        cat = (lambda name: None if getattr(parts[0], name) is None else torch.cat([getattr(p, name) for p in parts]))
        return QuantizedExperts(cat("qweight"), cat("scales"), cat("zeros"), parts[0].format, parts[0].group_size)

    I = w["w13_cat"].shape[1] // 2
    return {name: (interleave(quantized(w["w13_cat"][:, :I], options), quantized(w["w13_cat"][:, I:], options)),
                   quantized(w["w2"], options)) for name, (options, _) in QUANTIZED.items()}


class Dequantized:
    """Quantized experts as the loop reference reads them (`.shape`, `[e]`), each expert dequantized (to the
    activations' dtype) when asked for (a whole dequantized copy of DeepSeek-V3's experts would not fit beside
    the others); w13's interleaved rows are put back as gate; up."""

    def __init__(self, q, gate_up: bool, dtype):
        self.q, self.gate_up, self.shape, self.dtype = q, gate_up, q.shape, dtype

    def __getitem__(self, e):
        import torch
        w = self.q.dequantize(int(e)).to(self.dtype)
        return torch.cat([w[0::2], w[1::2]]) if self.gate_up else w


def quantized_sides(torch, model: str, w: dict) -> dict:
    """name -> (experts(x, weights, ids), layer(x, logits), the weights its reference loop reads) for the
    tessera layer on w["quantized"]'s int4 (group 128) and fp8 (128 x 128 block) experts, where present."""
    from tessera.kernels_lib.moe import experts, route

    _, _, E, K, options = MODELS[model]
    found = {}
    variants = [(name, name, False) for name in w.get("quantized", {})]
    if "fp8" in w.get("quantized", {}) and w["w2"].is_cuda and torch.cuda.get_device_capability() >= (8, 9):
        variants.append(("w8a8", "fp8", True))          # fp8 activations too (DeepSeek-V3's scheme)
    for side, name, fp8_activations in variants:
        q13, q2 = w["quantized"][name]
        run = dict(fp8_activations=fp8_activations)

        def layer(x, logits, q13=q13, q2=q2, run=run):
            weights, ids, counts, chunks = route(logits, K, bias=w["bias"], **options)
            return experts(x, q13, q2, weights, ids, counts=counts, chunk_counts=chunks, **run)

        reference = (W8A8Reference(q13, q2) if fp8_activations else
                     (Dequantized(q13, True, w["w2"].dtype), Dequantized(q2, False, w["w2"].dtype)))
        found[f"tessera-{side}"] = (lambda x, wt, ids, q13=q13, q2=q2, run=run: experts(x, q13, q2, wt, ids, **run),
                                    layer, reference)
    return found


class W8A8Reference:
    """The W8A8 side's reference: x and h quantized to e4m3 per token and group of 128 exactly as the op
    quantizes them, both GEMMs in float64 over the dequantized codes (`refs.w8a8_layer`), and a per-element
    allowance derived from what accumulation order can change (fp8 rounding of h included). The bf16 loop
    does not quantize the activations: e4m3's 3 mantissa bits put a few outputs per thousand past 3%."""

    def __init__(self, q13, q2):
        self.q13, self.q2 = q13, q2

    def wrong(self, got, x, weights, ids, name: str):
        """None if every element of got is within its allowance, else `diagnose`'s description of the errors
        in units of the allowance."""
        import torch

        from tessera.testing import diagnose
        expected, allowance = refs.w8a8_layer(torch, x, self.q13, self.q2, weights, ids)
        ratio = (got.double() - expected) / allowance
        if bool((ratio.abs() <= 1).all()):
            return None
        return diagnose(ratio, torch.zeros_like(ratio), rtol=0, atol=1, name=f"{name} (error / allowance)")


def sides(torch, model: str, w: dict) -> dict:
    """name -> (experts(x, weights, ids), layer(x, logits): routing included), for every side this machine can
    run; tessera's layer passes route's counts on to the alignment."""
    from tessera.kernels_lib.moe import experts, route
    from tessera.kernels_lib.moe.persistent import moe_layer

    _, _, E, K, options = MODELS[model]

    def tessera_layer(x, logits):
        weights, ids, counts, chunks = route(logits, K, bias=w["bias"], **options)
        return experts(x, w["w13"], w["w2"], weights, ids, counts=counts, chunk_counts=chunks)

    def routed(fn):
        return fn, lambda x, logits: fn(x, *refs.topk(torch, logits, K, w["bias"], **options))

    found = {"torch-loop": routed(lambda x, wt, ids: refs.loop_layer(torch, x, w["w13_cat"], w["w2"], wt, ids))}
    if hasattr(torch, "_grouped_mm"):
        found["torch-grouped-mm"] = routed(lambda x, wt, ids: refs.grouped_mm_layer(torch, x, w["w13_cat"], w["w2"],
                                                                                    wt, ids))
    triton_experts = refs.triton_fused_experts()
    if triton_experts is not None:
        found["triton"] = routed(lambda x, wt, ids: triton_experts(x, w["w13_cat"], w["w2"], wt, ids))
    found["tessera"] = (lambda x, wt, ids: experts(x, w["w13"], w["w2"], wt, ids), tessera_layer)

    def one_launch_layer(x, logits):
        return moe_layer(x, w["w13"], w["w2"], logits, K, bias=w["bias"], **options)[0]

    found["tessera-one-launch"] = (lambda x, wt, ids: experts(x, w["w13"], w["w2"], wt, ids, one_launch=True),
                                   one_launch_layer)
    return found


def measure(torch, model: str, tokens: int, w: dict, peak_gbps) -> dict:
    """One row: check every side against the loop fed tessera's routing, then time them (the int4 and fp8
    tessera sides against the loop over their weights, dequantized)."""
    from tessera.kernels_lib.moe import route
    from tessera.testing import diagnose

    H, I, E, K, options = MODELS[model]
    x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
    logits = torch.randn(tokens, E, device="cuda")
    weights, ids, _, _ = route(logits, K, bias=w["bias"], **options)
    bf16_expected = refs.loop_layer(torch, x, w["w13_cat"], w["w2"], weights, ids).float()
    tolerance = dict(rtol=3e-2, atol=3e-2 * float(bf16_expected.abs().max()))
    flops = 2 * tokens * K * 3 * H * I
    moved = int(torch.unique(ids).numel()) * 3 * H * I * 2 + 2 * tokens * H * 2
    row = {"model": model, "tokens": tokens}
    everything = {n: (*s, None) for n, s in sides(torch, model, w).items()}
    everything.update(quantized_sides(torch, model, w))
    for name, (given_routing, layer, reference) in everything.items():
        try:
            got = given_routing(x, weights, ids).float()
            if isinstance(reference, W8A8Reference):
                wrong = reference.wrong(got, x, weights, ids, f"moe {name}")
            else:
                expected = bf16_expected if reference is None else \
                    refs.loop_layer(torch, x, *reference, weights, ids).float()   # the same weights, dequantized
                wrong = None if torch.allclose(got, expected, **tolerance) else \
                    diagnose(got, expected, name=f"moe {name}", **tolerance)
            if wrong is not None:
                row[f"{name}_wrong"] = wrong
                continue
            row[f"{name}_ms"] = gpu_common.device_ms(lambda: layer(x, logits), torch, warmup=3, iters=10)
            if name != "torch-loop":
                row[f"{name}_graph_ms"] = gpu_common.graph_ms(lambda: layer(x, logits), torch, calls=5, replays=5)
        except Exception as error:          # recorded, not fatal: the other sides still run
            row[f"{name}_error"] = f"{type(error).__name__}: {error}"[:500]
    summarize(row, flops, moved, peak_gbps)
    active = int(torch.unique(ids).numel())
    for name, per_weight in SIDE_BYTES.items():
        if f"tessera-{name}_graph_ms" in row:
            q_moved = active * 3 * H * I * per_weight + 2 * tokens * H * 2
            row[f"tessera-{name}_graph_gbps"] = q_moved / (row[f"tessera-{name}_graph_ms"] * 1e-3) / 1e9
    return row


def summarize(row: dict, flops: float, moved: int, peak_gbps) -> None:
    """TFLOP/s, speedups over the best torch reference, and the decode bandwidth share, from the times."""
    base = next((n for n in ("torch-grouped-mm", "torch-loop") if f"{n}_ms" in row), None)
    if "tessera_ms" not in row or base is None:
        return
    row["tessera_tflops"] = flops / (row["tessera_ms"] * 1e-3) / 1e12
    row["baseline"] = base
    row["speedup"] = row[f"{base}_ms"] / row["tessera_ms"]
    if "tessera_graph_ms" in row:
        if f"{base}_graph_ms" in row:
            row["graph_speedup"] = row[f"{base}_graph_ms"] / row["tessera_graph_ms"]
        row["graph_gbps"] = moved / (row["tessera_graph_ms"] * 1e-3) / 1e9
        if peak_gbps:
            row["hbm_share"] = row["graph_gbps"] / peak_gbps


def speedup_text(row: dict) -> str:
    """"1.15x torch-grouped-mm per eager call, 0.95x in a graph": each ratio compares tessera with the same
    reference timed the same way (eager with eager, graph with graph); a missing graph time says so rather
    than leaving the eager ratio to stand for both."""
    text = f"{row['speedup']:.2f}x {row['baseline']} per eager call"
    if "graph_speedup" in row:
        return text + f", {row['graph_speedup']:.2f}x in a graph"
    if "tessera_graph_ms" in row:
        return text + f", no {row['baseline']} time in a graph"
    return text


def describe(row: dict) -> str:
    head = f"{row['model']:>11} {row['tokens']:>5} tokens: "
    problems = [f"{k}: {v}" for k, v in row.items() if k.endswith(("_error", "_wrong"))]
    if "speedup" not in row:
        return head + ("; ".join(problems) or "no timing")
    text = f"tessera {row['tessera_ms']:.3f} ms ({row['tessera_tflops']:.1f} TFLOP/s)"
    if "tessera_graph_ms" in row:
        text += f", {row['tessera_graph_ms']:.3f} ms in a graph"
    text += "; " + speedup_text(row)
    if "hbm_share" in row:
        text += f", {row['graph_gbps']:.0f} GB/s ({row['hbm_share']:.0%} of HBM)"
    if "tessera-one-launch_ms" in row:
        text += f"; one launch {row['tessera-one-launch_ms']:.3f} ms"
        if "tessera-one-launch_graph_ms" in row and "tessera_graph_ms" in row:
            text += f" ({row['tessera_graph_ms'] / row['tessera-one-launch_graph_ms']:.2f}x multi-kernel in a graph)"
    for name in SIDE_BYTES:
        if f"tessera-{name}_ms" in row:
            text += f"; {name} {row[f'tessera-{name}_ms']:.3f} ms"
            if f"tessera-{name}_graph_gbps" in row:
                text += f" ({row[f'tessera-{name}_graph_gbps']:.0f} GB/s in a graph)"
    return head + text + ("; " + "; ".join(problems) if problems else "")


def plot(rows: list[dict], path) -> None:
    gpu_common.ratio_plot(path, [f"{r['model']} {r['tokens']}" for r in rows],
                          {"per eager call": [r.get("speedup", 0.0) for r in rows],
                           "in a CUDA graph": [r.get("graph_speedup", 0.0) for r in rows]},
                          "tessera / best torch reference")


def dry_run(models: list[str], tokens: list[int]) -> None:
    """The plans; then each model's routing and every side this machine has, at a small size on the CPU (the
    tessera side on the interpreter), checked as `measure` checks them: the rows' code, run without a GPU."""
    import torch

    from tessera.kernels_lib.moe import plan, route

    for model in models:
        H, I, E, K, options = MODELS[model]
        print(f"moe {model}: " + ", ".join(f"{t} tokens -> BM {plan.plan(t, K, E).BM}" for t in tokens))
        MODELS[f"{model}-tiny"] = (32, 16, 16, min(K, 4), {**options, "topk_group": min(options.get("topk_group", 1), 4)})
        w = weights_of(torch, f"{model}-tiny", device="cpu", dtype=torch.float32)
        x, logits = torch.randn(6, 32), torch.randn(6, 16)
        weights, ids, _, _ = route(logits, min(K, 4), bias=w["bias"], **MODELS[f"{model}-tiny"][4])
        theirs = refs.topk(torch, logits, min(K, 4), w["bias"], **MODELS[f"{model}-tiny"][4])
        assert torch.equal(theirs[1], ids) and torch.allclose(theirs[0], weights), f"{model}: routing differs"
        w["quantized"] = quantized_weights(torch, w, group=16)
        everything = {n: (*s, None) for n, s in sides(torch, f"{model}-tiny", w).items()}
        everything.update(quantized_sides(torch, f"{model}-tiny", w))
        for name, (given_routing, layer, reference) in everything.items():
            expected = refs.loop_layer(torch, x, *(reference or (w["w13_cat"], w["w2"])), weights, ids)
            try:
                error = ((given_routing(x, weights, ids) - expected).abs().max() / expected.abs().max()).item()
                assert layer(x, logits).shape == x.shape
                print(f"  {name}: max relative error {error:.1e} on the CPU")
                assert error < 1e-4
            except (RuntimeError, NotImplementedError) as unsupported:     # e.g. _grouped_mm needs a GPU
                print(f"  {name}: not on the CPU ({type(unsupported).__name__}: {str(unsupported)[:80]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", choices=list(MODELS), help="which models (default: all)")
    parser.add_argument("--tokens", action="append", type=int, help="token counts (default: 1 16 64 512 4096)")
    parser.add_argument("--dry-run", action="store_true", help="print the plans and exit (no GPU needed)")
    args = parser.parse_args()
    models, tokens = args.model or list(MODELS), args.tokens or TOKENS
    if args.dry_run:
        dry_run(models, tokens)
        return
    torch = gpu_common.require_gpu()
    peak = hbm_gbps(torch.cuda.get_device_name())
    result = {"environment": gpu_common.environment(torch), "hbm_gbps": peak, "rows": []}
    for model in models:
        w = weights_of(torch, model)
        w["quantized"] = quantized_weights(torch, w)
        for t in tokens:
            try:
                row = measure(torch, model, t, w, peak)
            except Exception as error:
                row = {"model": model, "tokens": t, "error": f"{type(error).__name__}: {error}"[:2000]}
            result["rows"].append(row)
            gpu_common.record("moe", row)
            print(describe(row), flush=True)
        del w
        torch.cuda.empty_cache()
    gpu_common.write("moe", result)
    plot(result["rows"], gpu_common.results_dir() / "moe.png")


if __name__ == "__main__":
    main()
