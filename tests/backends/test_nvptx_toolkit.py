"""Finding ptxas and libdevice, running ptxas, and reading what `ptxas -v` reports."""

import importlib
import stat
import sys

import pytest

from tessera.backends.nvptx import PtxasError, find_ptxas, toolkit
from tessera.backends.nvptx import compile as compile_module
from tessera.backends.nvptx.ptxas import assemble, parse_info

PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'block_sum' for 'sm_90a'
ptxas info    : Function properties for block_sum
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 380 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Function properties for helper
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compile time = 12.5 ms
"""


def test_parse_info_reads_registers_spills_and_shared_memory():
    info = parse_info(PTXAS_LOG)
    assert (info["registers"], info["spill_stores"], info["spill_loads"]) == (40, 4, 12)
    assert (info["stack_frame"], info["static_shared_bytes"], info["barriers"]) == (8, 1024, 1)
    assert info["constant_bytes"] == {0: 380, 2: 8}
    assert set(info["functions"]) == {"block_sum", "helper"} and info["log"] == PTXAS_LOG
    assert parse_info("")["registers"] == 0


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not found")
def test_ptxas_failures_carry_its_stderr():
    bad = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k() {\n  bogus.instruction;\n  ret;\n}\n"
    with pytest.raises(PtxasError, match="rejected the PTX for sm_80") as info:
        assemble(bad, "sm_80", find_ptxas())
    assert "bogus" in str(info.value) and "bogus" in info.value.stderr


def _fake_ptxas(path, release="13.0"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_overrides_name_ptxas_and_libdevice(tmp_path, monkeypatch):
    fake = _fake_ptxas(tmp_path / "bin" / "ptxas", "12.8")
    monkeypatch.setenv("TESSERA_PTXAS", str(fake))
    found = find_ptxas()
    assert found.path == fake and found.version == (12, 8)
    monkeypatch.setenv("TESSERA_PTXAS", str(tmp_path / "missing"))
    assert find_ptxas() is None
    (tmp_path / "libdevice.10.bc").write_bytes(b"BC")
    monkeypatch.setenv("TESSERA_LIBDEVICE", str(tmp_path / "libdevice.10.bc"))
    assert toolkit.find_libdevice() == tmp_path / "libdevice.10.bc"


def test_nvidia_wheels_are_searched(tmp_path, monkeypatch):
    """CUDA 13 wheels (nvidia-cuda-nvcc + nvidia-nvvm) install under site-packages/nvidia/cu13/."""
    root = tmp_path / "site" / "nvidia" / "cu13"
    fake = _fake_ptxas(root / "bin" / "ptxas")
    (root / "nvvm" / "libdevice").mkdir(parents=True)
    (root / "nvvm" / "libdevice" / "libdevice.10.bc").write_bytes(b"BC")
    for var in ("TESSERA_PTXAS", "TESSERA_LIBDEVICE", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(toolkit.shutil, "which", lambda name: None)
    monkeypatch.setattr(toolkit, "SYSTEM_ROOTS", (tmp_path / "no-cuda",))
    monkeypatch.setattr(toolkit, "VERSIONED_ROOTS", (tmp_path, "no-cuda-*"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)
    importlib.invalidate_caches()
    assert root in toolkit.wheel_roots()
    assert toolkit.find_ptxas_path() == fake
    assert toolkit.find_libdevice() == root / "nvvm" / "libdevice" / "libdevice.10.bc"


def test_assemble_true_without_ptxas_is_a_clean_error(monkeypatch):
    from test_nvptx import compile_ir, vector_add

    monkeypatch.setattr(compile_module, "find_ptxas", lambda: None)
    with pytest.raises(PtxasError, match="assemble=True but no ptxas was found"):
        compile_ir(vector_add("f32", 4), "sm_80", assemble=True)
    assert compile_ir(vector_add("f32", 4), "sm_80").cubin is None
