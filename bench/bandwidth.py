"""Achieved memory bandwidth of vector add, softmax and a row-wise sum, against a torch copy of the same bytes.

    python bench/bandwidth.py              # needs an NVIDIA GPU and torch

Goal (issue 4): vector add and softmax at >= 90% of torch's copy bandwidth on an H200.
"""

from __future__ import annotations

import sys

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


def case(name: str, torch, tessera_ms: float, copy_ms: float, nbytes: int, copy_bytes: int, wrong: str | None) -> dict:
    """One row: GB/s of the Tessera kernel beside a torch copy, or where its result was wrong."""
    row = {"case": name, "torch_copy_gbps": gbps(copy_bytes, copy_ms)}
    if wrong:
        row["wrong"] = wrong
    else:
        row["tessera_gbps"] = gbps(nbytes, tessera_ms)
    gpu_common.record("bandwidth", row)
    if wrong:
        print(f"{name:<12} WRONG {wrong}", flush=True)
    else:
        print(f"{name:<12} {row['tessera_gbps']:8.1f} GB/s  (torch copy {row['torch_copy_gbps']:.1f}: "
              f"{row['tessera_gbps'] / row['torch_copy_gbps']:.0%})", flush=True)
    return row


def check(torch, got, want, **tolerances) -> str | None:
    """None when `got` matches `want`, else where it does not."""
    from tessera.testing import diagnose

    torch.cuda.synchronize()
    if torch.allclose(got, want, **tolerances):
        return None
    return diagnose(got, want, **tolerances)


def main() -> None:
    if "--dry-run" in sys.argv:
        print("bandwidth: vector add over 2^28 floats, softmax and row sum over 32768 x 4096, torch copies")
        return
    torch = gpu_common.require_gpu()
    results = {"environment": gpu_common.environment(torch), "cases": {}}
    n = 1 << 28
    x, y, out = (torch.randn(n, device="cuda") for _ in range(3))
    copy_src, copy_dst = torch.randn(3 * n // 2, device="cuda"), torch.empty(3 * n // 2, device="cuda")
    launch_add = lambda: add[(tessera.cdiv(n, 4096),)](x, y, out, n, BLOCK=4096)  # noqa: E731
    launch_add()
    wrong = check(torch, out, x + y, rtol=0, atol=0)
    add_ms = gpu_common.device_ms(launch_add, torch)
    copy_ms = gpu_common.device_ms(lambda: copy_dst.copy_(copy_src), torch)
    results["cases"]["vector_add"] = case("vector_add", torch, add_ms, copy_ms, 12 * n, 12 * n, wrong)

    rows, cols = 32768, 4096
    m = torch.randn(rows, cols, device="cuda")
    m_out = torch.empty_like(m)
    launch_softmax = lambda: softmax[(rows,)](m, m_out, rows, cols, BLOCK=cols)  # noqa: E731
    launch_softmax()
    wrong = check(torch, m_out, torch.softmax(m, dim=1), rtol=1e-5, atol=1e-6)
    soft_ms = gpu_common.device_ms(launch_softmax, torch)
    copy_ms = gpu_common.device_ms(lambda: m_out.copy_(m), torch)
    results["cases"]["softmax"] = case("softmax", torch, soft_ms, copy_ms, 8 * rows * cols, 8 * rows * cols, wrong)

    sums = torch.empty(rows, device="cuda")
    launch_sum = lambda: row_sum[(rows,)](m, sums, rows, cols, BLOCK=cols)  # noqa: E731
    launch_sum()
    wrong = check(torch, sums, m.sum(dim=1), rtol=1e-4, atol=1e-3)
    sum_ms = gpu_common.device_ms(launch_sum, torch)
    results["cases"]["row_sum"] = case("row_sum", torch, sum_ms, copy_ms, 4 * rows * cols, 8 * rows * cols, wrong)
    gpu_common.write("bandwidth", results)


if __name__ == "__main__":
    main()
