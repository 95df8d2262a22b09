"""`tessera compile --target gfx942` writes the code object, its AMDGCN assembly and a manifest."""

import json
from pathlib import Path

import pytest

from tessera.backends.amdgpu import CodeObject, find_linker
from tessera.cli import main

TUTORIAL = Path(__file__).resolve().parents[2] / "tutorials" / "01-vector-add.py"


@pytest.mark.skipif(find_linker() is None, reason="no ld.lld found (pip install ziglang)")
def test_compile_for_gfx942_writes_hsaco_assembly_and_manifest(tmp_path, capsys):
    assert main(["compile", f"{TUTORIAL}:add", "-s", "*f32:16,*f32:16,*f32:16,i32", "-c", "BLOCK=1024",
                 "--target", "gfx942", "--num-warps", "4", "-o", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["add.c", "add.h", "add.hsaco", "add.json", "add.s"]
    manifest = json.loads((tmp_path / "add.json").read_text())
    assert manifest["target"] == "gfx942" and manifest["threads_per_block"] == 256   # 4 wave64 waves
    assert manifest["hsaco"] == "add.hsaco" and manifest["assembly"] == "add.s"
    assert manifest["wavefront_size"] == 64 and manifest["dynamic_shared_memory_bytes"] == 0
    assert manifest["kernarg_segment_size"] == 28           # three pointers and an i32
    image = CodeObject((tmp_path / "add.hsaco").read_bytes())
    assert image.elf_type == "ET_DYN" and "add.kd" in image.symbols
    assert ".amdhsa_kernel add" in (tmp_path / "add.s").read_text()
    assert capsys.readouterr().out.count("wrote ") == 5
