"""Warp specialization to PTX: setmaxnreg, elect_sync and named_barrier lower to their sm_90a instructions, the
warp-specialized GEMM (`ws_gemm_programs.py`, also run by the SIMT simulator in
`tests/interp/test_simt_ws_gemm.py`) assembles with ptxas without spilling, and targets without the
instructions refuse them before LLVM (NVIDIA below sm_90a, AMD by name)."""

import re

import pytest
from ws_gemm_programs import ws_gemm

from tessera.backends.amdgpu import compile_thread_ir as compile_for_amd
from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.backends.nvptx.errors import CodegenError
from ir_text import kernel

HAS_PTXAS = find_ptxas() is not None


def ops_kernel(*body: str, threads: int = 384) -> str:
    return (f"func @ws_ops(%out: ptr<i32>) attributes {{num_threads = {threads}}} {{\n  %tid = thread_id : i32\n"
            + "".join(f"  {line}\n" for line in body) + "  return\n}\n")


ELECT = ("%e = elect_sync : bool", "%v = cast %e : i32", "%p = addptr %out, %tid : ptr<i32>", "store %p, %v")


def test_each_op_lowers_to_its_instruction_and_assembles_for_sm_90a():
    text = ops_kernel('setmaxnreg {action = "dec", count = 40}', 'setmaxnreg {action = "inc", count = 232}',
                      *ELECT, "named_barrier {count = 256, id = 1}")
    artifacts = compile_thread_ir(kernel(text), "sm_90a", assemble=HAS_PTXAS)
    ptx = artifacts.ptx
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+40;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232;", ptx)
    assert re.search(r"elect\.sync\s+%r\d+\|%p\d+, -1;", ptx)
    assert re.search(r"bar\.sync\s+1, 256;", ptx)
    # ptxas honours setmaxnreg only when the register count at entry is fixed: .maxntid and .minnctapersm 1
    assert ".maxntid 384" in ptx and ".minnctapersm 1" in ptx
    if HAS_PTXAS:
        assert artifacts.cubin and "setmaxnreg' ignored" not in artifacts.ptxas_info["log"]


@pytest.mark.parametrize("stages", [2, 4])
def test_warp_specialized_gemm_assembles_for_sm_90a_without_spills(stages):
    artifacts = compile_thread_ir(kernel(ws_gemm(stages)), "sm_90a", assemble=HAS_PTXAS)
    ptx = artifacts.ptx
    assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes") == 2
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16", ptx)) == 4
    assert "setmaxnreg.dec.sync.aligned.u32" in ptx and "setmaxnreg.inc.sync.aligned.u32" in ptx
    assert "elect.sync" in ptx and "mbarrier.try_wait.parity.shared.b64" in ptx
    if HAS_PTXAS:
        info = artifacts.ptxas_info
        assert info["spill_stores"] == 0 and info["spill_loads"] == 0, info["log"]
        assert info["registers"] <= 65536 // 384, info["log"]   # one block of 384 threads fits the register file
        assert "ignored" not in info["log"]


@pytest.mark.parametrize("target, line, message", [
    ("sm_90", 'setmaxnreg {action = "dec", count = 40}', "setmaxnreg needs sm_90a, which sm_90 is not"),
    ("sm_80", 'setmaxnreg {action = "dec", count = 40}', "setmaxnreg needs sm_90a, which sm_80 is not"),
    ("sm_80", "%e = elect_sync : bool", r"elect_sync needs sm_90\+, which sm_80 is not"),
])
def test_targets_without_the_instruction_refuse_it_before_llvm(target, line, message):
    with pytest.raises(CodegenError, match=message):
        compile_thread_ir(kernel(ops_kernel(line)), target, assemble=False)


def test_named_barriers_are_plain_bar_sync_on_every_nvidia_target():
    ptx = compile_thread_ir(kernel(ops_kernel("named_barrier {count = 64, id = 3}")), "sm_80", assemble=False).ptx
    assert re.search(r"bar\.sync\s+3, 64;", ptx)


@pytest.mark.parametrize("line", ['setmaxnreg {action = "dec", count = 40}', "%e = elect_sync : bool",
                                  "named_barrier {count = 64, id = 1}"])
def test_amd_targets_refuse_the_ops_by_name(line):
    op = line.split()[0] if not line.startswith("%") else line.split()[2]
    with pytest.raises(CodegenError, match=f"{op}.*NVIDIA instruction that AMD GPUs lack.*gfx942"):
        compile_for_amd(kernel(ops_kernel(line, threads=128)), "gfx942")
