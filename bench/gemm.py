"""GEMM throughput of tessera.kernels_lib.gemm against torch.matmul (cuBLAS), in one run.

    python bench/gemm.py                   # needs an NVIDIA GPU and torch

Shapes: square 1024..8192, and LLM projections with M in {1, 16, 64, 128, 256,
1024, 4096} and (N, K) in {(4096, 4096), (14336, 4096), (4096, 14336)}; bf16
in, bf16 out. Then the same shapes in fp8: float8_e4m3fn inputs with float32
per-tensor scales, bf16 out, against torch._scaled_mm (skipped where this torch
lacks it or the GPU has no fp8 GEMM), recorded under "fp8_rows". Then every
shipped config pinned in turn at 4096^3 and 8192^3 (bf16), plus, on Hopper,
each non-persistent one warp-specialized (WS=True), under "config_rows": the
data to tune the shipped configs from. Writes
bench/results/gemm.json and, with matplotlib, gemm.png (the bf16 rows).
Goal (issue 5, H200): >= 95% of cuBLAS at 8192^3, >= cuBLAS for M <= 256.
"""

from __future__ import annotations

import gpu_common

SQUARE = [1024, 2048, 4096, 8192]
LLM_M = [1, 16, 64, 128, 256, 1024, 4096]
LLM_NK = [(4096, 4096), (14336, 4096), (4096, 14336)]


def tflops(m: int, n: int, k: int, ms: float) -> float:
    return 2 * m * n * k / (ms * 1e-3) / 1e12


def fp8_rows(torch, gemm, shapes) -> list[dict] | None:
    """e4m3 x e4m3 with per-tensor scales against torch._scaled_mm; None if torch cannot run it here."""
    fp8 = torch.float8_e4m3fn
    rows = []
    for m, n, k in shapes:
        a = (torch.randn(m, k, device="cuda") / 4).to(fp8)
        b_t = (torch.randn(n, k, device="cuda") / 4).to(fp8)   # _scaled_mm wants op(b) column-major
        scale_a = torch.tensor(0.5, device="cuda")
        scale_b = torch.tensor(2.0, device="cuda")
        theirs = lambda: torch._scaled_mm(a, b_t.t(), scale_a=scale_a, scale_b=scale_b,  # noqa: E731
                                          out_dtype=torch.bfloat16)
        try:
            expected = theirs()
        except (AttributeError, RuntimeError) as error:     # no _scaled_mm, or no fp8 GEMM on this GPU
            print(f"fp8: torch._scaled_mm unavailable ({error}); skipping the fp8 rows")
            return None
        ours = lambda: gemm(a, b_t, None, scale_a, scale_b, trans_b=True)  # noqa: E731
        torch.testing.assert_close(ours().float(), expected.float(), rtol=2e-2, atol=2e-1)
        ours_ms = gpu_common.device_ms(ours, torch)
        theirs_ms = gpu_common.device_ms(theirs, torch)
        rows.append({"m": m, "n": n, "k": k, "tessera_tflops": tflops(m, n, k, ours_ms),
                     "scaled_mm_tflops": tflops(m, n, k, theirs_ms), "ratio": theirs_ms / ours_ms})
        print(f"fp8 {m:>5} x {n:>5} x {k:>5}: tessera {rows[-1]['tessera_tflops']:7.1f}  "
              f"_scaled_mm {rows[-1]['scaled_mm_tflops']:7.1f} TFLOP/s  ({rows[-1]['ratio']:.0%})")
    return rows


def config_rows(torch, sizes) -> list[dict]:
    """TFLOP/s of every shipped config pinned, and on sm_90 of its warp-specialized variant, per size."""
    import tessera
    from tessera.kernels_lib.gemm import CONFIGS, gemm, gemm_kernel

    variants = list(CONFIGS)
    if torch.cuda.get_device_capability() == (9, 0):
        variants += [tessera.Config(dict(c.kwargs, WS=True), num_warps=c.num_warps)
                     for c in CONFIGS if not c.kwargs["PERSISTENT"]]
    rows = []
    for size in sizes:
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        cublas = gpu_common.device_ms(lambda: a @ b, torch)
        for config in variants:
            row = {"size": size, "config": config.kwargs, "num_warps": config.num_warps}
            gemm_kernel.pin(config)
            try:
                torch.testing.assert_close(gemm(a, b), a @ b, rtol=2e-2, atol=2e-1)
                ms = gpu_common.device_ms(lambda: gemm(a, b), torch)
                row.update(tessera_tflops=tflops(size, size, size, ms), ratio=cublas / ms)
            except Exception as error:          # a config this GPU cannot compile or run: recorded, not fatal
                row["error"] = f"{type(error).__name__}: {error}"[:300]
            finally:
                gemm_kernel.pin(None)
            rows.append(row)
            print(f"{size}^3 {config}: " + (f"{row['tessera_tflops']:7.1f} TFLOP/s ({row['ratio']:.0%} of cuBLAS)"
                                             if "error" not in row else row["error"]))
    return rows


def main() -> None:
    torch = gpu_common.require_gpu()
    from tessera.kernels_lib import gemm

    shapes = [(s, s, s) for s in SQUARE] + [(m, n, k) for n, k in LLM_NK for m in LLM_M]
    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(gemm(a, b), a @ b, rtol=2e-2, atol=2e-1)
        ours = gpu_common.device_ms(lambda: gemm(a, b), torch)
        cublas = gpu_common.device_ms(lambda: a @ b, torch)
        rows.append({"m": m, "n": n, "k": k, "tessera_tflops": tflops(m, n, k, ours),
                     "cublas_tflops": tflops(m, n, k, cublas), "ratio": cublas / ours})
        print(f"{m:>5} x {n:>5} x {k:>5}: tessera {rows[-1]['tessera_tflops']:7.1f}  "
              f"cuBLAS {rows[-1]['cublas_tflops']:7.1f} TFLOP/s  ({rows[-1]['ratio']:.0%})")
    fp8 = fp8_rows(torch, gemm, [(m, n, k) for m, n, k in shapes if m >= 16])   # _scaled_mm needs M % 16 == 0
    configs = config_rows(torch, [4096, 8192])
    gpu_common.write("gemm", {"environment": gpu_common.environment(torch), "dtype": "bf16", "rows": rows,
                              "fp8_dtype": "e4m3 in, per-tensor f32 scales, bf16 out", "fp8_rows": fp8,
                              "config_rows": configs})
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    labels = [f"{r['m']}x{r['n']}x{r['k']}" for r in rows]
    fig, ax = plt.subplots(figsize=(12, 4))
    ax.bar(range(len(rows)), [r["ratio"] for r in rows])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), labels, rotation=90, fontsize=7)
    ax.set_ylabel("tessera / cuBLAS")
    fig.tight_layout()
    fig.savefig(gpu_common.RESULTS / "gemm.png", dpi=120)


if __name__ == "__main__":
    main()
