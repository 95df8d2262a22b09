"""Weight-quantized GEMM (tessera.kernels_lib.quant_gemm) against cuBLAS fp16 (torch.matmul), in one run.

    python bench/quant_gemm.py                    # every part: needs an NVIDIA GPU and torch
    python bench/quant_gemm.py --part w4a16       # one format
    python bench/quant_gemm.py --dry-run          # the plan, and one tiny product on the CPU interpreter

y = x @ W^T for Llama-style (N, K) in {(4096, 4096), (14336, 4096), (4096,
14336)} and M in {1, 16, 64, 256, 4096}. Parts (`--part`, repeatable):
w4a16 (4-bit, symmetric, groups of 128) on every shape, and at M in {1,
16} the same with the codes stored in the decode kernel's mma fragment
order (w4a16-fragment: `quant.pack(layout="fragment")`); w8a16, w3a16,
w2a16, mxfp4, nvfp4 and w4a8 (fp8 activations) at M in {1, 16} on the first
two (N, K). The reference is the same product with the dequantized weight in
float16 through torch.matmul (what a user would otherwise run), and each row
is checked against it before it is timed (a mismatch is recorded with
`tessera.testing.diagnose`'s description, not timed).

Each side is timed per eager call and per call inside a CUDA graph (the
kernels alone). A row reports TFLOP/s, the speedup over cuBLAS, and the
bytes the kernel must move (weights, scales, activations, output) per
second, also as a share of the GPU's HBM bandwidth (`HBM_GBPS`; the decode
rows are memory-bound, so that share is their roofline). Rows go to
$TESSERA_RESULTS_JSONL as they are measured; the run writes quant_gemm.json
and, with matplotlib, quant_gemm.png (speedup over cuBLAS per row).
Goals (issue 15, H100/H200): W4A16 >= 3.5x cuBLAS fp16 and >= 85% of HBM
bandwidth at M <= 16; >= 0.9x cuBLAS at M = 4096.
"""

from __future__ import annotations

import argparse

import gpu_common

LLAMA_NK = [(4096, 4096), (14336, 4096), (4096, 14336)]
ALL_M = [1, 16, 64, 256, 4096]
# part: (format, bits, group, activations); w4a16 runs every shape, the others M in {1, 16} on two (N, K).
PARTS = {
    "w4a16": ("int", 4, 128, "f16"), "w4a16-fragment": ("int", 4, 128, "f16"), "w8a16": ("int", 8, 128, "f16"),
    "w3a16": ("int", 3, 128, "f16"),
    "w2a16": ("int", 2, 64, "f16"), "mxfp4": ("mxfp4", 4, 32, "bf16"), "nvfp4": ("nvfp4", 4, 16, "bf16"),
    "w4a8": ("int", 4, 128, "fp8"),
}
HBM_GBPS = {"H200": 4800, "H100 SXM": 3350, "H100 80GB HBM3": 3350, "H100 PCIe": 2000, "H100": 3350,
            "A100-SXM4-80GB": 2039, "A100": 1555, "L40S": 864}


def shapes(part: str) -> list[tuple[int, int, int]]:
    if part == "w4a16":
        return [(m, n, k) for n, k in LLAMA_NK for m in ALL_M]
    if part == "w4a16-fragment":        # the decode path it is for, beside w4a16's rows of the same shapes
        return [(m, n, k) for n, k in LLAMA_NK for m in (1, 16)]
    return [(m, n, k) for n, k in LLAMA_NK[:2] for m in (1, 16)]


def hbm_gbps(device_name: str) -> float | None:
    """The GPU's peak HBM bandwidth from its name (None when unknown)."""
    for key, gbps in HBM_GBPS.items():
        if key in device_name:
            return gbps
    return None


def random_weight(torch, part: str, n: int, k: int):
    """A QuantizedWeight of random codes on the GPU (values do not matter for timing), and its dequantized
    float16 weight [N, K] computed on the GPU (the reference)."""
    from tessera.kernels_lib.quant import QuantizedWeight

    format, bits, group, _ = PARTS[part]
    qweight = torch.randint(0, 256, (n, k * bits // 8), dtype=torch.uint8, device="cuda")
    codes = _codes(torch, qweight, bits, k)
    layout = "fragment" if part.endswith("-fragment") else "plain"
    if layout == "fragment":
        codes = _from_fragment_order(torch, codes)
    if format == "int":
        scales = (torch.rand(n, k // group, device="cuda") * 0.01 + 0.001).half()
        w = QuantizedWeight(qweight, scales, None, None, bits, group, layout=layout)
        dequantized = (codes.float() - 2 ** (bits - 1)) * scales.float().repeat_interleave(group, 1)
        return w, dequantized.half()
    fp4 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], device="cuda")
    if format == "mxfp4":
        scale_bits = torch.randint(118, 126, (n, k // group), dtype=torch.uint8, device="cuda")
        scale = torch.exp2(scale_bits.float() - 127)
        global_scale = 1.0
    else:
        scale = torch.rand(n, k // group, device="cuda") * 0.02 + 0.001
        scale_bits = scale.to(torch.float8_e4m3fn).view(torch.uint8)
        scale, global_scale = scale_bits.view(torch.float8_e4m3fn).float(), 0.5
    w = QuantizedWeight(qweight, scale_bits, None, None, 4, group, format, global_scale)
    dequantized = fp4[codes] * scale.repeat_interleave(group, 1) * global_scale
    return w, dequantized.to(torch.bfloat16)


def _codes(torch, packed, bits: int, k: int):
    """The codes of each row's little-endian bit stream, unpacked on the GPU: int64 [N, K]."""
    stream = (packed[..., None] >> torch.arange(8, device=packed.device, dtype=torch.uint8)) & 1
    digits = stream.reshape(packed.shape[0], k, bits).to(torch.int64)
    return (digits << torch.arange(bits, device=packed.device)).sum(-1)


def _from_fragment_order(torch, stored):
    """W's codes [N, K] from codes stored in fragment order (`quant_fragment.DECODE_TILING`), on the GPU."""
    from tessera.kernels_lib.quant_fragment import DECODE_TILING as t

    n, k = stored.shape
    rows, cols = (torch.from_numpy(a).cuda() for a in t.source)
    blocks = torch.empty(n // t.BN, k // t.BK, t.BN, t.BK, dtype=stored.dtype, device=stored.device)
    blocks[:, :, rows, cols] = stored.reshape(n // t.BN, k // t.BK, t.threads, t.locals)
    return blocks.permute(0, 2, 1, 3).reshape(n, k)


def measure(torch, part: str, m: int, n: int, k: int, peak_gbps) -> dict:
    """One row: check, then time tessera and cuBLAS fp16 (eager and in a CUDA graph)."""
    from tessera.kernels_lib.quant_gemm import quant_gemm
    from tessera.testing import diagnose

    _, bits, group, activations = PARTS[part]
    w, dequantized = random_weight(torch, part, n, k)
    x = torch.randn(m, k, device="cuda")
    row = {"part": part, "m": m, "n": n, "k": k}
    if activations == "fp8":
        x_scale = x.abs().amax(1) / 448
        x8 = (x / x_scale[:, None]).to(torch.float8_e4m3fn)
        ours = lambda: quant_gemm(x8, w, x_scale)  # noqa: E731
        x_ref = (x8.float() * x_scale[:, None]).half()
    else:
        x_ref = x.to(torch.bfloat16 if activations == "bf16" else torch.float16)
        ours = lambda: quant_gemm(x_ref, w)  # noqa: E731
    w16 = dequantized.to(x_ref.dtype)
    theirs = lambda: torch.nn.functional.linear(x_ref, w16)  # noqa: E731
    expected = theirs().float()
    got = ours().float()
    torch.cuda.synchronize()
    tolerance = dict(rtol=2e-2, atol=2e-2 * float(expected.abs().max()))
    if not torch.allclose(got, expected, **tolerance):
        row["wrong"] = diagnose(got, expected, name=f"quant_gemm {part}", **tolerance)
        return row
    flops = 2 * m * n * k
    weight_bytes = n * k * bits // 8 + w.scales.numel() * w.scales.element_size()
    moved = weight_bytes + x.numel() * (1 if activations == "fp8" else 2) + m * n * 2
    for who, fn in (("cublas", theirs), ("tessera", ours)):
        seconds = gpu_common.device_ms(fn, torch) * 1e-3
        row[f"{who}_tflops"] = flops / seconds / 1e12
        try:
            row[f"{who}_graph_tflops"] = flops / (gpu_common.graph_ms(fn, torch) * 1e-3) / 1e12
        except Exception as error:
            row[f"{who}_graph_error"] = f"{type(error).__name__}: {error}"[:500]
    row["speedup"] = row["tessera_tflops"] / row["cublas_tflops"]
    if "tessera_graph_tflops" in row and "cublas_graph_tflops" in row:
        row["graph_speedup"] = row["tessera_graph_tflops"] / row["cublas_graph_tflops"]
        row["graph_gbps"] = moved / (flops / (row["tessera_graph_tflops"] * 1e12)) / 1e9
        if peak_gbps:
            row["hbm_share"] = row["graph_gbps"] / peak_gbps
    return row


def describe(row: dict) -> str:
    head = f"{row['part']:>6} {row['m']:>5} x {row['n']:>5} x {row['k']:>5}: "
    if "error" in row or "wrong" in row:
        return head + (("ERROR " + row["error"]) if "error" in row else ("WRONG " + row["wrong"]))
    text = (f"tessera {row['tessera_tflops']:7.2f} TFLOP/s, cuBLAS fp16 {row['cublas_tflops']:7.2f} "
            f"({row['speedup']:.2f}x)")
    if "graph_speedup" in row:
        text += f"; in a graph {row['graph_speedup']:.2f}x, {row['graph_gbps']:.0f} GB/s"
        if "hbm_share" in row:
            text += f" ({row['hbm_share']:.0%} of HBM)"
    return head + text


def plot(rows: list[dict], path) -> None:
    gpu_common.ratio_plot(path, [f"{r['part']} {r['m']}x{r['n']}x{r['k']}" for r in rows],
                          {"per eager call": [r.get("speedup", 0.0) for r in rows],
                           "in a CUDA graph": [r.get("graph_speedup", 0.0) for r in rows]}, "tessera / cuBLAS fp16")


def dry_run(parts: list[str]) -> None:
    """The plan, and one tiny product on the CPU interpreter (what the rows call, checked to run)."""
    import torch

    from tessera.kernels_lib import quant
    from tessera.kernels_lib.quant_gemm import fragment_plan, plan, quant_gemm

    for part in parts:
        rows = shapes(part)
        plans = {(m, n, k): plan(m, n, k, PARTS[part][2], 132, PARTS[part][3] == "fp8") for m, n, k in rows}
        if part.endswith("-fragment"):
            plans = {(m, n, k): fragment_plan(p, m, k) for (m, n, k), p in plans.items()}
        print(f"quant_gemm {part}: {len(rows)} shapes; e.g. {rows[0]} -> {plans[rows[0]]}")
    for layout in ("plain", "fragment"):
        w = quant.quantize(torch.randn(64, 128), bits=4, group_size=64, layout=layout)
        x = torch.randn(2, 128).half()
        expected = x.float() @ w.dequantize().t()
        error = ((quant_gemm(x, w).float() - expected).abs().max() / expected.abs().max()).item()
        print(f"quant_gemm ({layout} codes) on the CPU interpreter: max relative error {error:.2e}")
        assert error < 2e-3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", action="append", choices=list(PARTS), help="what to measure (default: all)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU needed)")
    args = parser.parse_args()
    parts = args.part or list(PARTS)
    if args.dry_run:
        dry_run(parts)
        return
    torch = gpu_common.require_gpu()
    peak = hbm_gbps(torch.cuda.get_device_name())
    result = {"environment": gpu_common.environment(torch), "hbm_gbps": peak, "rows": []}
    for part in parts:
        for m, n, k in shapes(part):
            try:
                row = measure(torch, part, m, n, k, peak)
            except Exception as error:          # recorded, not fatal: the next rows still run
                row = {"part": part, "m": m, "n": n, "k": k, "error": f"{type(error).__name__}: {error}"[:2000]}
            result["rows"].append(row)
            gpu_common.record("quant_gemm", row)
            print(describe(row), flush=True)
    gpu_common.write("quant_gemm", result)
    plot(result["rows"], gpu_common.results_dir() / "quant_gemm.png")


if __name__ == "__main__":
    main()
