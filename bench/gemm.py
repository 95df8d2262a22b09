"""GEMM throughput of tessera.kernels_lib.gemm against torch.matmul (cuBLAS), in one run.

    python bench/gemm.py                         # everything: needs an NVIDIA GPU and torch
    python bench/gemm.py --part bf16 --shapes tier1 --pin 0     # the GPU session's tier 1
    python bench/gemm.py --dry-run               # the plan, without a GPU

Parts (`--part`, repeatable; default all):
* bf16: square 1024..8192 and LLM projections with M in {1, 16, 64, 128, 256,
  1024, 4096} and (N, K) in {(4096, 4096), (14336, 4096), (4096, 14336)}
  (`--shapes all`), or 4096^3, 8192^3 and four LLM shapes (`--shapes tier1`);
  bf16 in, bf16 out, against cuBLAS. Autotuned unless `--pin I` launches
  CONFIGS[I] without tuning (M <= 64, and shapes with fewer 128 x 128
  tiles than SMs, take a split-K plan instead, which has no configs to tune). `--shapes decode`: M in {1, 16, 32, 64} against
  the LLM (N, K), with B row-major and as an nn.Linear weight (N x K,
  trans_b): the small-M split-K path (`gemm_split_k.py`), each row with its
  plan (split count), its GB/s (B read once), and the atomic-split variant
  timed too where the plan splits K. Goal (issue 19): >= 1.1x cuBLAS.
* fp8: the same shapes with float8_e4m3fn inputs and float32 per-tensor
  scales, bf16 out, against torch._scaled_mm (skipped where this torch lacks
  it or the GPU has no fp8 GEMM).
* configs: every shipped config pinned in turn at 4096^3 and 8192^3 (bf16),
  plus, on Hopper, each non-persistent one warp-specialized (WS=True), and the
  persistent warp-specialized one next to them: the data to tune the shipped
  configs from.
* stream_k: shapes whose persistent grid's last wave is partial
  (STREAM_K_SHAPES), each run four ways against cuBLAS: the stream-K kernel
  ($TESSERA_GEMM_STREAM_K=1, `gemm_stream_k.py`; also whether two runs give
  the same bits), the data-parallel persistent kernel of the same tile
  (CONFIGS[5] pinned), split K over 128 x 128 tiles (the split count whose
  waves waste least), and the autotuned op: whether the "stream_k" entry of
  gemm_configs.json may be marked measured (the wave model predicts ~8% over
  the persistent kernel at 3072^3, ~1% at 4096^3, ~43% at 1536^2 x 16384).

Every row is checked against the reference before it is timed (a wrong result
is recorded with `tessera.testing.diagnose`'s description, not timed), and is
appended to $TESSERA_RESULTS_JSONL as soon as it is measured. Each side is
timed twice: per eager call, as a user calling the op sees it (`ratio`; host
overhead included, which dominates small shapes), and per call inside a CUDA
graph, the kernels alone (`graph_ratio`). Writes
gemm.json (gemm_<parts>.json for a subset) and, with matplotlib, gemm.png.
Goal (issue 5, H200): >= 95% of cuBLAS at 8192^3, >= cuBLAS for M <= 256.
"""

from __future__ import annotations

import argparse

import gpu_common

SQUARE = [1024, 2048, 4096, 8192]
LLM_M = [1, 16, 64, 128, 256, 1024, 4096]
LLM_NK = [(4096, 4096), (14336, 4096), (4096, 14336)]
SHAPES = {
    "all": [(s, s, s) for s in SQUARE] + [(m, n, k) for n, k in LLM_NK for m in LLM_M],
    "tier1": [(4096, 4096, 4096), (8192, 8192, 8192),
              (16, 4096, 4096), (128, 14336, 4096), (256, 4096, 14336), (4096, 14336, 4096)],
    "decode": [(m, n, k) for m in (1, 16, 32, 64) for n, k in LLM_NK],
}
DECODE_LAYOUTS = ("b-row-major", "b-weight")     # B as [K, N], or as an nn.Linear weight [N, K] (trans_b)
PARTS = ("bf16", "fp8", "configs", "stream_k")
# Stream K's shapes: a persistent grid of 128 x 128 tiles with a partial last wave on an H100's 132 SMs (3072^2:
# 576 tiles, 4.36 waves; 1536^2 x 16384: 144 tiles, 1.09 waves), and 4096^3 (7.76 waves) where it should not pay
STREAM_K_SHAPES = [(3072, 3072, 3072), (3072, 3072, 8192), (2304, 4096, 4096), (1536, 1536, 16384),
                   (4096, 4096, 4096)]


def timed(torch, row: dict, who: str, fn, flops: float) -> None:
    """Add `who`'s TFLOP/s to `row` twice: per eager call as a user sees it (host overhead included), and per
    call inside a CUDA graph (the kernels alone; `<who>_graph_error` if the call cannot be captured)."""
    row[f"{who}_tflops"] = flops / (gpu_common.device_ms(fn, torch) * 1e-3) / 1e12
    try:
        row[f"{who}_graph_tflops"] = flops / (gpu_common.graph_ms(fn, torch) * 1e-3) / 1e12
    except Exception as error:
        row[f"{who}_graph_error"] = f"{type(error).__name__}: {error}"[:500]


def compare(torch, row: dict, ours, theirs, theirs_name: str, expected, m: int, n: int, k: int) -> None:
    """Check `ours` against `expected`, then time both (eager and in a graph) into `row` with their ratios."""
    from tessera.testing import diagnose

    got = ours()
    torch.cuda.synchronize()
    flops = 2 * m * n * k
    timed(torch, row, theirs_name, theirs, flops)
    if not torch.allclose(got.float(), expected.float(), rtol=2e-2, atol=2e-1):
        row["wrong"] = diagnose(got, expected, rtol=2e-2, atol=2e-1, name="gemm")
        return
    timed(torch, row, "tessera", ours, flops)
    row["ratio"] = row["tessera_tflops"] / row[f"{theirs_name}_tflops"]
    if "tessera_graph_tflops" in row and f"{theirs_name}_graph_tflops" in row:
        row["graph_ratio"] = row["tessera_graph_tflops"] / row[f"{theirs_name}_graph_tflops"]


def bf16_rows(torch, gemm, shapes) -> list[dict]:
    """Each shape against cuBLAS; `split_k` says where the op ran a split-K plan instead of the tiled kernel
    (M <= 64, or fewer tiles than SMs: `gemm._split_k_plan`), which ignores --pin."""
    from tessera.kernels_lib.gemm import _gpu_of, _split_k_plan

    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    gpu = _gpu_of(torch.device("cuda", 0))         # (the constants and tiles the op plans with on this GPU)
    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        row = {"m": m, "n": n, "k": k}
        split = _split_k_plan(m, n, k, 2, num_sms, False, *gpu)
        if split is not None:
            row["split_k"], row["b_layout"] = split.split_k, "b-row-major"
        try:
            compare(torch, row, lambda: gemm(a, b), lambda: a @ b, "cublas", a @ b, m, n, k)
        except Exception as error:          # recorded, not fatal: the next shapes still run
            row["error"] = f"{type(error).__name__}: {error}"[:2000]
        rows.append(row)
        gpu_common.record("gemm_bf16", row)
        print(f"bf16 {m:>5} x {n:>5} x {k:>5}: " + _describe(row, "cublas", "cuBLAS"), flush=True)
    return rows


def planning_as(gpu, fn) -> None:
    """Run `fn` with the op pricing its split-K plans with `gpu`'s constants (`kernels_lib/gpus.py`) instead of
    this GPU's row, its plan key (tiles) kept; the op's plans are forgotten before and after."""
    import importlib
    gemm_module = importlib.import_module("tessera.kernels_lib.gemm")     # (the package exports the function)
    own = gemm_module._gpu_of
    gemm_module._gpu_of = lambda device: (gpu, own(device)[1])
    gemm_module._split_k_plan.cache_clear()
    gemm_module.clear_plans()
    try:
        fn()
    finally:
        gemm_module._gpu_of = own
        gemm_module._split_k_plan.cache_clear()
        gemm_module.clear_plans()


def decode_rows(torch, gemm, shapes) -> list[dict]:
    """The small-M path against cuBLAS, B in both layouts: TFLOP/s and ratios as for bf16, plus the plan it ran,
    GB/s moved (A, B once, C) per graph-timed call, and, where K is split, the atomic variant's TFLOP/s. On a GPU
    whose row in `kernels_lib/gpus.py` is not the reference H100 SXM's (an H200: its constants carried from the
    H100 fit, not measured), where the reference row would plan differently, also the op with that plan
    (`reference_plan`, `tessera_reference_row_*`): whether the GPU's own row picks the faster plan."""
    import os

    from tessera.kernels_lib import gemm_split_k, gpus
    from tessera.kernels_lib.gemm import ATOMIC_SPLIT_K_ENV, _gpu_of

    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    gpu = _gpu_of(torch.device("cuda", 0))
    rows = []
    for m, n, k in shapes:
        for layout in DECODE_LAYOUTS:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            weight = layout == "b-weight"
            b = torch.randn((n, k) if weight else (k, n), device="cuda", dtype=torch.bfloat16)
            theirs = (lambda: a @ b.t()) if weight else (lambda: a @ b)        # noqa: E731
            plan = gemm_split_k.small_m_plan(m, n, k, 2, num_sms, None, *gpu)
            row = {"m": m, "n": n, "k": k, "b_layout": layout, "split_k": plan.split_k,
                   "plan": {"BM": plan.BM, "BN": plan.BN, "BK": plan.BK, "STAGES": plan.STAGES}}
            try:
                compare(torch, row, lambda: gemm(a, b, trans_b=weight), theirs, "cublas", theirs(), m, n, k)
                moved = 2 * (m * k + k * n + m * n)
                for who in ("tessera", "cublas"):
                    if f"{who}_graph_tflops" in row:
                        seconds = 2 * m * n * k / (row[f"{who}_graph_tflops"] * 1e12)
                        row[f"{who}_graph_gbps"] = moved / seconds / 1e9
                if plan.split_k > 1 and "ratio" in row:
                    os.environ[ATOMIC_SPLIT_K_ENV] = "1"
                    try:
                        timed(torch, row, "tessera_atomic", lambda: gemm(a, b, trans_b=weight), 2 * m * n * k)
                    finally:
                        del os.environ[ATOMIC_SPLIT_K_ENV]
                reference = gemm_split_k.small_m_plan(m, n, k, 2, num_sms, None, gpus.H100_SXM, gpu[1])
                if gpu[0] is not gpus.H100_SXM and reference != plan and "ratio" in row:
                    row["reference_plan"] = {"BN": reference.BN, "STAGES": reference.STAGES,
                                             "split_k": reference.split_k}
                    planning_as(gpus.H100_SXM, lambda: timed(torch, row, "tessera_reference_row",
                                                             lambda: gemm(a, b, trans_b=weight), 2 * m * n * k))
            except Exception as error:
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
            rows.append(row)
            gpu_common.record("gemm_decode", row)
            atomic = (f"; atomic splits in a graph {row['tessera_atomic_graph_tflops']:6.1f}"
                      if "tessera_atomic_graph_tflops" in row else "")
            print(f"decode {m:>3} x {n:>5} x {k:>5} {layout:<11} BN {plan.BN:>2} split {plan.split_k}: "
                  + _describe(row, "cublas", "cuBLAS") + atomic, flush=True)
    return rows


def fp8_rows(torch, gemm, shapes) -> list[dict] | None:
    """e4m3 x e4m3 with per-tensor scales against torch._scaled_mm; None if torch cannot run it here."""
    fp8 = torch.float8_e4m3fn
    rows = []
    for m, n, k in shapes:
        if m % 16:
            continue                        # _scaled_mm needs M % 16 == 0
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
        row = {"m": m, "n": n, "k": k}
        try:
            compare(torch, row, lambda: gemm(a, b_t, None, scale_a, scale_b, trans_b=True), theirs, "scaled_mm",
                    expected, m, n, k)
        except Exception as error:
            row["error"] = f"{type(error).__name__}: {error}"[:2000]
        rows.append(row)
        gpu_common.record("gemm_fp8", row)
        print(f"fp8 {m:>5} x {n:>5} x {k:>5}: " + _describe(row, "scaled_mm", "_scaled_mm"), flush=True)
    return rows


def config_variants(torch):
    """Every config shipped for this GPU (`gemm_configs.configs_for`: the common ones and its family's, the
    cluster-multicast ones (CLUSTER_M / CLUSTER_N) next to their twins on sm_90), and on sm_90 each non-persistent one
    warp-specialized too, right after it (the cluster ones then multicast from the producer warpgroup, as CUTLASS's
    kernels); a persistent warp-specialized config comes right after its non-persistent twin's two rows; at the
    end, the persistent warp-specialized 128 x 256 ones with 4 stages (their C sliced to fit: against 3 stages,
    whether the deeper ring is worth the epilogue's per-block waits)."""
    import tessera
    from tessera.kernels_lib import gemm_configs

    hopper = torch is None or torch.cuda.get_device_capability() == (9, 0)
    shipped = gemm_configs.configs_for("sm_90" if hopper else gemm_configs.family_of(torch.cuda.get_device_capability()))
    variants = []
    for config in shipped:
        if gemm_configs.is_persistent_specialized(config):
            continue
        variants.append(config)
        if hopper and not config.kwargs["PERSISTENT"] and not config.kwargs.get("WS"):
            variants.append(tessera.Config(dict(config.kwargs, WS=True), num_warps=config.num_warps))
    for config in filter(gemm_configs.is_persistent_specialized, shipped):
        twin = dict(config.kwargs, PERSISTENT=False)
        at = next((i for i, c in enumerate(variants) if c.kwargs == twin), len(variants) - 1)
        variants.insert(at + 1, config)
    if hopper:      # a 4-stage ring fits beside C only with C staged in column-block slots (`tma_store.py`): last
        variants += [tessera.Config(dict(config.kwargs, STAGES=4), num_warps=config.num_warps)
                     for config in filter(gemm_configs.is_persistent_specialized, shipped)
                     if config.kwargs["BN"] == 256 and config.kwargs["STAGES"] == 3]
    return variants


def config_rows(torch, sizes) -> list[dict]:
    """TFLOP/s of every config variant pinned, per size."""
    from tessera.kernels_lib.gemm import gemm, pin_config

    rows = []
    for size in sizes:
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        for config in config_variants(torch):
            row = {"size": size, "config": config.kwargs, "num_warps": config.num_warps}
            pin_config(config)
            try:
                compare(torch, row, lambda: gemm(a, b), lambda: a @ b, "cublas", a @ b, size, size, size)
            except Exception as error:          # a config this GPU cannot compile or run: recorded, not fatal
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
            finally:
                pin_config(None)
            rows.append(row)
            gpu_common.record("gemm_configs", row)
            print(f"{size}^3 {config}: " + _describe(row, "cublas", "cuBLAS"), flush=True)
    return rows


def _split_k_call(torch, a, b):
    """(split-K of 128 x 128 tiles with the split count whose waves waste least, the count) for C = a @ b."""
    from tessera.kernels_lib import gemm_split_k
    m, k = a.shape
    n = b.shape[1]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = -(-m // 128) * -(-n // 128)
    split = min(range(2, 9), key=lambda s: (-(-tiles * s // sms) / s, s))     # waves per unit of work
    plan = gemm_split_k._even(128, 128, 64, 3, 8, k, split)
    flags = dict(HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none")

    def run():
        c = torch.empty(m, n, device="cuda", dtype=a.dtype)
        args = (a, b, c, c, c, c, m, n, k, 1.0, a.stride(0), a.stride(1), b.stride(0), b.stride(1))
        gemm_split_k.launch(args, plan, m, n, flags, a.device, element_bytes=2, fast=True)
        return c
    return run, plan.split_k


def stream_k_rows(torch, shapes) -> list[dict]:
    """Per shape: stream K, the data-parallel persistent kernel, split K and the autotuned op, each against
    cuBLAS (`compare`); stream K's plan (tiles split in K) and whether two of its runs give the same bits."""
    import os

    import importlib

    gemm_module = importlib.import_module("tessera.kernels_lib.gemm")     # (the package exports the function)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        split_k, splits = _split_k_call(torch, a, b)
        variants = [("stream_k", "1", None, lambda: gemm_module.gemm(a, b)),
                    ("persistent", "0", gemm_module.CONFIGS[5], lambda: gemm_module.gemm(a, b)),
                    (f"split_k_{splits}", "0", None, split_k),
                    ("autotuned", "0", None, lambda: gemm_module.gemm(a, b))]
        for name, mode, config, ours in variants:
            row = {"m": m, "n": n, "k": k, "variant": name}
            os.environ[gemm_module.STREAM_K_ENV] = mode
            gemm_module._stream_k_plan.cache_clear()
            gemm_module.clear_plans()
            gemm_module.pin_config(config)
            try:
                if name == "stream_k":
                    plan = gemm_module._stream_k_plan(m, n, k, 2, sms, False, "1",
                                                      *gemm_module._gpu_of(torch.device("cuda", 0)))
                    row["sk_tiles"] = None if plan is None else plan.sk_tiles
                    row["bitwise_repeatable"] = bool(torch.equal(ours(), ours()))
                compare(torch, row, ours, lambda: a @ b, "cublas", a @ b, m, n, k)
            except Exception as error:          # recorded, not fatal
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
            finally:
                gemm_module.pin_config(None)
                os.environ.pop(gemm_module.STREAM_K_ENV, None)
            rows.append(row)
            gpu_common.record("gemm_stream_k", row)
            print(f"stream_k {m} x {n} x {k} {name}: " + _describe(row, "cublas", "cuBLAS"), flush=True)
    gemm_module._stream_k_plan.cache_clear()
    gemm_module.clear_plans()
    return rows


def _describe(row: dict, theirs_key: str, theirs: str) -> str:
    if "error" in row or "wrong" in row:
        return ("ERROR " + row["error"]) if "error" in row else ("WRONG " + row["wrong"])
    text = (f"tessera {row['tessera_tflops']:6.1f}  {theirs} {row[theirs_key + '_tflops']:6.1f} TFLOP/s "
            f"({row['ratio']:.0%})")
    if "graph_ratio" in row:
        text += (f"; in a graph {row['tessera_graph_tflops']:6.1f} vs {row[theirs_key + '_graph_tflops']:6.1f} "
                 f"({row['graph_ratio']:.0%})")
    return text


def plot(rows: list[dict], path) -> None:
    gpu_common.ratio_plot(path, [f"{r['m']}x{r['n']}x{r['k']}" for r in rows],
                          {"per eager call": [r.get("ratio", 0.0) for r in rows],
                           "in a CUDA graph": [r.get("graph_ratio", 0.0) for r in rows]}, "tessera / cuBLAS (bf16)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", action="append", choices=PARTS, help="what to measure (default: all)")
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="all")
    parser.add_argument("--pin", type=int, help="launch CONFIGS[PIN] without autotuning (bf16 and fp8 parts)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU needed)")
    args = parser.parse_args()
    parts = args.part or list(PARTS)
    shapes = SHAPES[args.shapes]
    from tessera.kernels_lib.gemm import CONFIGS

    pinned = CONFIGS[args.pin] if args.pin is not None else None
    if args.dry_run:
        print(f"gemm: parts {parts}, {len(shapes)} shapes ({args.shapes}), "
              f"{'config ' + str(pinned) if pinned else 'autotuned'}, {len(config_variants(None))} config variants")
        return
    torch = gpu_common.require_gpu()
    from tessera.kernels_lib.gemm import gemm, pin_config

    result = {"environment": gpu_common.environment(torch), "shapes": args.shapes,
              "pinned": None if pinned is None else {"config": pinned.kwargs, "num_warps": pinned.num_warps}}
    pin_config(pinned)
    if "bf16" in parts and args.shapes == "decode":
        result.update(dtype="bf16", rows=decode_rows(torch, gemm, shapes))
    elif "bf16" in parts:
        result.update(dtype="bf16", rows=bf16_rows(torch, gemm, shapes))
    if "fp8" in parts:
        result.update(fp8_dtype="e4m3 in, per-tensor f32 scales, bf16 out", fp8_rows=fp8_rows(torch, gemm, shapes))
    pin_config(None)
    if "configs" in parts:
        result["config_rows"] = config_rows(torch, [4096, 8192])
    if "stream_k" in parts:
        result["stream_k_rows"] = stream_k_rows(torch, STREAM_K_SHAPES)
    name = "gemm" if parts == list(PARTS) and args.shapes == "all" else "gemm_" + "_".join(parts)
    if args.shapes == "decode":
        name += "_decode"
    gpu_common.write(name, result)
    if "rows" in result:
        plot(result["rows"], gpu_common.results_dir() / f"{name}.png")


if __name__ == "__main__":
    main()
