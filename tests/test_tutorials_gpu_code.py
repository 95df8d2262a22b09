"""The tutorials compile to PTX for sm_80 and sm_90a with wide memory accesses and no spills,
and their lowered code computes what the tile interpreter computes (SIMT simulator)."""

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from tessera.backends.interp import run_function

from tessera.backends.simt import run_threads
from tessera.backends.nvptx import find_ptxas
from tessera.ir.target import get_target
from tessera.passes.thread_passes import lower

ROOT = Path(__file__).resolve().parents[1]
needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")

WIDE_ACCESSES = [r"ld\.global(\.nc)?\.v4\.b32", r"st\.global\.v4\.b32"]   # 128-bit loads and stores
# the matmul's plain `range` K loop is pipelined on its own: its blocks arrive by 16-byte cp.async (sm_80) or TMA
PIPELINED_LOADS = {"sm_80": r"cp\.async\.cg\.shared\.global \[%rd\d+\], \[%rd\d+\], 16",
                   "sm_90a": r"cp\.async\.bulk\.tensor"}
# and its C block leaves by 128-bit stores (sm_80) or one TMA store from shared memory (sm_90a, `tma_store.py`)
MATMUL_STORES = {"sm_80": WIDE_ACCESSES[1], "sm_90a": r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta"}

# kernel, signature, constexprs
CASES = {
    "01-vector-add.py:add": ("*f32:16,*f32:16,*f32:16,i32:16", {"BLOCK": 1024}),
    "02-fused-softmax.py:softmax": ("*f32:16,*f32:16,i32:16,i32:16", {"BLOCK": 1024}),
    "03-matmul.py:matmul": ("*f16:16,*f16:16,*f16:16,i32:16,i32:16,i32:16", {"BM": 64, "BN": 64, "BK": 32}),
}


def tutorial_kernel(spec: str):
    file, name = spec.split(":")
    module_spec = importlib.util.spec_from_file_location(file.replace("-", "_")[:-3], ROOT / "tutorials" / file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, name)


@needs_ptxas
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("spec", CASES)
def test_tutorial_assembles_with_wide_accesses_and_no_spills(spec, target):
    signature, constexprs = CASES[spec]
    compiled = tutorial_kernel(spec).compile(signature=signature, target=target, **constexprs)
    assert compiled.cubin, "ptxas produced a cubin"
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0
    patterns = [PIPELINED_LOADS[target], MATMUL_STORES[target]] if spec == "03-matmul.py:matmul" else WIDE_ACCESSES
    for pattern in patterns:
        assert re.search(pattern, compiled.stages["ptx"]), f"expected {pattern} in the PTX"


def test_every_stage_is_kept_and_dumped(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_DUMP", str(tmp_path))
    compiled = tutorial_kernel("01-vector-add.py:add").compile(
        signature="*f32:16,*f32:16,*f32:16,i32", target="sm_80", BLOCK=256)
    assert list(compiled.stages) == ["tile_ir", "optimized_tile_ir", "thread_ir", "llvm_ir", "ptx"]
    assert compiled.stages["thread_ir"].count("thread_id") >= 1
    [folder] = tmp_path.iterdir()                       # one folder per specialization
    assert folder.name.startswith("add-sm_80-128t-")   # 4 warps
    assert {p.name for p in folder.iterdir()} >= {"add.tile.ir", "add.opt.tile.ir", "add.thread.ir", "add.ll", "add.ptx"}


def test_each_specialization_and_interpreter_run_dumps_to_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_DUMP", str(tmp_path))
    add = tutorial_kernel("01-vector-add.py:add")
    for block in (256, 512):
        add.compile(signature="*f32:16,*f32:16,*f32:16,i32", target="sm_80", BLOCK=block)
    x = np.ones(100, np.float32)
    for _ in range(2):                                   # a second run of one specialization writes nothing new
        add[(1,)](x, x, np.empty_like(x), 100, BLOCK=128)
    names = sorted(p.name.rsplit("-", 1)[0] for p in tmp_path.iterdir())
    assert names == ["add-interpreter", "add-sm_80-128t", "add-sm_80-128t"]      # BLOCK changes the tile IR
    interpreted = next(p for p in tmp_path.iterdir() if p.name.startswith("add-interpreter"))
    assert [p.name for p in interpreted.iterdir()] == ["add.tile.ir"]
    assert "tile<128xf32>" in (interpreted / "add.tile.ir").read_text()


@pytest.mark.parametrize("num_warps", [1, 4])
def test_lowered_softmax_matches_the_tile_interpreter(num_warps):
    kernel = tutorial_kernel("02-fused-softmax.py:softmax")
    rows, cols = 3, 100
    x = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    module = kernel.specialize(x, np.empty_like(x), rows, cols, BLOCK=128).module
    expected, actual = np.zeros_like(x), np.zeros_like(x)
    run_function(module.functions[0], [x, expected, rows, cols], grid=(rows,))
    run_threads(lower(module, get_target("sm_90a"), num_warps=num_warps).functions[0], [x, actual, rows, cols],
                grid=(rows,))
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-7)


@needs_ptxas
def test_metadata_keeps_the_dynamic_shared_memory_the_launch_needs():
    """ptxas reports only static shared memory; the launch size is the allocator's (regression)."""
    compiled = tutorial_kernel("03-matmul.py:matmul").compile(
        signature=CASES["03-matmul.py:matmul"][0], target="sm_90a", **CASES["03-matmul.py:matmul"][1])
    assert compiled.metadata["shared_bytes"] > 0                      # mma operands go through shared memory
    assert compiled.metadata["static_shared_bytes"] == 0               # all of it is the dynamic buffer
