"""Fusion (issue 18): fused kernels against the same work unfused, in one run; tier 2 of the GPU session.

    python bench/fusion.py              # every case: needs an NVIDIA GPU and torch
    python bench/fusion.py --cases epilogue     # only (c)
    python bench/fusion.py --dry-run    # the plan, and each case small on the CPU interpreter, with bytes moved

(a) chain: four row-wise elementwise kernels and a row reduction over an
    M x N float32 matrix, captured by `tessera.fusion()` (one launch, the
    intermediates never stored) against the five launches;
(b) horizontal: eight independent elementwise kernels on small tensors,
    merged into one launch with the program ids partitioned, against eight;
(c) epilogue: bf16 GEMM + bias + GELU + residual + dropout as one
    `kernels_lib.gemm(..., epilogue=...)` against torch eager and
    `torch.compile` of the same function, in the same run, all returning
    bf16; also the plain library GEMM and cuBLAS alone, and the configs
    the fused kernel and the plain GEMM chose.

Each row has the median time per variant (eager, with events; also inside
a CUDA graph: the kernels alone, without the host's launch work, which for
(c) includes the fused call's Python hook handling), the speedups, and the
bytes each variant must move: for (a) and (b) the capture's own count (the
buffers each launch reads or writes), for (c) the operands and every
intermediate eager torch writes and reads back. The dry run prints the same
counts from a small run on the interpreter, and checks fused against
unfused there. Goals (H100/H200): (a) >= 3x unfused, (b) >= 4x eight
launches, (c) at least as fast as torch.compile. Rows go to
$TESSERA_RESULTS_JSONL as measured; the run writes fusion.json and, with
matplotlib, fusion.png (speedup per row).
"""

from __future__ import annotations

import argparse
import json

import gpu_common

import tessera

CHAIN_SHAPES = [(8192, 1024), (32768, 512)]           # (a): M x N float32
HORIZONTAL_SIZES = [16384, 65536]                      # (b): elements per tensor, eight tensors
EPILOGUE_SHAPES = [(4096, 4096, 4096), (8192, 4096, 1024)]     # (c): M, N, K in bf16
DROPOUT_P = 0.1
EPILOGUE_VARIANTS = ("tessera", "eager", "compile", "plain_gemm", "cublas")   # (c)'s timed rows


@tessera.func
def rows(ptr, M, N, BM, BN):
    """This program's BM rows of an M x N matrix (N <= BN)."""
    return tessera.view(ptr, (M, N)).block((BM, BN), (tessera.program_id(0), 0))


@tessera.kernel
def row_map(x_ptr, y_ptr, M, N, OP: tessera.constexpr, BM: tessera.constexpr, BN: tessera.constexpr):
    x = rows(x_ptr, M, N, BM, BN).load()
    if OP == "scale":
        y = x * 0.5
    elif OP == "relu":
        y = tessera.maximum(x, 0.0)
    elif OP == "square":
        y = x * x
    else:
        y = tessera.tanh(x)
    rows(y_ptr, M, N, BM, BN).store(y)


@tessera.kernel
def row_add(x_ptr, z_ptr, y_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    rows(y_ptr, M, N, BM, BN).store(rows(x_ptr, M, N, BM, BN).load() + rows(z_ptr, M, N, BM, BN).load())


@tessera.kernel
def row_sum(x_ptr, s_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    total = tessera.sum(rows(x_ptr, M, N, BM, BN).load(), axis=1)
    tessera.view(s_ptr, (M,)).block((BM,), (tessera.program_id(0),)).store(total)


@tessera.kernel
def flat_tanh(x_ptr, y_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    tessera.store(y_ptr + offs, tessera.tanh(tessera.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


@tessera.func
def bias_gelu_residual_dropout(acc, bias, residual, seed, p, n_cols, rows, cols):
    """dropout(gelu(acc + bias) + residual): GELU in its tanh form, dropout by Philox on the element index."""
    x = acc + bias
    y = 0.5 * x * (1.0 + tessera.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) + residual
    keep = tessera.rand(seed, rows * n_cols + cols) > p
    return tessera.where(keep, y / (1.0 - p), 0.0)


# ---------------------------------------------------------------------------
# The cases, as launch sequences (the same code captured or not)


def chain(torch, x, z, s, BM: int = 8):
    """(a): scale, relu, add z, square, then the sum of each row into s."""
    M, N = x.shape
    grid, BN = (tessera.cdiv(M, BM),), tessera.next_power_of_2(N)
    t = [torch.empty_like(x) for _ in range(4)]
    row_map[grid](x, t[0], M, N, OP="scale", BM=BM, BN=BN, num_warps=8)
    row_map[grid](t[0], t[1], M, N, OP="relu", BM=BM, BN=BN, num_warps=8)
    row_add[grid](t[1], z, t[2], M, N, BM=BM, BN=BN, num_warps=8)
    row_map[grid](t[2], t[3], M, N, OP="square", BM=BM, BN=BN, num_warps=8)
    row_sum[grid](t[3], s, M, N, BM=BM, BN=BN, num_warps=8)


def horizontal(xs, ys, BLOCK: int = 1024):
    """(b): tanh of each of eight tensors, one launch each."""
    for x, y in zip(xs, ys):
        flat_tanh[(tessera.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)


def eager_epilogue(torch, a, b, bias, residual):
    x = torch.nn.functional.gelu(a @ b + bias, approximate="tanh") + residual
    return torch.nn.functional.dropout(x, DROPOUT_P, training=True)


def fused_epilogue(a, b, bias, residual, seed=1234):
    from tessera.kernels_lib import gemm
    return gemm(a, b, epilogue=bias_gelu_residual_dropout,
                epilogue_args=(bias, residual, seed, DROPOUT_P, b.shape[1]))


def epilogue_bytes(M: int, N: int, K: int, element: int = 2) -> dict:
    """Bytes each variant of (c) must move: fused reads A, B, bias, the residual and writes the output; eager
    torch also writes and reads back each intermediate (a @ b, + bias, gelu, + residual) and the dropout mask."""
    operands = (M * K + K * N + N) * element
    fused = operands + 2 * M * N * element
    intermediates = 4 * 2 * M * N * element + M * N          # four written and read back; a one-byte mask
    return {"fused": fused, "eager": fused + intermediates}


# ---------------------------------------------------------------------------
# GPU


def captured(fn):
    """Capture `fn()` once (fusing it) and return the capture, whose `replay()` runs the fused launches."""
    with tessera.fusion() as f:
        fn()
    return f


def measure_chain(torch, M: int, N: int) -> dict:
    x, z, s = torch.randn(M, N, device="cuda"), torch.randn(M, N, device="cuda"), torch.empty(M, device="cuda")
    unfused = lambda: chain(torch, x, z, s)     # noqa: E731
    f = captured(unfused)
    expected = s.clone()
    unfused()
    torch.testing.assert_close(s, expected, rtol=1e-4, atol=1e-3)
    times = {"unfused_ms": gpu_common.device_ms(unfused, torch), "fused_ms": gpu_common.device_ms(f.replay, torch),
             "unfused_graph_ms": gpu_common.graph_ms(unfused, torch), "fused_graph_ms": gpu_common.graph_ms(f.replay, torch)}
    return {"case": "chain", "shape": f"{M}x{N}", "launches": f"{f.recorded} -> {len(f.ran)}", **times,
            "speedup": times["unfused_ms"] / times["fused_ms"],
            "speedup_graph": times["unfused_graph_ms"] / times["fused_graph_ms"],
            "bytes_unfused": f.traffic["recorded"], "bytes_fused": f.traffic["ran"],
            "fused_gbps": f.traffic["ran"] / times["fused_graph_ms"] / 1e6}


def measure_horizontal(torch, n: int) -> dict:
    xs = [torch.randn(n, device="cuda") for _ in range(8)]
    ys = [torch.empty_like(x) for x in xs]
    unfused = lambda: horizontal(xs, ys)        # noqa: E731
    f = captured(unfused)
    times = {"unfused_ms": gpu_common.device_ms(unfused, torch), "fused_ms": gpu_common.device_ms(f.replay, torch),
             "unfused_graph_ms": gpu_common.graph_ms(unfused, torch), "fused_graph_ms": gpu_common.graph_ms(f.replay, torch)}
    return {"case": "horizontal", "shape": f"8x{n}", "launches": f"{f.recorded} -> {len(f.ran)}", **times,
            "speedup": times["unfused_ms"] / times["fused_ms"],
            "speedup_graph": times["unfused_graph_ms"] / times["fused_graph_ms"],
            "bytes_unfused": f.traffic["recorded"], "bytes_fused": f.traffic["ran"]}


def measure_epilogue(torch, M: int, N: int, K: int) -> dict:
    """(c) at one shape. Every variant returns bf16 and is warm (compiled, tuned) before it is timed; each is
    timed with events around one call (`device_ms`: the host's launch work included, which the fused call's
    Python hook handling adds to) and inside a CUDA graph (`graph_ms`: the kernels alone). The plain library
    GEMM and cuBLAS alone (no epilogue) show what the epilogue costs each, and the configs the fused kernel
    and the plain GEMM chose show whether they share the plan (they tune over the same configs)."""
    from tessera.kernels_lib import gemm
    from tessera.kernels_lib.gemm import gemm_kernel_fast
    from tessera.kernels_lib.gemm_fused import gemm_fused_kernel_fast

    a, b = torch.randn(M, K, device="cuda", dtype=torch.bfloat16), torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    bias, residual = torch.randn(N, device="cuda", dtype=torch.bfloat16), torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    out = fused_epilogue(a, b, bias, residual)
    assert out.dtype == eager_epilogue(torch, a, b, bias, residual).dtype == torch.bfloat16
    kept = out != 0
    reference = (torch.nn.functional.gelu(a.float() @ b.float() + bias.float(), approximate="tanh") + residual.float())
    torch.testing.assert_close(out.float()[kept], (reference / (1 - DROPOUT_P))[kept], rtol=5e-2, atol=5e-1)
    compiled = torch.compile(lambda: eager_epilogue(torch, a, b, bias, residual))
    variants = {"tessera": lambda: fused_epilogue(a, b, bias, residual),
                "eager": lambda: eager_epilogue(torch, a, b, bias, residual),
                "compile": compiled,
                "plain_gemm": lambda: gemm(a, b), "cublas": lambda: a @ b}
    times = {}
    for name, fn in variants.items():
        times[f"{name}_ms"] = gpu_common.device_ms(fn, torch)
        try:
            times[f"{name}_graph_ms"] = gpu_common.graph_ms(fn, torch)
        except Exception as exc:      # (a capture that fails leaves the events' time, and says why)
            times[f"{name}_graph_error"] = f"{type(exc).__name__}: {exc}"[:200]
            torch.cuda.synchronize()
    flops = 2 * M * N * K
    row = {"case": "epilogue", "shape": f"{M}x{N}x{K}", **times,
           "speedup_vs_eager": times["eager_ms"] / times["tessera_ms"],
           "speedup_vs_compile": times["compile_ms"] / times["tessera_ms"],
           "fused_config": tuned_config(gemm_fused_kernel_fast, M, N, K),   # (bf16 out: fast math)
           "plain_config": tuned_config(gemm_kernel_fast, M, N, K),
           "tflops": flops / times["tessera_ms"] / 1e9, **{f"bytes_{k}": v for k, v in epilogue_bytes(M, N, K).items()}}
    if "compile_graph_ms" in times and "tessera_graph_ms" in times:
        row["speedup_vs_compile_graph"] = times["compile_graph_ms"] / times["tessera_graph_ms"]
    return row


def tuned_config(kernel, M: int, N: int, K: int) -> str:
    """The config autotuned `kernel` launches an M x N x K problem with in this process: pinned or tuned."""
    if kernel.tuner.pinned is not None:
        return f"pinned {kernel.tuner.pinned}"
    for (_, key), config in kernel.tuner.chosen.items():
        if json.loads(key)["key"] == [["M", M], ["N", N], ["K", K]]:
            return str(config)
    return "not tuned"


def describe(row: dict) -> str:
    """One line of a row, as the run prints it and `gpu_session.py --report` lists it."""
    if "error" in row:
        return f"{row['case']} {row['shape']}: ERROR {row['error'][:200]}"
    if row["case"] == "epilogue":
        graphs = ", ".join(f"{name} {row[name + '_graph_ms']:.3f}" for name in EPILOGUE_VARIANTS
                           if name + "_graph_ms" in row)
        return (f"epilogue {row['shape']}: tessera {row['tessera_ms']:.3f} ms, eager {row['eager_ms']:.3f} ms, "
                f"torch.compile {row['compile_ms']:.3f} ms ({row['speedup_vs_compile']:.2f}x compile); "
                f"plain gemm {row['plain_gemm_ms']:.3f} ms, cuBLAS {row['cublas_ms']:.3f} ms; in a graph (ms): "
                f"{graphs}; configs: fused {row['fused_config']}, plain {row['plain_config']}")
    return (f"{row['case']} {row['shape']} ({row['launches']} launches): {row['speedup']:.2f}x eager, "
            f"{row['speedup_graph']:.2f}x in a graph; {row['bytes_unfused']} -> {row['bytes_fused']} bytes")


# ---------------------------------------------------------------------------
# CPU: the dry run


def dry_run() -> list[dict]:
    """Each case small on the CPU interpreter: fused equals unfused, and the bytes each variant moves."""
    import torch
    rows_ = []
    x, z = torch.randn(37, 48), torch.randn(37, 48)
    expected, s = torch.empty(37), torch.empty(37)
    chain(torch, x, z, expected)
    f = captured(lambda: chain(torch, x, z, s))
    assert torch.equal(s, expected), "fused chain differs from the unfused launches"
    rows_.append({"case": "chain", "shape": "37x48", "launches": f"{f.recorded} -> {len(f.ran)}",
                  "bytes_unfused": f.traffic["recorded"], "bytes_fused": f.traffic["ran"]})
    xs = [torch.randn(100 + 37 * i) for i in range(8)]
    ys = [torch.empty_like(v) for v in xs]
    f = captured(lambda: horizontal(xs, ys, BLOCK=64))
    assert all(torch.allclose(y, torch.tanh(v), atol=1e-6) for v, y in zip(xs, ys))
    rows_.append({"case": "horizontal", "shape": "8 tensors", "launches": f"{f.recorded} -> {len(f.ran)}",
                  "bytes_unfused": f.traffic["recorded"], "bytes_fused": f.traffic["ran"]})
    a, b, bias, residual = torch.randn(40, 32), torch.randn(32, 48), torch.randn(48), torch.randn(40, 48)
    out = fused_epilogue(a, b, bias, residual)
    kept = out != 0
    reference = torch.nn.functional.gelu(a @ b + bias, approximate="tanh") + residual
    torch.testing.assert_close(out[kept], (reference / (1 - DROPOUT_P))[kept], rtol=1e-4, atol=1e-4)
    for M, N, K in EPILOGUE_SHAPES:
        rows_.append({"case": "epilogue", "shape": f"{M}x{N}x{K}",
                      **{f"bytes_{k}": v for k, v in epilogue_bytes(M, N, K).items()}})
    return rows_


def plot(rows_: list[dict], path) -> None:
    speedups = {r["case"] + " " + r["shape"]: r.get("speedup", r.get("speedup_vs_compile")) for r in rows_
                if "error" not in r}
    gpu_common.ratio_plot(path, list(speedups), {"speedup": list(speedups.values())}, "fused speedup")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="no GPU: a small run of each case on the CPU")
    parser.add_argument("--cases", default="chain,horizontal,epilogue",
                        help="comma-separated cases to measure (default: all three)")
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    unknown = cases - {"chain", "horizontal", "epilogue"}
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}; choose from chain, horizontal, epilogue")
    if args.dry_run:
        for row in dry_run():
            print(row)
        print(f"plan on a GPU: chain {CHAIN_SHAPES}, horizontal 8 x {HORIZONTAL_SIZES}, epilogue {EPILOGUE_SHAPES}")
        return
    torch = gpu_common.require_gpu()
    measured = []
    for fn, shapes in ((measure_chain, CHAIN_SHAPES), (measure_horizontal, [(n,) for n in HORIZONTAL_SIZES]),
                       (measure_epilogue, EPILOGUE_SHAPES)):
        if fn.__name__.replace("measure_", "") not in cases:
            continue
        for shape in shapes:
            try:
                row = fn(torch, *shape)
            except Exception as exc:          # a wrong result or a failed compile: recorded, the run goes on
                row = {"case": fn.__name__.replace("measure_", ""), "shape": "x".join(map(str, shape)),
                       "error": f"{type(exc).__name__}: {exc}"[:500]}
            gpu_common.record("fusion", row)
            print(describe(row), flush=True)
            measured.append(row)
    gpu_common.write("fusion", {"environment": gpu_common.environment(torch), "rows": measured})
    plot(measured, gpu_common.results_dir() / "fusion.png")


if __name__ == "__main__":
    main()
