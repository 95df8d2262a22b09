"""Host time per warm launch on every launch path, side by side with torch and Triton.

    python bench/launch_overhead.py                 # on an NVIDIA GPU: torch CUDA tensors
    python bench/launch_overhead.py --stub-driver   # on the CPU: tessera.runtime.stub_driver, no GPU needed
    python bench/launch_overhead.py --dry-run       # the plan only
    python bench/launch_overhead.py --profile       # on a GPU: also cProfile's top functions of the GEMM op

Tessera paths: an empty kernel; vector add (3 tensors and an int) with a tuple
grid, with its defaulted constexpr left out, with a callable grid, with
`stream=`, and through `@tessera.autotune` once tuned; the library GEMM's
argument list (6 tensors, 8 scalars, a callable grid, autotuned); the
`tessera::gemm` op beside `torch.matmul` at 64x64x64 (on a GPU the op
itself; on the stub driver its checks on CPU tensors and its launches on an
sm_90a stub, TMA tensor maps included, with C's map reused or re-encoded
each call, and the driver calls of one warm launch). Beside
them: a torch elementwise add, `torch.matmul`, and Triton's vector add where
installed. Last, the milliseconds a new process spends from `import tessera`
to a binary found in the disk cache.

With `--stub-driver` the driver is `StubDriver` (its `cuLaunchKernel` costs
about 0.2 µs; cuda-python's real call about 0.5 µs plus the driver's own
work) and the arrays are CUDA-array-interface objects, so the figures are
Tessera's own host work; torch's figures are then CPU ops at the same sizes
(their compute included). Goals (issue 13): at most 3 µs per warm launch with
up to 4 tensors, 6 µs for the GEMM's argument list.
"""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import gpu_common
from bench_kernels import add

import tessera

N = 4096
GEMM_SIZE = 64


@tessera.kernel
def empty(x_ptr):
    pass


@tessera.kernel
def add_defaulted(x_ptr, y_ptr, out_ptr, n, BLOCK: tessera.constexpr = 1024):
    """Vector add launched without its defaulted constexpr."""
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    mask = offs < n
    tessera.store(out_ptr + offs, tessera.load(x_ptr + offs, mask=mask) + tessera.load(y_ptr + offs, mask=mask),
                  mask=mask)


add_tuned = tessera.autotune(configs=[tessera.Config({"BLOCK": 1024}), tessera.Config({"BLOCK": 512})],
                             key=["n"])(tessera.kernel(add_defaulted.fn))


class StubArray:
    """A GPU array as the CUDA array interface describes it, at a made-up address (for the stub driver)."""

    def __init__(self, n: int, address: int, typestr: str = "<f4", shape: tuple | None = None):
        self.__cuda_array_interface__ = {"shape": shape or (n,), "typestr": typestr, "data": (address, False),
                                         "version": 3, "strides": None}


def best_launch_us(fn, batches: int = 15, calls: int = 2000) -> float:
    """The best over batches of the mean µs per call (no GPU to synchronize: the stub returns at once). The
    best, not the median: on a shared CPU other work only ever adds time, and CI machines are shared."""
    for _ in range(200):
        fn()
    means = []
    for _ in range(batches):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        means.append((time.perf_counter_ns() - start) / calls / 1e3)
    return min(means)


def tessera_cases(x, y, out, stream) -> dict:
    """The Tessera launch paths over arrays x, y, out of N elements."""
    grid = (tessera.cdiv(N, 1024),)
    by_meta = lambda meta: (tessera.cdiv(meta["n"], meta["BLOCK"]),)  # noqa: E731
    return {
        "tessera_empty": lambda: empty[(1,)](x),
        "tessera_vector_add": lambda: add[grid](x, y, out, N, BLOCK=1024),
        "tessera_vector_add_defaulted_constexpr": lambda: add_defaulted[grid](x, y, out, N),
        "tessera_vector_add_callable_grid": lambda: add[by_meta](x, y, out, N, BLOCK=1024),
        "tessera_vector_add_stream": lambda: add[grid](x, y, out, N, BLOCK=1024, stream=stream),
        "tessera_vector_add_autotuned": lambda: add_tuned[by_meta](x, y, out, N),
    }


def gemm_kernel_case(a, b, c):
    """`tessera::gemm`'s own launch (what the op does after its checks): 14 arguments, autotuned."""
    from tessera.kernels_lib.gemm import _grid, gemm_kernel

    M = N_ = K = GEMM_SIZE
    args = (a, b, c, c, c, c, M, N_, K, 1.0, K, 1, N_, 1)
    flags = dict(HAS_BIAS=False, HAS_SCALE_A=False, HAS_SCALE_B=False, ACTIVATION="none")
    return lambda: gemm_kernel[lambda meta: _grid(M, N_, meta, 132)](*args, **flags)


def gemm_op_case(a, b, outputs):
    """`tessera::gemm(a, b)` at GEMM_SIZE^3 as the op runs it on the stub driver: its checks, layout reads and
    output allocation on torch CPU tensors of the same shape (the op's own tensors would need a GPU), then its
    launches (`gemm.launch_kernels`: at this size the small-M split-K kernel) on the stub's arrays; `outputs()`
    gives the array C is, each call. float16: the CUDA array interface has no bfloat16."""
    import importlib

    import torch

    op = importlib.import_module("tessera.kernels_lib.gemm")
    M = N_ = K = GEMM_SIZE
    ta, tb = (torch.empty((GEMM_SIZE, GEMM_SIZE), dtype=torch.float16) for _ in range(2))
    flags = dict(HAS_BIAS=False, HAS_SCALE_A=False, HAS_SCALE_B=False, ACTIVATION="none")

    def call():
        M_, N, K_, out_dtype = op._check(ta, tb, None, None, None, False, False)
        op._strided(ta), op._strided(tb)
        torch.empty((M_, N), dtype=out_dtype)
        c = outputs()
        op.launch_kernels((a, b, c, c, c, c, M, N_, K, 1.0, K, 1, N_, 1), M, N_, K, flags, out_dtype, 2, None, 132)
    return call


def driver_calls(driver, fn) -> dict:
    """The driver calls of one warm call of `fn` (after two), by name: what a test asserts, reported beside the time."""
    record, driver.record = driver.record, True
    try:
        fn(), fn()
        before = Counter(driver.counts)
        fn()
        return dict(driver.counts - before)
    finally:
        driver.record = record
        driver.calls.clear()


CACHE_HIT = """
import time
import tessera
start = time.perf_counter()
from bench_kernels import add

class Array:
    def __init__(self, address):
        self.__cuda_array_interface__ = {"shape": (4096,), "typestr": "<f4", "data": (address, False), "version": 3}

add.binary(Array(1 << 40), Array(2 << 40), Array(3 << 40), 4096, BLOCK=1024, target="sm_80")
print((time.perf_counter() - start) * 1e3)
"""


def cache_hit_ms(runs: int = 5) -> float:
    """ms from `import tessera` done to the binary found in the disk cache, in a new process: defining the
    kernel, binding, the key, reading the entry (median of `runs`; a first run fills a fresh cache)."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TESSERA_CACHE_DIR=cache,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])))
        command = [sys.executable, "-c", CACHE_HIT]
        samples = [float(subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout)
                   for _ in range(runs + 1)]
    return statistics.median(samples[1:])


class Timings(dict):
    """Case -> µs per launch, each row recorded (`gpu_common.record`) and printed as soon as it is measured,
    so a session cut off at its time limit keeps what it reached."""

    def __init__(self, mode: str, timer, statistic: str):
        super().__init__()
        self.mode, self.timer, self.statistic = mode, timer, statistic

    def measure(self, name: str, fn) -> None:
        us = self[name] = self.timer(fn)
        gpu_common.record("launch_overhead", {"case": name, f"{self.statistic}_us": us, "mode": self.mode})
        print(f"{name:<42} {us:7.2f} µs", flush=True)


def run_stubbed() -> dict:
    """Every path on the stub driver; torch's ops on the CPU at the same sizes."""
    from tessera.kernels_lib.gemm import CONFIGS, gemm_kernel
    from tessera.runtime.stub_driver import StubDriver, stubbed_driver

    import torch

    timings = Timings("stub-driver", best_launch_us, "best")
    with stubbed_driver(StubDriver(record=False)):
        x, y, out = (StubArray(N, 0x7F0000000000 + i * 0x100000) for i in range(3))
        add_tuned.pin(tessera.Config({"BLOCK": 1024}))        # no GPU to time configs on: as if tuned
        for name, fn in tessera_cases(x, y, out, stream=7).items():
            timings.measure(name, fn)
        gemm_kernel.pin(CONFIGS[3])
        a, b, c = (StubArray(0, 0x7E0000000000 + i * 0x100000, "<f2", (GEMM_SIZE, GEMM_SIZE)) for i in range(3))
        timings.measure("tessera_gemm_kernel_arguments", gemm_kernel_case(a, b, c))
    calls = {}
    with stubbed_driver(StubDriver(record=False, hopper=True)) as driver:     # sm_90a: TMA loads and stores
        gemm_kernel.pin(CONFIGS[3])     # again: forgets the launches prepared on the sm_80 stub
        timings.measure("tessera_gemm_kernel_arguments_sm90a", gemm_kernel_case(a, b, c))
        calls["tessera_gemm_kernel_arguments_sm90a"] = driver_calls(driver, gemm_kernel_case(a, b, c))
        same = gemm_op_case(a, b, lambda: c)
        timings.measure("tessera_gemm_op_sm90a", same)
        calls["tessera_gemm_op_sm90a"] = driver_calls(driver, same)
        # C at a new address every call, none among the last 1024 (a model's layers each writing a fresh output):
        # every launch encodes C's tensor map again
        fresh = itertools.cycle([StubArray(0, 0x7D0000000000 + i * 0x10000, "<f2", (GEMM_SIZE, GEMM_SIZE))
                                 for i in range(4096)])
        new_output = gemm_op_case(a, b, fresh.__next__)
        timings.measure("tessera_gemm_op_sm90a_new_output", new_output)
        calls["tessera_gemm_op_sm90a_new_output"] = driver_calls(driver, new_output)
    for name, counts in calls.items():
        print(f"{name:<42} driver calls per launch: {counts}")
    tx, ty, tout = (torch.randn(N) for _ in range(3))
    ta, tb = (torch.randn(GEMM_SIZE, GEMM_SIZE) for _ in range(2))
    timings.measure("torch_add_cpu", lambda: torch.add(tx, ty, out=tout))
    timings.measure("torch_matmul_cpu", lambda: torch.matmul(ta, tb))
    return {"mode": timings.mode, "n": N, "gemm_size": GEMM_SIZE, "best_us": dict(timings),
            "driver_calls_per_launch": calls}


def run_on_gpu() -> dict:
    torch = gpu_common.require_gpu()
    from tessera.kernels_lib import gemm
    from tessera.kernels_lib.gemm import CONFIGS, gemm_kernel

    timings = Timings("gpu", lambda fn: gpu_common.median_us(fn, torch), "median")
    x, y, out = (torch.randn(N, device="cuda") for _ in range(3))
    a, b = (torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    timings.measure("torch_add", lambda: torch.add(x, y, out=out))
    timings.measure("torch_matmul", lambda: torch.matmul(a, b))
    try:
        import triton_kernels
        grid = (tessera.cdiv(N, 1024),)
        timings.measure("triton_vector_add", lambda: triton_kernels.add[grid](x, y, out, N, BLOCK=1024))
    except ImportError:
        pass
    for name, fn in tessera_cases(x, y, out, torch.cuda.current_stream()).items():
        timings.measure(name, fn)
    gemm_kernel.pin(CONFIGS[3])          # the warm path is the same once tuned; tuning would compile 6 configs
    gemm_cases = {"tessera_gemm_kernel_arguments": gemm_kernel_case(a, b, torch.empty_like(a)),
                  "tessera_gemm_op": lambda: gemm(a, b)}
    for name, fn in gemm_cases.items():
        timings.measure(name, fn)
    unqueued = {name: unqueued_us(fn, torch) for name, fn in gemm_cases.items()}
    calls = {name: real_driver_calls(fn) for name, fn in gemm_cases.items()}
    for name in gemm_cases:
        print(f"{name:<42} {unqueued[name]:7.2f} µs with the GPU's queue kept short; driver calls per launch: "
              f"{calls[name]}", flush=True)
    if "--profile" in sys.argv:
        profile(gemm_cases["tessera_gemm_op"])
    return {"mode": timings.mode, "environment": gpu_common.environment(torch), "n": N, "gemm_size": GEMM_SIZE,
            "median_us": dict(timings), "unqueued_median_us": unqueued, "driver_calls_per_launch": calls}


def unqueued_us(fn, torch, calls: int = 2000, every: int = 16) -> float:
    """Median host µs per call with a synchronize every `every` calls (not timed), so the GPU's launch queue never
    fills: when this is far below the plain median, the plain median timed the GPU, not the host."""
    samples = []
    for i in range(calls):
        if i % every == 0:
            torch.cuda.synchronize()
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1e3)
    torch.cuda.synchronize()
    return statistics.median(samples)


def real_driver_calls(fn) -> dict:
    """The driver calls of one warm call of `fn` on the GPU, by name (tensor-map encodes included): the launches
    are prepared again on a counting proxy of the real bindings, then counted over the third call."""
    from tessera.runtime import cuda

    real = cuda._driver()
    counts = Counter()

    class Counting:
        def __getattr__(self, name):
            value = getattr(real, name)
            if not (name.startswith("cu") and callable(value)):
                return value

            def counted(*args, **kwargs):
                counts[name] += 1
                return value(*args, **kwargs)
            return counted

    saved = cuda._driver, cuda._devices
    cuda._driver, cuda._devices = (lambda: proxy), {}
    proxy = Counting()
    forget_prepared_launches()
    try:
        fn(), fn()
        before = Counter(counts)
        fn()
        return dict(counts - before)
    finally:
        cuda._driver, cuda._devices = saved
        forget_prepared_launches()


def forget_prepared_launches() -> None:
    """Drop every GEMM kernel's launchers and warm launches (they hold the driver they were prepared on)."""
    from tessera.kernels_lib import gemm_split_k
    from tessera.kernels_lib.gemm import gemm_kernel, gemm_kernel_fast

    for kernel in (gemm_kernel.kernel, gemm_kernel_fast.kernel, gemm_split_k.gemm_split_k_kernel,
                   gemm_split_k.gemm_split_k_kernel_fast, gemm_split_k.gemm_split_k_reduce_kernel,
                   gemm_split_k.gemm_split_k_reduce_kernel_fast):
        kernel.launchers.clear()
        kernel.fast_launches.clear()
    for tuned in (gemm_kernel, gemm_kernel_fast):
        tuned.fast_launches.clear()


def profile(fn, calls: int = 5000) -> None:
    """The 15 functions with the most own time over `calls` warm calls of `fn` (cProfile)."""
    import cProfile
    import pstats

    for _ in range(3):
        fn()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main() -> None:
    stub = "--stub-driver" in sys.argv
    if "--dry-run" in sys.argv:
        print(f"launch_overhead ({'stub driver' if stub else 'GPU'}): tessera empty, vector add (tuple grid, "
              f"defaulted constexpr, callable grid, stream=, autotuned), the GEMM's arguments, the tessera::gemm "
              f"op (on the stub: on an sm_90a stub too, with its driver calls); torch add, torch.matmul, Triton vector add")
        return
    results = run_stubbed() if stub else run_on_gpu()
    results["cache_hit_new_process_ms"] = cache_hit_ms()
    gpu_common.record("launch_overhead", {"case": "cache_hit_new_process_ms", "ms": results["cache_hit_new_process_ms"],
                                          "mode": results["mode"]})
    print(f"{'disk-cache hit in a new process':<42} {results['cache_hit_new_process_ms']:7.2f} ms")
    gpu_common.write("launch_overhead" + ("_stub_driver" if stub else ""), results)


if __name__ == "__main__":
    main()
