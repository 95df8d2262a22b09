"""The AMDGPU backend: thread IR -> AMDGCN -> a linked code object (hsaco) for gfx90a, gfx942 and gfx950.

Specifications: every tutorial kernel and every pass-test kernel compiles
for each AMD target; the code object is a loadable ET_DYN holding the
kernel and its descriptor `<kernel>.kd`, is wave64, and reads its arguments
exactly where `ArgumentPacker` writes them; NVIDIA-only ops and f64
transcendental math are rejected before LLVM with a message saying why;
without a linker the error names every way to get one.
"""

import sys
from pathlib import Path

import re

import pytest

from tessera.backends.amdgpu import CodeObject, LinkerError, CodegenError, compile_thread_ir, find_linker
from tessera.backends.amdgpu import linker as amdgpu_linker
from tessera.backends.amdgpu.msgpack import decode
from tessera.ir.parser import parse_module
from tessera.ir.target import get_target
from tessera.passes.manager import PassManager
from tessera.passes.tile_passes import default_tile_passes
from tessera.passes.thread_passes import lower
from tessera.runtime.packing import ArgumentPacker, check_kernarg_layout

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "passes"))
sys.path.insert(0, str(ROOT))
from pass_kernels import CASES as PASS_CASES, traced  # noqa: E402
from tests.test_tutorials_gpu_code import CASES as TUTORIALS, tutorial_kernel  # noqa: E402

AMD_TARGETS = ("gfx90a", "gfx942", "gfx950")
needs_linker = pytest.mark.skipif(find_linker() is None, reason="no ld.lld found (pip install ziglang)")


def thread_function(tile_module, target: str, num_warps: int = 4):
    optimized = PassManager(default_tile_passes()).run(tile_module)
    return lower(optimized, get_target(target), num_warps=num_warps).functions[0]


def tutorial_thread_function(spec: str, target: str):
    signature, constexprs = TUTORIALS[spec]
    kernel = tutorial_kernel(spec)
    from tessera.dsl.tracer import build_kernel_ir
    from tessera.dsl.signature import parse_signature

    return thread_function(build_kernel_ir(kernel.source, parse_signature(kernel.source, signature, constexprs)),
                           target)


def assert_loadable_code_object(artifacts, fn):
    image = CodeObject(artifacts.hsaco)
    assert image.elf_type == "ET_DYN"
    assert artifacts.kernel in image.symbols and f"{artifacts.kernel}.kd" in image.symbols
    meta = image.kernel_metadata(artifacts.kernel)
    assert meta[".wavefront_size"] == 64
    assert meta[".group_segment_fixed_size"] == artifacts.shared_bytes == fn.attrs.get("shared_bytes", 0)
    packer = ArgumentPacker([a.type for a in fn.args])
    check_kernarg_layout(packer, artifacts.metadata["args"])          # explicit args: same offsets and sizes
    assert meta[".kernarg_segment_size"] >= packer.size
    assert meta[".kernarg_segment_align"] >= max([s.size for s in packer.slots] or [1])
    return meta


@needs_linker
@pytest.mark.parametrize("target", AMD_TARGETS)
@pytest.mark.parametrize("spec", TUTORIALS)
def test_tutorials_link_into_wave64_code_objects_whose_kernargs_match_the_packer(spec, target):
    fn = tutorial_thread_function(spec, target)
    artifacts = compile_thread_ir(fn, target)
    meta = assert_loadable_code_object(artifacts, fn)
    assert meta[".kernarg_segment_size"] == ArgumentPacker([a.type for a in fn.args]).size  # no hidden args used
    assert artifacts.metadata["vgpr_spill_count"] == 0 and artifacts.metadata["sgpr_spill_count"] == 0
    assert f".amdhsa_kernel {artifacts.kernel}" in artifacts.assembly
    assert artifacts.metadata["max_flat_workgroup_size"] == artifacts.num_threads == 256


@needs_linker
@pytest.mark.parametrize("target", AMD_TARGETS)
def test_pass_test_kernels_compile_and_link(target):
    for name, case in PASS_CASES.items():
        fn = thread_function(traced(case), target)
        assert_loadable_code_object(compile_thread_ir(fn, target), fn)


def test_the_softmax_uses_lds_bpermute_shuffles_and_fenced_barriers():
    artifacts = compile_thread_ir(tutorial_thread_function("02-fused-softmax.py:softmax", "gfx942"), "gfx942",
                                  link=False)
    assert artifacts.hsaco is None and artifacts.metadata["wavefront_size"] == 64  # metadata without a linker
    assert "ds_bpermute_b32" in artifacts.assembly and "s_barrier" in artifacts.assembly
    assert artifacts.metadata["group_segment_fixed_size"] == artifacts.shared_bytes > 0
    assert artifacts.dynamic_shared_bytes == 0     # the LDS is static: launches pass no dynamic bytes
    assert 'fence syncscope("workgroup") release' in artifacts.llvm_ir
    assert "amdhsa_code_object_version" in artifacts.llvm_ir


@pytest.mark.parametrize("target", AMD_TARGETS)
def test_the_tutorial_matmul_runs_on_the_matrix_cores(target):
    artifacts = compile_thread_ir(tutorial_thread_function("03-matmul.py:matmul", target), target, link=False)
    assert "llvm.amdgcn.mfma.f32." in artifacts.llvm_ir
    shapes = "32x32x16|16x16x32" if target == "gfx950" else "32x32x8|16x16x16"     # gfx950: the double-K forms
    assert re.search(rf"\bv_mfma_f32_({shapes})_?f16", artifacts.assembly)
    assert artifacts.metadata["vgpr_spill_count"] == 0


KERNEL_WITH = """\
func @k(%x: ptr<f16>, %out: ptr<f32>) attributes {{num_threads = 64, shared_bytes = 1024, warp_size = 64}} {{
  %tid = thread_id : i32
  %smem = shared_alloc {{bytes = 1024, offset = 0}} : ptr<f16, shared>
{body}
  return
}}
"""

NVIDIA_ONLY = {
    "ldmatrix": "  %r = ldmatrix %smem {num = 4, trans = false} : regs<8xf16>",
}


@pytest.mark.parametrize("op", NVIDIA_ONLY)
def test_nvidia_only_ops_are_rejected_before_llvm_with_the_reason(op):
    fn = parse_module(KERNEL_WITH.format(body=NVIDIA_ONLY[op])).functions[0]
    with pytest.raises(CodegenError, match=f"{op}.*NVIDIA instruction that AMD GPUs lack.*gfx942"):
        compile_thread_ir(fn, "gfx942")


def test_f64_transcendental_math_is_rejected_and_nvidia_targets_are_refused():
    text = """\
func @k(%p: ptr<f64>) attributes {num_threads = 64, shared_bytes = 0, warp_size = 64} {
  %x = load %p : f64
  %y = exp %x : f64
  store %p, %y
  return
}
"""
    with pytest.raises(CodegenError, match="`exp` on f64 needs a device math library"):
        compile_thread_ir(parse_module(text).functions[0], "gfx942")
    with pytest.raises(CodegenError, match="sm_90a is an NVIDIA GPU; the AMDGPU backend compiles for AMD targets"):
        compile_thread_ir(parse_module(text).functions[0], "sm_90a")


def test_without_a_linker_there_is_no_hsaco_and_link_true_names_every_option(monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_LLD", str(tmp_path / "no-such-ld.lld"))
    amdgpu_linker.find_linker.cache_clear()
    try:
        fn = tutorial_thread_function("01-vector-add.py:add", "gfx942")
        assert compile_thread_ir(fn, "gfx942").hsaco is None
        with pytest.raises(LinkerError) as info:
            compile_thread_ir(fn, "gfx942", link=True)
        for option in ("pip install ziglang", "ROCM_PATH", "/opt/rocm/llvm/bin/ld.lld", "lld-19", "TESSERA_LLD"):
            assert option in str(info.value)
    finally:
        amdgpu_linker.find_linker.cache_clear()


def test_the_linker_search_prefers_tessera_lld_then_rocm_then_path_then_ziglang(monkeypatch, tmp_path):
    fake = tmp_path / "ld.lld"
    fake.write_text("")
    monkeypatch.setenv("TESSERA_LLD", str(fake))
    amdgpu_linker.find_linker.cache_clear()
    try:
        assert find_linker().command == (str(fake),) and find_linker().origin == "TESSERA_LLD"
        monkeypatch.delenv("TESSERA_LLD")
        (tmp_path / "llvm" / "bin").mkdir(parents=True)
        (tmp_path / "llvm" / "bin" / "ld.lld").write_text("")
        monkeypatch.setenv("ROCM_PATH", str(tmp_path))
        amdgpu_linker.find_linker.cache_clear()
        assert find_linker().origin == "ROCm"
    finally:
        amdgpu_linker.find_linker.cache_clear()


def test_msgpack_decodes_every_type_the_metadata_uses():
    # {"a": 5, "b": [256, -2], "c": True, "d": 1.5}: fixmap, fixstr, fixint, fixarray, uint16, int8, true, float64
    data = bytes([0x84, 0xA1, 0x61, 0x05, 0xA1, 0x62, 0x92, 0xCD, 0x01, 0x00, 0xD0, 0xFE,
                  0xA1, 0x63, 0xC3, 0xA1, 0x64, 0xCB]) + bytes.fromhex("3FF8000000000000")
    assert decode(data) == {"a": 5, "b": [256, -2], "c": True, "d": 1.5}
    with pytest.raises(ValueError, match="truncated"):
        decode(data[:-3])
