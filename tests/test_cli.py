"""The `tessera` command line: `tessera ir` prints a kernel's IR; bad arguments exit 2 with one line."""

import subprocess
import sys
from pathlib import Path

import pytest

from tessera.cli import main

TUTORIAL = Path(__file__).resolve().parents[1] / "tutorials" / "01-vector-add.py"


def test_ir_prints_the_tile_ir_for_a_signature(capsys):
    assert main(["ir", f"{TUTORIAL}:add", "--signature", "*f32:16,*f32:16,*f32:16,i32", "--const", "BLOCK=1024"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("func @add(%x_ptr: ptr<f32>, %y_ptr: ptr<f32>, %out_ptr: ptr<f32>, %n: i32)")
    assert "divisible_by_16 = [0, 1, 2]" in out
    assert "tile<1024xf32>" in out


@pytest.mark.parametrize("args, message", [
    (["ir", "nowhere.py:add"], "no such file: nowhere.py"),
    (["ir", f"{TUTORIAL}"], "expected FILE.py:KERNEL"),
    (["ir", f"{TUTORIAL}:main"], "has no @tessera.kernel named 'main'; its kernels are: add"),
    (["ir", f"{TUTORIAL}:ad"], "has no @tessera.kernel named 'ad'; did you mean 'add'?"),
    (["ir", f"{TUTORIAL}:add", "--signature", "*f32,*f32,i32"], "has 4 runtime parameters"),
    (["ir", f"{TUTORIAL}:add", "--signature", "*f32,*f32,*f32,i33", "--const", "BLOCK=64"], "unknown"),
    (["ir", f"{TUTORIAL}:add", "--signature", "*f32,*f32,*f32,i32"], "constexpr 'BLOCK' needs a value"),
    (["ir", f"{TUTORIAL}:add", "--signature", "*f32,*f32,*f32,i32", "--const", "WIDTH=4"], "not constexpr parameters"),
])
def test_bad_arguments_print_one_line_and_exit_2(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.lower() in err.lower()


def test_compile_errors_exit_1_with_the_message(capsys):
    assert main(["ir", f"{TUTORIAL}:add", "--signature", "*f32,*f32,*f32,i32", "--const", "BLOCK=1000"]) == 1
    assert "powers of two" in capsys.readouterr().err


def test_console_script_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "tessera.cli", "doctor"], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("tessera 0.1.0")


def test_doctor_reports_torch_tools_gpus_and_the_cache(tmp_path, monkeypatch, capsys):
    from tessera.runtime import cuda, hip

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cuda, "driver_available", lambda: False)
    monkeypatch.setattr(hip, "driver_available", lambda: False)
    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        lines[0].split(":")[0], "torch", "ptxas", "ld.lld", "NVIDIA GPUs", "AMD GPUs", "backends", "binary cache"]
    assert "NVIDIA GPUs: no driver found" in lines and "AMD GPUs: no driver found" in lines
    assert lines[-1] == f"binary cache: {tmp_path} (0 entries, 0 bytes)"


def test_help_explains_the_signature_syntax(capsys):
    with pytest.raises(SystemExit):
        main(["ir", "--help"])
    out = capsys.readouterr().out
    assert "*DTYPE:16   ... whose address is a multiple of 16 bytes" in out and "INT:1       an integer" in out


@pytest.mark.skipif(__import__("tessera.backends.nvptx", fromlist=["find_ptxas"]).find_ptxas() is None,
                    reason="ptxas not installed")
def test_compile_writes_ptx_cubin_and_manifest(tmp_path, capsys):
    import json

    assert main(["compile", f"{TUTORIAL}:add", "-s", "*f32:16,*f32:16,*f32:16,i32", "-c", "BLOCK=1024",
                 "--target", "sm_90a", "--num-warps", "4", "-o", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["add.c", "add.cubin", "add.h", "add.json", "add.ptx"]
    manifest = json.loads((tmp_path / "add.json").read_text())
    assert manifest["target"] == "sm_90a" and manifest["threads_per_block"] == 128
    assert manifest["constexprs"] == {"BLOCK": 1024} and manifest["spill_bytes"] == 0
    assert capsys.readouterr().out.count("wrote ") == 5


@pytest.mark.parametrize("args, message", [
    (["compile", f"{TUTORIAL}:add", "--target", "sm_99"], "unknown or unsupported target 'sm_99'"),
    (["compile", f"{TUTORIAL}:add", "--num-warps", "3"], "--num-warps must be"),
    (["compile", f"{TUTORIAL}:add", "-s", "*f32"], "has 4 runtime parameters"),
])
def test_compile_rejects_bad_arguments_with_exit_2(args, message, capsys):
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_cache_commands_report_and_clear(tmp_path, monkeypatch, capsys):
    from tessera.runtime.cache import BinaryCache, CacheEntry

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    BinaryCache().put("ab" * 32, CacheEntry("add", "sm_80", {"num_threads": 128}, ptx="// ptx"))
    assert main(["cache", "info"]) == 0
    assert f"directory: {tmp_path}" in capsys.readouterr().out
    assert main(["cache", "list"]) == 0
    assert "add" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert BinaryCache().entries() == []
    assert main(["cache", "list"]) == 0
    assert capsys.readouterr().out == f"the cache at {tmp_path} is empty\n"


PIPELINED_MATMUL = """
import tessera

@tessera.kernel
def pipelined_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_bk, stride_bn, BM: tessera.constexpr,
                     BN: tessera.constexpr, BK: tessera.constexpr, STAGES: tessera.constexpr):
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N), (stride_bk, stride_bn))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))
"""


@pytest.mark.skipif(__import__("tessera.backends.nvptx", fromlist=["find_ptxas"]).find_ptxas() is None,
                    reason="ptxas not installed")
def test_compile_manifest_lists_the_tensor_maps_a_launcher_must_build(tmp_path, capsys):
    """A pipelined matmul for sm_90 reads A and B through TMA: the manifest says how to build each hidden
    by-value map (which pointer, sizes and strides in elements from the arguments, box, swizzle)."""
    import json

    kernels = tmp_path / "matmul.py"
    kernels.write_text(PIPELINED_MATMUL)
    assert main(["compile", f"{kernels}:pipelined_matmul", "-s", "*bf16:16,*bf16:16,*f16:16,i32:16,i32:16,i32:16,"
                 "i32:16,i32:1", "-c", "BM=64", "-c", "BN=64", "-c", "BK=64", "-c", "STAGES=3", "--target", "sm_90",
                 "-o", str(tmp_path)]) == 0
    manifest = json.loads((tmp_path / "pipelined_matmul.json").read_text())
    assert manifest["tensor_maps"] == [
        {"param": 8, "name": "a_ptr_tma0", "pointer": "a_ptr", "dtype": "bf16", "shape": ["M", "K"],
         "strides": ["K", "1"], "box": [64, 64], "swizzle": "128B", "oob_fill": "zero"},
        {"param": 9, "name": "b_ptr_tma1", "pointer": "b_ptr", "dtype": "bf16", "shape": ["K", "N"],
         "strides": ["stride_bk", "1"], "box": [64, 64], "swizzle": "128B", "oob_fill": "zero"},
        # C's, for the epilogue's TMA store (`passes/schedule/tma_store.py`; the fill is unused by a store): a 16-bit
        # accumulator stmatrix wrote into 128B-swizzled column blocks of 64 (`stmatrix_store.py`)
        {"param": 10, "name": "c_ptr_tma2", "pointer": "c_ptr", "dtype": "f16", "shape": ["M", "N"],
         "strides": ["N", "1"], "box": [64, 64], "swizzle": "128B", "oob_fill": "zero"}]
    assert ".param .align 64 .b8 pipelined_matmul_param_8[128]" in (tmp_path / "pipelined_matmul.ptx").read_text()
    capsys.readouterr()
