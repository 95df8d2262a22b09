"""Achieved memory bandwidth of vector add, softmax and a row-wise sum, against a torch copy of the same bytes.

    python bench/bandwidth.py              # needs an NVIDIA GPU and torch

Goal (issue 4): vector add and softmax at >= 90% of torch's copy bandwidth on an H200.
"""

from __future__ import annotations

import gpu_common
from bench_kernels import add

import tessera



@tessera.kernel
def softmax(x_ptr, out_ptr, rows, cols, BLOCK: tessera.constexpr):
    row = tessera.program_id(0)
    x, out = tessera.view(x_ptr, (rows, cols)), tessera.view(out_ptr, (rows, cols))
    v = x.block((1, BLOCK), (row, 0)).load(fill=-float("inf"))
    e = tessera.exp(v - tessera.max(v, axis=1, keep_dims=True))
    out.block((1, BLOCK), (row, 0)).store(e / tessera.sum(e, axis=1, keep_dims=True))


@tessera.kernel
def row_sum(x_ptr, out_ptr, rows, cols, BLOCK: tessera.constexpr):
    row = tessera.program_id(0)
    v = tessera.view(x_ptr, (rows, cols)).block((1, BLOCK), (row, 0)).load()
    tessera.store(out_ptr + row, tessera.sum(v))


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def main() -> None:
    torch = gpu_common.require_gpu()
    results = {"environment": gpu_common.environment(torch), "cases": {}}
    n = 1 << 28
    x, y, out = (torch.randn(n, device="cuda") for _ in range(3))
    copy_src, copy_dst = torch.randn(3 * n // 2, device="cuda"), torch.empty(3 * n // 2, device="cuda")
    add_ms = gpu_common.device_ms(lambda: add[(tessera.cdiv(n, 4096),)](x, y, out, n, BLOCK=4096), torch)
    copy_ms = gpu_common.device_ms(lambda: copy_dst.copy_(copy_src), torch)
    results["cases"]["vector_add"] = {"tessera_gbps": gbps(12 * n, add_ms), "torch_copy_gbps": gbps(12 * n, copy_ms)}

    rows, cols = 32768, 4096
    m = torch.randn(rows, cols, device="cuda")
    m_out = torch.empty_like(m)
    soft_ms = gpu_common.device_ms(lambda: softmax[(rows,)](m, m_out, rows, cols, BLOCK=cols), torch)
    copy_ms = gpu_common.device_ms(lambda: m_out.copy_(m), torch)
    results["cases"]["softmax"] = {"tessera_gbps": gbps(8 * rows * cols, soft_ms),
                                   "torch_copy_gbps": gbps(8 * rows * cols, copy_ms)}
    sums = torch.empty(rows, device="cuda")
    sum_ms = gpu_common.device_ms(lambda: row_sum[(rows,)](m, sums, rows, cols, BLOCK=cols), torch)
    results["cases"]["row_sum"] = {"tessera_gbps": gbps(4 * rows * cols, sum_ms),
                                   "torch_copy_gbps": gbps(8 * rows * cols, copy_ms)}
    for name, case in results["cases"].items():
        ratio = case["tessera_gbps"] / case["torch_copy_gbps"]
        print(f"{name:<12} {case['tessera_gbps']:8.1f} GB/s  (torch copy {case['torch_copy_gbps']:.1f}: {ratio:.0%})")
    gpu_common.write("bandwidth", results)


if __name__ == "__main__":
    main()
