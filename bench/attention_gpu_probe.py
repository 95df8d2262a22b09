"""Which Hopper feature breaks the attention forward on the GPU: the failing test's problem, one variant each.

    python bench/attention_gpu_probe.py              # on a GPU machine: every variant, ~30 s
    python bench/attention_gpu_probe.py --dry-run    # on the CPU: compile each variant, show what its PTX uses

tests/kernels_lib/test_attention_on_gpu.py::test_forward_matches_sdpa fails on an H100 (sm_90a): q (2, 200, 4, D),
k and v (2, 333, 2, D) bf16, GQA 2:1, odd lengths; D = 64 not causal gives wrong O, the causal and D = 128 runs
an illegal memory access (bench/results/2026-11-26-h100-run7). The SIMT simulator computes the right answer for
the same plan and shape, so what differs is how the hardware reads one of the Hopper features the sm_90a PTX
uses. Each variant runs that problem in a subprocess of its own (an illegal address poisons the CUDA context
that met it, nothing else), with a fresh binary cache (the variants change the compiler, which the cache key
does not see), and prints one line: the PTX's features, then the max error of O and of LSE (LSE depends on
S = Q K^T only, so a right LSE and a wrong O put the fault in P V), or the error that ended it.

| variant        | what changes                                                    | PTX: dots / K,V loads          |
| -------------- | --------------------------------------------------------------- | ------------------------------ |
| sm90a          | nothing (the shipped path)                                      | wgmma, P in regs / 4-D TMA      |
| sm80           | compiled for sm_80, JIT-compiled by the driver                  | mma.sync / cp.async             |
| sm90           | compiled for sm_90 (TMA and mbarriers, no wgmma)                | mma.sync / 4-D TMA              |
| sm90a-cp-async | sm_90a without TMA                                              | wgmma, P in regs / cp.async     |
| sm90a-extents  | the maps' batch and head extents the tensors' own, not 2^31 - 1 | wgmma, P in regs / 4-D TMA      |
| sm90a-smem-p   | P stored to shared memory for P V instead of fed from registers | wgmma, P in smem / 4-D TMA      |
| sm90a-bm64     | one warpgroup a program (BM = 64) instead of two                | wgmma, P in regs / 4-D TMA      |
| sm90a-bn32     | 32 keys a step (BN = 32) instead of 64, two warpgroups as before | wgmma, P in regs / 4-D TMA      |

Reading it: sm80 right and sm90 wrong puts the fault in the TMA path (maps, coordinates, mbarrier byte
counts); sm90 right and sm90a wrong in wgmma (descriptors, Q's staging, register-A P); sm90a-cp-async,
-extents, -smem-p, -bm64 and -bn32 then say which part. (The fp8 forward of run 7 had a right LSE with the
head-dim-256 plan, BM = 64 and BN = 32, and a wrong one with BM = 128 and BN = 64: sm90a at D = 256, -bm64 and
-bn32 tell which of the two matters for bf16.)
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
# (variant, head dim, causal): the failing test's cases, then each variant on D = 64 (and causal where it crashed)
RUNS = [("sm90a", 64, False), ("sm90a", 64, True), ("sm90a", 128, False), ("sm90a", 256, False),
        ("sm80", 64, False), ("sm80", 64, True), ("sm90", 64, False), ("sm90", 64, True),
        ("sm90a-cp-async", 64, False), ("sm90a-cp-async", 64, True),
        ("sm90a-extents", 64, False), ("sm90a-extents", 64, True),
        ("sm90a-smem-p", 64, False), ("sm90a-bm64", 64, False), ("sm90a-bn32", 64, False)]
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
    if name == "sm90a-smem-p":
        import tessera.passes.lowering.wgmma_dot as wgmma_dot
        wgmma_dot.a_from_registers = lambda inst, plan, regs: False
    if name in ("sm90a-bm64", "sm90a-bn32"):
        import importlib
        attention_mod = importlib.import_module("tessera.kernels_lib.attention")     # (the package exports the op)
        nvidia = attention_mod.GPU_PLANS["nvidia"]
        tiles = dict(BM=64, num_warps=4) if name == "sm90a-bm64" else dict(BN=32)
        nvidia.update({d: dataclasses.replace(p, **tiles) for d, p in nvidia.items() if d != 256})
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


def child(name: str, D: int, causal: bool, dry_run: bool) -> dict:
    """Run (or, dry, compile) one variant in this process; the result as a dict."""
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "kernels_lib"))
    B, Sq, Sk, H, H_kv = (SHAPE[k] for k in ("B", "Sq", "Sk", "H", "H_kv"))
    k_shape = (B, Sk, H_kv, D)
    k_strides = torch.empty(k_shape).stride()
    target = apply_variant(name, k_shape, k_strides)
    from tessera.kernels_lib import attention
    from tessera.kernels_lib.attention_fwd import attention_fwd_kernel
    if dry_run:
        from test_attention_compile import FORWARD_SIGNATURE, VARIANTS as MASKS
        from tessera.kernels_lib.attention import GPU_PLANS
        plan = GPU_PLANS["nvidia"][D]
        compiled = attention_fwd_kernel.compile(
            target=target, strict=False, signature=FORWARD_SIGNATURE.format(t="bf16"), num_warps=plan.num_warps,
            D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages, WS=False, **dict(MASKS["plain"], HAS_RIGHT=causal))
        return {"ptx": ptx_features(compiled.stages["ptx"]), "status": "compiled"}
    from attention_reference import attention as reference
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=g).to(torch.bfloat16).cuda()
               for shape in ((B, Sq, H, D), k_shape, k_shape))
    out, lse = attention(q, k, v, causal=causal)
    torch.cuda.synchronize()
    ptx = next(iter(attention_fwd_kernel.launchers.values())).binary.ptx or ""
    expected, expected_lse = reference(q.cpu(), k.cpu(), v.cpu(), causal)
    err = (out.cpu().double() - expected).abs()
    bad = err > 2e-2 + 2e-2 * expected.abs()
    finite = ~torch.isinf(expected_lse)
    lse_err = (lse.cpu().double() - expected_lse).abs()[finite]
    rows_bad = bad.any(dim=3).any(dim=2)[0]            # (Sq,) rows of batch 0 with a wrong element
    return {"ptx": ptx_features(ptx), "status": "ok" if not bad.any() else "WRONG",
            "o_max_err": round(err.max().item(), 4), "o_bad": round(bad.double().mean().item(), 3),
            "lse_max_err": round(lse_err.max().item(), 4),
            "bad_rows_per_64": [int(rows_bad[i:i + 64].sum()) for i in range(0, Sq, 64)],
            "bad_heads": [int(bad[:, :, h].any()) for h in range(H)]}


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
    parser.add_argument("--jobs", type=int, default=4, help="variants run at once (default 4)")
    parser.add_argument("--timeout", type=float, default=45.0, help="seconds per variant (default 45)")
    parser.add_argument("--child", nargs=3, metavar=("VARIANT", "D", "CAUSAL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, D, causal = args.child
        print(json.dumps(child(name, int(D), causal == "1", args.dry_run)), flush=True)
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
