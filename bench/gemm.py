"""GEMM throughput of tessera.kernels_lib.gemm against torch.matmul (cuBLAS), in one run.

    python bench/gemm.py                   # needs an NVIDIA GPU and torch

Shapes: square 1024..8192, and LLM projections with M in {1, 16, 64, 128, 256,
1024, 4096} and (N, K) in {(4096, 4096), (14336, 4096), (4096, 14336)}; bf16
in, bf16 out. Writes bench/results/gemm.json and, with matplotlib, gemm.png.
Goal (issue 5, H200): >= 95% of cuBLAS at 8192^3, >= cuBLAS for M <= 256.
"""

from __future__ import annotations

import gpu_common

SQUARE = [1024, 2048, 4096, 8192]
LLM_M = [1, 16, 64, 128, 256, 1024, 4096]
LLM_NK = [(4096, 4096), (14336, 4096), (4096, 14336)]


def tflops(m: int, n: int, k: int, ms: float) -> float:
    return 2 * m * n * k / (ms * 1e-3) / 1e12


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
    gpu_common.write("gemm", {"environment": gpu_common.environment(torch), "dtype": "bf16", "rows": rows})
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
