"""Median host time per warm launch: an empty kernel and vector add, beside torch and Triton.

    python bench/launch_overhead.py        # needs an NVIDIA GPU and torch

Goal (issue 4): at most 4 µs median on an H200, below Triton and a torch elementwise op.
"""

from __future__ import annotations

import sys

import gpu_common
from bench_kernels import add

import tessera


@tessera.kernel
def empty(x_ptr):
    pass


@tessera.kernel
def add_defaulted(x_ptr, y_ptr, out_ptr, n, BLOCK: tessera.constexpr = 1024):
    """Vector add launched without its defaulted constexpr: the fingerprint path does not cover defaults."""
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    mask = offs < n
    tessera.store(out_ptr + offs, tessera.load(x_ptr + offs, mask=mask) + tessera.load(y_ptr + offs, mask=mask),
                  mask=mask)



def main() -> None:
    if "--dry-run" in sys.argv:
        print("launch_overhead: tessera empty and vector add, torch add, Triton vector add (median of 2000)")
        return
    torch = gpu_common.require_gpu()
    n = 4096
    x, y, out = (torch.randn(n, device="cuda") for _ in range(3))
    grid = (tessera.cdiv(n, 1024),)
    results = {"environment": gpu_common.environment(torch), "n": n, "median_us": {}}
    timings = results["median_us"]
    timings["tessera_empty"] = gpu_common.median_us(lambda: empty[(1,)](x), torch)
    timings["tessera_vector_add"] = gpu_common.median_us(lambda: add[grid](x, y, out, n, BLOCK=1024), torch)
    timings["tessera_vector_add_defaulted_constexpr"] = gpu_common.median_us(
        lambda: add_defaulted[grid](x, y, out, n), torch)
    timings["torch_add"] = gpu_common.median_us(lambda: torch.add(x, y, out=out), torch)
    try:
        import triton_kernels
        timings["triton_vector_add"] = gpu_common.median_us(
            lambda: triton_kernels.add[grid](x, y, out, n, BLOCK=1024), torch)
    except ImportError:
        pass
    for name, us in timings.items():
        gpu_common.record("launch_overhead", {"case": name, "median_us": us})
        print(f"{name:<40} {us:7.2f} µs")
    gpu_common.write("launch_overhead", results)


if __name__ == "__main__":
    main()
