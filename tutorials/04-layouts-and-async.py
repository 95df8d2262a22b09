"""Tutorial 04: one GEMM, step by step, and what each step changes in the code.

C = A @ B, taken from a naive loop to the tensor cores and asynchronous copies:

  1. naive       one output element per lane, a scalar K loop of pointer loads;
  2. tiled f32   BM x BN blocks with `tessera.dot` on f32 tiles: FMA-style
                 lowering (mul.rn + add.rn, rounded like the interpreter);
  3. tiled f16   the same kernel with f16 inputs and an f32 accumulator:
                 on sm_80 `dot` becomes tensor cores, `mma.sync` m16n8k16 fed
                 by `ldmatrix` from swizzled shared memory;
  4. pinned      `tessera.convert_layout` pins the accumulator's register layout
                 (built from `tessera.layouts.mma_m16n8k16_c()`). Pinning the
                 layout the compiler would pick anyway (4a) changes nothing;
                 pinning another warp arrangement (4b) costs a trip through
                 shared memory every K step -- the diff in the thread IR shows it;
  5. pipelined   the K loop is `tessera.pipeline(..., stages=3)` instead of
                 a plain loop (stages=1 in steps 2-4 keeps it plain; a bare
                 `range` K loop feeding a dot, as in tutorial 03, gets the
                 same 3 stages from the compiler on its own): the
                 blocks of the next two K steps are copied into shared-memory
                 ring buffers with cp.async while the tensor cores work on
                 this one, and ldmatrix reads them from there -- no register
                 round trip, one barrier per K step instead of four;
  6. by hand     the same double buffering written out with the explicit
                 primitives (`tessera.shared`, `async_copy`, `async_commit`,
                 `async_wait`, `barrier`): the schedule is the author's, and the
                 CPU interpreter still catches a missing wait;
  7. Hopper      step 5's kernel compiled for sm_90a: the ring slots are filled
                 by TMA (`cp.async.bulk.tensor`, from tensor maps the launcher
                 builds on the host and passes as grid constants, with one
                 mbarrier per slot) and read by `wgmma.mma_async` straight from
                 shared memory, one group of wgmmas in flight;
  8. specialized `tessera.pipeline(..., warp_specialize=True)`: an extra
                 warpgroup, the producer, only issues the TMA copies, running
                 ahead of the consumer warps as far as the ring allows (a
                 "full" and an "empty" mbarrier per slot); the consumers only
                 wait, compute and release. With 8+ consumer warps the
                 producer also hands its registers over (`setmaxnreg`).

Steps 1-6 compile for sm_80 and steps 7-8 for sm_90a. Each step runs on the CPU
interpreter at a small size and is checked against numpy; the table lists
facts about the PTX (static instruction counts), registers and spills (from
ptxas, when it is installed) and shared memory. With a CUDA GPU and torch each
step is also timed at 4096^3 (steps 7-8 only on Hopper); without one the
table says so. A launch compiles for the GPU it runs on, so on a Hopper GPU
steps 1-6 are timed as sm_90a code, not as the sm_80 code the table
describes: their f16 dots run on wgmma there, step 5's ring is filled by TMA,
and step 4a's pin, the layout inferred for mma.sync, is no longer free (on an
H200: 73 TFLOP/s for step 3, 21 for 4a, whose PTX for sm_80 is step 3's).

    python tutorials/04-layouts-and-async.py
"""

import re
import sys
from collections import Counter

import numpy as np

import tessera
from tessera.backends.nvptx import find_ptxas

L = tessera.layouts


@tessera.kernel
def matmul_naive(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)   # one element of C per lane
    row, col = offs // N, offs % N
    inside = offs < M * N
    acc = tessera.zeros((BLOCK,), dtype=tessera.f32)
    for k in range(0, K):                                              # K scalar loads of A and B
        a = tessera.load(a_ptr + row * K + k, mask=inside, other=0.0)
        b = tessera.load(b_ptr + k * N + col, mask=inside, other=0.0)
        acc += a.to(tessera.f32) * b.to(tessera.f32)
    tessera.store(c_ptr + offs, acc, mask=inside)


@tessera.kernel
def matmul_tiled(a_ptr, b_ptr, c_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                 BK: tessera.constexpr, ACC: tessera.constexpr, STAGES: tessera.constexpr,
                 WS: tessera.constexpr = False):
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    c = tessera.view(c_ptr, (M, N))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES, warp_specialize=WS):  # stages=1: plain
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
        if ACC is not None:                        # a constexpr: the pin is there or not at trace time
            acc = tessera.convert_layout(acc, ACC)
    c.block((BM, BN), (pid_m, pid_n)).store(acc)



@tessera.kernel
def matmul_by_hand(a_ptr, b_ptr, c_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                   BK: tessera.constexpr):
    """Step 5's double buffering, written out: copy K block k+1 while the tensor cores work on block k."""
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    c = tessera.view(c_ptr, (M, N))
    a_smem = tessera.shared((2, BM, BK), a_ptr.dtype)              # two slots per operand
    b_smem = tessera.shared((2, BK, BN), b_ptr.dtype)
    tessera.async_copy(a_smem[0], a.block((BM, BK), (pid_m, 0)))   # block 0 in flight
    tessera.async_copy(b_smem[0], b.block((BK, BN), (0, pid_n)))
    tessera.async_commit()
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in range(0, tessera.cdiv(K, BK)):
        slot = k % 2
        tessera.async_copy(a_smem[1 - slot], a.block((BM, BK), (pid_m, k + 1)))   # past the end: zeros
        tessera.async_copy(b_smem[1 - slot], b.block((BK, BN), (k + 1, pid_n)))
        tessera.async_commit()
        tessera.async_wait(1)              # block k has landed (block k+1 may still be in flight) ...
        tessera.barrier()                  # ... for every thread's copies
        acc = tessera.dot(a_smem[slot].load(), b_smem[slot].load(), acc)
        tessera.barrier()                  # everyone is done with this slot before it is refilled
    tessera.async_wait(0)
    c.block((BM, BN), (pid_m, pid_n)).store(acc)

BM, BN, BK, NUM_WARPS, BLOCK = 64, 64, 32, 4, 128
TILED = dict(BM=BM, BN=BN, BK=BK, STAGES=1)
MMA_C = L.mma_m16n8k16_c()                          # one warp's 16x8 accumulator fragment
# What layout assignment picks for a 64x64 accumulator and 4 warps: 2x2 warps, each 2x4 fragments.
INFERRED = L.local(2, 4) * L.spatial(2, 2) * MMA_C
WARPS_ALONG_N = L.local(4, 2) * L.spatial(1, 4) * MMA_C   # same shape, warps side by side in N

# (name, kernel, input dtype, target, constexprs)
STEPS = [
    ("1 naive (f32)", matmul_naive, "f32", "sm_80", dict(BLOCK=BLOCK)),
    ("2 tiled dot (f32)", matmul_tiled, "f32", "sm_80", dict(TILED, ACC=None)),
    ("3 tiled dot (f16)", matmul_tiled, "f16", "sm_80", dict(TILED, ACC=None)),
    ("4a pin = inferred", matmul_tiled, "f16", "sm_80", dict(TILED, ACC=INFERRED)),
    ("4b pin warps 1x4", matmul_tiled, "f16", "sm_80", dict(TILED, ACC=WARPS_ALONG_N)),
    ("5 pipelined x3", matmul_tiled, "f16", "sm_80", dict(TILED, ACC=None, STAGES=3)),
    ("6 by hand x2", matmul_by_hand, "f16", "sm_80", dict(BM=BM, BN=BN, BK=BK)),
    ("7 Hopper x4", matmul_tiled, "f16", "sm_90a", dict(TILED, ACC=None, STAGES=4)),
    ("8 specialized x4", matmul_tiled, "f16", "sm_90a", dict(TILED, ACC=None, STAGES=4, WS=True)),
]


def grid_for(kernel, M, N):
    return (tessera.cdiv(M * N, BLOCK),) if kernel is matmul_naive else (tessera.cdiv(M, BM), tessera.cdiv(N, BN))


def check_on_cpu(kernel, dtype, constexprs, M=72, N=80, K=96):
    """Run on the CPU interpreter (edges not multiples of the blocks) and compare with numpy."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(dtype)
    b = rng.standard_normal((K, N)).astype(dtype)
    c = np.zeros((M, N), dtype=np.float32)
    kernel[grid_for(kernel, M, N)](a, b, c, M, N, K, **constexprs)
    np.testing.assert_allclose(c, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-4, atol=1e-3)


def compiler_facts(compiled):
    """Static PTX instruction counts and what ptxas / the allocator report."""
    ptx, meta = compiled.stages["ptx"], compiled.metadata
    count = lambda pattern: len(re.findall(pattern, ptx))   # noqa: E731
    spills = (f"{meta['spill_stores']}/{meta['spill_loads']}" if "spill_stores" in meta else "n/a")
    return {"mma.sync": count(r"\bmma\.sync"), "wgmma": count(r"\bwgmma\.mma_async"),
            "ldmatrix": count(r"\bldmatrix"), "mul.rn.f32": count(r"\bmul\.rn\.f32"),
            "ld.v4": count(r"\bld\.global(?:\.nc)?\.v4"), "cp.async": count(r"\bcp\.async\.c[ag]\.shared"),
            "TMA": count(r"\bcp\.async\.bulk\.tensor"), "bar.sync": count(r"\bbar(?:rier)?\.sync"),
            "threads": meta["num_threads"], "regs": meta.get("registers", "n/a"), "spills st/ld": spills, "smem B": meta["shared_bytes"]}


def thread_ir_ops(compiled) -> Counter:
    """How many of each op the thread IR holds (with or without results)."""
    return Counter(re.findall(r"^\s*(?:%[^=]*=\s*)?([a-z_][\w.]*)", compiled.stages["thread_ir"], re.M))


def gpu_tflops(kernel, dtype, target, constexprs, size=4096):
    """TFLOP/s at size^3 on the GPU, or None without torch and CUDA (or, for sm_90a steps, without Hopper)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or (target == "sm_90a" and torch.cuda.get_device_capability() != (9, 0)):
        return None
    tdtype = torch.float16 if dtype == np.float16 else torch.float32
    a = torch.randn(size, size, device="cuda", dtype=tdtype)
    b = torch.randn(size, size, device="cuda", dtype=tdtype)
    c = torch.empty(size, size, device="cuda", dtype=torch.float32)
    launch = lambda: kernel[grid_for(kernel, size, size)](a, b, c, size, size, size, **constexprs)  # noqa: E731
    launch()
    torch.testing.assert_close(c, (a.float() @ b.float()), rtol=1e-2, atol=1e-1)
    for _ in range(3):
        launch()
    # 20 launches queued back to back between two events: the GPU's time per launch, not the host's
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        launch()
    end.record()
    end.synchronize()
    return 2 * size ** 3 / (start.elapsed_time(end) / 20 * 1e-3) / 1e12


def device_target() -> str | None:
    """The target a launch compiles for on this machine's GPU (sm_90a on Hopper), or None without one."""
    from tessera.runtime import cuda

    return cuda.get_device(0).target if cuda.device_count() else None


GPU_COLUMN = "TFLOP/s" + (f" as {device_target()}" if device_target() else "")


def main() -> None:
    if "--dry-run" in sys.argv:       # bench/gpu_session.py checks its steps on the CPU this way
        print("tutorial 04: " + ", ".join(name for name, *_ in STEPS))
        return
    rows, compiled_by_step = [], {}
    for name, kernel, dt, target, constexprs in STEPS:
        dtype = np.float16 if dt == "f16" else np.float32
        check_on_cpu(kernel, dtype, constexprs)
        compiled = kernel.compile(signature=f"*{dt}:16,*{dt}:16,*f32:16,i32:16,i32:16,i32:16",
                                  target=target, num_warps=NUM_WARPS, **constexprs)
        compiled_by_step[name[:2].strip()] = compiled
        tflops = gpu_tflops(kernel, dtype, target, constexprs)
        rows.append({"step": name, "target": target, **compiler_facts(compiled),
                     GPU_COLUMN: "n/a" if tflops is None else f"{tflops:.1f}"})

    columns = list(rows[0])
    widths = {col: max(len(col), *(len(str(r[col])) for r in rows)) for col in columns}
    print(f"GEMM steps, {NUM_WARPS} warps, blocks {BM}x{BN}x{BK} (PTX counts are static):")
    print("  ".join(col.ljust(widths[col]) for col in columns))
    for r in rows:
        print("  ".join(str(r[col]).ljust(widths[col]) for col in columns))
    if find_ptxas() is None:
        print("(registers and spills need ptxas; it is not installed here)")
    if all(r[GPU_COLUMN] == "n/a" for r in rows):
        print("(GPU timings need a CUDA GPU and torch; none here, so the TFLOP/s column is n/a)")

    # Step 4: what a pin changes. Pinning the inferred layout is free: the PTX is step 3's.
    same = compiled_by_step["4a"].stages["ptx"] == compiled_by_step["3"].stages["ptx"]
    print(f"4a: pinning the inferred accumulator layout {INFERRED} leaves the PTX "
          f"{'identical to' if same else 'different from'} step 3")
    before, after = thread_ir_ops(compiled_by_step["3"]), thread_ir_ops(compiled_by_step["4b"])
    changed = {op: after[op] - before[op] for op in sorted(before | after) if after[op] != before[op]}
    print(f"4b: pinning {WARPS_ALONG_N} makes every K step convert the accumulator "
          f"through shared memory; thread-IR op counts change by {changed}")
    before, after = thread_ir_ops(compiled_by_step["3"]), thread_ir_ops(compiled_by_step["5"])
    changed = {op: after[op] - before[op] for op in sorted(before | after) if after[op] != before[op]
               and (op.startswith(("async", "barrier", "ldmatrix", "shared", "load", "store")))}
    print(f"5: pipelining swaps the per-step register round trip for cp.async ring buffers; thread-IR memory and "
          f"sync op counts change by {changed}")
    before, after = thread_ir_ops(compiled_by_step["5"]), thread_ir_ops(compiled_by_step["6"])
    print(f"6: by hand, the kernel issues the same kinds of copies and waits as step 5 "
          f"({after['async_copy']} vs {before['async_copy']} async_copy ops, {after['async_wait']} vs "
          f"{before['async_wait']} async_wait), with the schedule in its own source")
    print(f"8: warp specialization adds a producer warpgroup ({compiled_by_step['8'].metadata['num_threads']} "
          f"threads instead of {compiled_by_step['7'].metadata['num_threads']}); only it issues TMA copies, and "
          f"the consumers wait on mbarriers instead of a block-wide barrier per K step")
    print("every step, run on the CPU interpreter at 72x80x96 with f32 or f16 inputs -- matches numpy")


if __name__ == "__main__":
    main()
