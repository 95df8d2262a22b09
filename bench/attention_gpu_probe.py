"""The attention kernels' failing GPU problems on the H100, one compiler variant each: what fixes them, what not.

    python bench/attention_gpu_probe.py              # on a GPU machine: every run, 8 at a time, under a minute
    python bench/attention_gpu_probe.py --dry-run    # on the CPU: compile each run's kernel, show what its PTX uses

tests/kernels_lib/test_attention_on_gpu.py failed on an H100 (bench/results/2026-11-26-h100-run7): the forward on
q (2, 200, 4, D), k and v (2, 333, 2, D) bf16 (GQA 2:1, odd lengths) gave a wrong O at D = 64 and an illegal
memory access causal and at D = 128; the fp8 forward's LSE was wrong except at D = 256. Cause: with two or more
consumer warpgroups (BM = 128, the warp-specialized plans, the sm_90a backward plans) each warpgroup's A
descriptor was its tile's plus a 64-bit product of the shuffled warpgroup index, which ptxas (12.9 and 13.0)
compiled without the descriptor's high word (SBO, swizzle): the wgmma read Q through a stale uniform register.
`passes/lowering/wgmma_dot.py` now offsets the pointer instead, in 32 bits (`sass.unset_descriptor_words` finds
the dropped word in SASS on the CPU). Each run below is one subprocess (an illegal address poisons only the
CUDA context that met it) with a fresh binary cache (the variants patch the compiler, which the cache key does
not see), and prints one line: the PTX's features, the max error of O and of LSE (LSE depends on S = Q K^T
only) or of dQ, dK, dV, or the error that ended it.

| variant        | what changes                                                          | expected          |
| -------------- | --------------------------------------------------------------------- | ----------------- |
| sm90a          | nothing: the shipped path (wgmma, P in registers, 4-D TMA)            | ok                |
| sm90a-old-desc | the slab offset added to the descriptor as before the fix             | WRONG or CRASH    |
| sm90a-ws       | TESSERA_ATTENTION_WS=1: a producer warpgroup, two consumers           | ok                |
| sm90a-bwd      | the backward (dQ, dK, dV) of test_backward_matches_float64_gradients  | ok                |
| sm80 / sm90    | compiled for sm_80 (mma.sync, cp.async) / sm_90 (mma.sync, 4-D TMA)   | ok                |
| sm90a-cp-async | sm_90a without TMA (K and V by cp.async)                              | ok                |
| sm90a-extents  | the maps' batch and head extents the tensors' own, not 2^31 - 1       | ok                |
| sm90a-smem-p   | P stored to shared memory for P V instead of fed from registers       | ok                |
| sm90a-bm64     | one warpgroup a program (BM = 64; never had the fault)                | ok                |
| sm90a-big      | the shipped path on bench/attention.py's first shape (4 x 4096, 16   | ok                |
|                | heads; its run 8 crashed): large strides in the TMA maps, vs SDPA    |                   |

Anything but `ok` where ok is expected is a second fault: the variants around it say which feature it is in
(sm80 ok and sm90 wrong: the TMA path; sm90 ok and sm90a wrong: wgmma; then -cp-async, -extents, -smem-p).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(B=2, Sq=200, Sk=333, H=4, H_kv=2)
# (variant, head dim, causal): the failing test's cases on the shipped path, the fault put back, then the others
RUNS = [("sm90a", 64, False), ("sm90a", 64, True), ("sm90a", 128, False), ("sm90a", 128, True), ("sm90a", 256, True),
        ("sm90a-old-desc", 64, False), ("sm90a-old-desc", 128, False),
        ("sm90a-ws", 64, True), ("sm90a-ws", 128, False), ("sm90a-bwd", 64, True), ("sm90a-bwd", 128, True),
        ("sm80", 64, True), ("sm90", 64, True), ("sm90a-cp-async", 64, True), ("sm90a-extents", 64, True),
        ("sm90a-smem-p", 64, False), ("sm90a-bm64", 64, True), ("sm90a-big", 128, True)]
VARIANTS = sorted({name for name, _, _ in RUNS})


def apply_variant(name: str, k_shape: tuple, k_strides: tuple) -> str:
    """Patch this process's compiler and runtime for variant `name`; returns the target it compiles for."""
    import tessera.ir.target as target_mod
    import tessera.runtime.cuda as cuda_runtime

    target = {"sm80": "sm_80", "sm90": "sm_90"}.get(name, "sm_90a")
    cuda_runtime.target_name = lambda capability: target          # what the launcher compiles for
    if name == "sm90a-cp-async":
        t = target_mod.TARGETS["sm_90a"]
        target_mod.TARGETS["sm_90a"] = dataclasses.replace(t, features=t.features - {"tma"})
    if name == "sm90a-old-desc":       # the slab offset added to the descriptor as a 64-bit product, as before
        from tessera.ir import dtypes as dt
        from tessera.passes.lowering import wgmma_dot
        fixed = wgmma_dot.SharedOperand.descriptor

        def descriptor(self, ctx, k_slice, mn_first, group=None):
            desc = fixed(self, ctx, k_slice, mn_first)
            if group is not None:
                step = self.tile.descriptor(0, 0, wgmma_dot.WGMMA_M).start >> 4
                desc = ctx.emit("add", desc, ctx.emit("mul", ctx.cast(group, dt.i64), ctx.const(step, dt.i64)))
            return desc
        wgmma_dot.SharedOperand.descriptor = descriptor
    if name == "sm90a-smem-p":
        import tessera.passes.lowering.wgmma_dot as wgmma_dot
        wgmma_dot.a_from_registers = lambda inst, plan, regs: False
    if name == "sm90a-ws":
        os.environ["TESSERA_ATTENTION_WS"] = "1"
    if name == "sm90a-bm64":
        import importlib
        attention_mod = importlib.import_module("tessera.kernels_lib.attention")     # (the package exports the op)
        nvidia = attention_mod.GPU_PLANS["nvidia"]
        nvidia.update({d: dataclasses.replace(p, BM=64, num_warps=4) for d, p in nvidia.items() if d != 256})
    if name == "sm90a-extents":        # every dim as long as the tensor's own (matched by its byte stride)
        from tessera.ir import tensor_map
        element = 2
        real = {s * element: n for n, s in zip(k_shape, k_strides)}
        describe = tensor_map.TensorMapRecipe.describe

        def bounded(self, args, address, source=None):
            d = describe(self, args, address, source)
            shape = tuple(real.get(st, n) if n >= tensor_map.UNBOUNDED else n for n, st in zip(d.shape, d.strides))
            return dataclasses.replace(d, shape=shape)
        tensor_map.TensorMapRecipe.describe = bounded
    return target


def ptx_features(ptx: str) -> str:
    """What the PTX computes and loads with, in a few words."""
    dots = "wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if "mma.sync" in ptx else "no dot"
    if "wgmma.mma_async" in ptx:
        dots += ", P in regs" if "}, {%r" in ptx else ", P in smem"
    loads = "TMA-4d" if "cp.async.bulk.tensor.4d" in ptx else "cp.async" if "cp.async.cg" in ptx else "plain"
    return f"{dots} / {loads}"


def child(name: str, D: int, causal: bool, dry_run: bool, device: str = "cuda") -> dict:
    """Run (or, dry, compile) one variant in this process; the result as a dict. (`device="cpu"` runs it on the
    tile interpreter: a check of this script, not of the GPU.)"""
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "kernels_lib"))
    backward, big = name == "sm90a-bwd", name == "sm90a-big"
    B, Sq, Sk, H, H_kv = (1, 130, 150, 4, 2) if backward else (4, 4096, 4096, 16, 16) if big else \
        (SHAPE[k] for k in ("B", "Sq", "Sk", "H", "H_kv"))
    k_shape = (B, Sk, H_kv, D)
    target = apply_variant(name, k_shape, torch.empty(k_shape).stride())
    if dry_run:
        return {"ptx": ptx_features(compile_dry(name, target, D, causal).stages["ptx"]), "status": "compiled"}
    from attention_reference import attention as reference
    from tessera.kernels_lib import attention
    from tessera.kernels_lib.attention_fwd import attention_fwd_kernel
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=g).to(torch.bfloat16).to(device).requires_grad_(backward)
               for shape in ((B, Sq, H, D), k_shape, k_shape))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out, lse = attention(q, k, v, causal=causal)
    sync()
    launchers = list(attention_fwd_kernel.launchers.values())
    ptx = (launchers[0].binary.ptx or "") if launchers else ""
    if backward:        # tolerance as in test_backward_matches_float64_gradients
        grad = torch.randn(out.shape, generator=g).to(torch.bfloat16).to(device)
        got = torch.autograd.grad(out, (q, k, v), grad)
        sync()
        leaves = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
        expected = torch.autograd.grad(reference(*leaves, causal)[0], leaves, grad.cpu().double())
        errors = [(a.cpu().double() - e).abs() for a, e in zip(got, expected)]
        bad = any(bool((err > 3e-2 + 3e-2 * e.abs()).any()) for err, e in zip(errors, expected))
        return {"ptx": ptx_features(ptx), "status": "WRONG" if bad else "ok",
                **{f"d{x}_max_err": round(err.max().item(), 4) for x, err in zip("qkv", errors)}}
    if big:             # float32 SDPA on the GPU (a float64 reference on the host would take minutes)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        expected = sdpa(*(x.float().transpose(1, 2) for x in (q, k, v)), is_causal=causal).transpose(1, 2)
        err = (out.float() - expected).abs()
        bad = int((err > 2e-2 + 2e-2 * expected.abs()).sum())
        return {"ptx": ptx_features(ptx), "status": "WRONG" if bad else "ok", "o_max_err": round(err.max().item(), 4),
                "o_bad_elements": bad}
    expected, expected_lse = reference(q.cpu(), k.cpu(), v.cpu(), causal)
    err = (out.cpu().double() - expected).abs()
    bad = err > 2e-2 + 2e-2 * expected.abs()
    finite = ~torch.isinf(expected_lse)
    lse_err = (lse.cpu().double() - expected_lse).abs()[finite]
    rows_bad = bad.any(dim=3).any(dim=2)[0]            # (Sq,) rows of batch 0 with a wrong element
    return {"ptx": ptx_features(ptx), "status": "ok" if not bad.any() else "WRONG",
            "o_max_err": round(err.max().item(), 4), "o_bad": round(bad.double().mean().item(), 3),
            "lse_max_err": round(lse_err.max().item(), 4),
            "bad_rows_per_64": [int(rows_bad[i:i + 64].sum()) for i in range(0, Sq, 64)]}


def compile_dry(name: str, target: str, D: int, causal: bool):
    """The kernel a run launches first (the forward; for sm90a-bwd the dK/dV kernel), compiled for `target`."""
    from test_attention_compile import FORWARD_SIGNATURE, VARIANTS as MASKS, backward_kernels
    from tessera.kernels_lib.attention import GPU_PLANS, WS_GPU_PLANS
    from tessera.kernels_lib.attention_fwd import attention_fwd_kernel
    masks = dict(MASKS["plain"], HAS_RIGHT=causal)
    if name == "sm90a-bwd":
        _, kernel, signature, _, plan, extra = next(c for c in backward_kernels("sm_90a") if c[3] == D)
        return kernel.compile(target=target, strict=False, signature=signature.format(t="bf16"),
                              num_warps=plan.num_warps, D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages, **extra,
                              **masks)
    plan = (WS_GPU_PLANS if name == "sm90a-ws" else GPU_PLANS["nvidia"])[D]
    return attention_fwd_kernel.compile(target=target, strict=False, signature=FORWARD_SIGNATURE.format(t="bf16"),
                                        num_warps=plan.num_warps, D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages,
                                        WS=plan.ws, **masks)


def run_one(run: tuple, dry_run: bool, timeout: float) -> tuple:
    name, D, causal = run
    with tempfile.TemporaryDirectory(prefix="tessera-probe-") as cache:
        env = dict(os.environ, TESSERA_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
        env.pop("TESSERA_STRICT", None)
        cmd = [sys.executable, __file__, "--child", name, str(D), str(int(causal))] + (["--dry-run"] if dry_run else [])
        start = time.time()
        try:
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return run, {"status": f"TIMEOUT after {timeout:.0f} s"}, time.time() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        return run, json.loads(lines[-1]), time.time() - start
    last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return run, {"status": "CRASH" if "illegal" in done.stderr.lower() else "ERROR", "error": last[-300:]}, \
        time.time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="compile each variant on the CPU, launch nothing")
    parser.add_argument("--jobs", type=int, default=8, help="runs at once (default 8: a GPU machine has 16 cores)")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per run (default 90)")
    parser.add_argument("--child", nargs=3, metavar=("VARIANT", "D", "CAUSAL"), help=argparse.SUPPRESS)
    parser.add_argument("--cpu", action="store_true", help=argparse.SUPPRESS)     # --child on the interpreter
    args = parser.parse_args()
    if args.child:
        name, D, causal = args.child
        print(json.dumps(child(name, int(D), causal == "1", args.dry_run, "cpu" if args.cpu else "cuda")), flush=True)
        return
    start = time.time()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda r: run_one(r, args.dry_run, args.timeout), RUNS))
    for (name, D, causal), result, seconds in results:
        result = dict(result)
        status, ptx = result.pop("status"), result.pop("ptx", "?")
        print(f"{name:15s} D={D:<3d} {'causal' if causal else 'full  '} {status:8s} [{ptx}] {seconds:4.1f}s "
              f"{json.dumps(result)}", flush=True)
    print(f"total {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
