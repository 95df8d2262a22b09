"""AOT C launchers (`tessera compile` writes KERNEL.h / KERNEL.c, `tessera link` a dispatcher): the generated C
compiles with `cc -Wall -Wextra -Werror` against the CUDA driver header, and, linked with a stub driver that
prints every call (stub_cuda.c), passes each parameter with the bytes the Python launcher packs, encodes each
tensor map as the Python launcher describes it, and dispatches to the most specialized variant that fits."""

import ctypes
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.aot import AotError, Specialization, c_dispatcher
from tessera.cli import main
from tessera.ir import dtypes as dt
from tessera.ir.types import PointerType, ScalarType
from tessera.runtime.packing import ArgumentPacker

sys.path.insert(0, str(Path(__file__).parents[1] / "kernels_lib"))
from tma_maps import maps_by_use  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ADD = f"{ROOT / 'tutorials' / '01-vector-add.py'}:add"
GEMM = f"{ROOT / 'tessera' / 'kernels_lib' / 'gemm.py'}:gemm_kernel"
GEMM_SIGNATURE = "*bf16:16,*bf16:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,i32:16,i32:1"
GEMM_CONSTS = ["HAS_BIAS=False", "SCALE_A='none'", "SCALE_B='none'", "ACTIVATION='none'", "BM=128", "BN=128",
               "BK=64", "GROUP_M=8", "PERSISTENT=False", "STAGES=3"]


def cuda_include() -> Path | None:
    """A folder holding cuda.h: $CUDA_HOME, the nvidia-cuda-runtime wheel (the test extra), /usr/local/cuda."""
    candidates = [Path(os.environ["CUDA_HOME"]) / "include"] if os.environ.get("CUDA_HOME") else []
    spec = importlib.util.find_spec("nvidia")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidates.append(Path(folder) / "cuda_runtime" / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    return next((c for c in candidates if (c / "cuda.h").is_file()), None)


CC = shutil.which("cc") or shutil.which("gcc")
INCLUDE = cuda_include()
pytestmark = pytest.mark.skipif(CC is None or INCLUDE is None, reason="needs a C compiler and cuda.h")


def compile_kernel(out: Path, kernel: str, signature: str, consts: list[str], target="sm_80", warps=4) -> Path:
    args = ["compile", kernel, "-s", signature, "--target", target, "-w", str(warps), "-o", str(out)]
    for c in consts:
        args += ["-c", c]
    assert main(args) == 0
    return out / f"{kernel.rpartition(':')[2]}.json"


def cc(*args: str, cwd: Path) -> None:
    done = subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}", *args],
                          cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def run_launch(folder: Path, sources: list[Path], call: str, sizes: list[int]) -> list[str]:
    """Build `sources` with a main that calls `call` (a launch returning CUresult) on the stub driver;
    the printed calls, one per line, and the returned status last."""
    main_c = folder / "main.c"
    headers = "".join(f'#include "{s.with_suffix(".h").name}"\n' for s in sources)
    main_c.write_text(f"""#include <stdio.h>
{headers}extern size_t stub_param_sizes[64];
extern int stub_param_count;
int main(void)
{{
    const size_t sizes[] = {{{', '.join(map(str, sizes)) or '0'}}};
    for (int i = 0; i < {len(sizes)}; ++i) stub_param_sizes[i] = sizes[i];
    stub_param_count = {len(sizes)};
    printf("status %d\\n", (int)({call}));
    return 0;
}}
""")
    cc("-o", "launch", "main.c", str(HERE / "stub_cuda.c"), *map(str, sources), cwd=folder)
    return subprocess.run([str(folder / "launch")], capture_output=True, text=True, check=True).stdout.splitlines()


def loaded(spec: Specialization) -> str:
    """What the stub prints when it loads `spec`'s image: FNV-1a 64 of its bytes."""
    data = spec.binary[:-1] if spec.binary_kind == "ptx" else spec.binary
    digest = 1469598103934665603
    for byte in data:
        digest = ((digest ^ byte) * 1099511628211) % 2**64
    return f"load {digest:016x}"


def packed(spec: Specialization, values: list) -> list[str]:
    """The Python launcher's bytes of each parameter, as hex."""
    types = [PointerType(dt.dtype_from_name(p.type[1:])) if p.is_pointer else ScalarType(p.dtype)
             for p in spec.parameters]
    packer = ArgumentPacker(types)
    packer.pack(values)
    return [ctypes.string_at(packer.address + s.offset, s.size).hex() for s in packer.slots]


def assert_maps_described_alike(lines: list[str], spec: Specialization, metadata: dict, values: list) -> None:
    """Each tensor map the C launcher encoded (its `map ...` lines, inner dim first) is the one the Python
    launcher's recipe describes for the same argument values."""
    from tessera.dsl.gpu_launch import launch_parameters

    maps = [line for line in lines if line.startswith("map ")]
    names = [p.name for p in spec.parameters]
    _, _, recipes = launch_parameters([None] * len(names), names, {"tensor_maps": metadata["tensor_maps"]})
    for line, recipe in zip(maps, recipes, strict=True):
        d = recipe.describe(values, values[recipe.pointer])
        inner_first = lambda xs: " ".join(str(x) for x in reversed(xs))   # noqa: E731
        element_strides = " ".join("1" for _ in d.shape)
        assert f"address {d.global_address} dims {inner_first(d.shape)} strides {inner_first(d.strides[:-1])} " \
               f"box {inner_first(d.box_shape)} element_strides {element_strides}" in line


def test_a_vector_add_launcher_compiles_and_passes_what_the_python_launcher_packs(tmp_path):
    manifest = compile_kernel(tmp_path, ADD, "*f32:16,*f32:16,*f32:16,i32", ["BLOCK=1024"])
    spec = Specialization.load(manifest)
    assert {p.name: (p.type, p.hint) for p in spec.parameters} == {
        "x_ptr": ("*f32", "16"), "y_ptr": ("*f32", "16"), "out_ptr": ("*f32", "16"), "n": ("i32", "")}
    values = [0x7F0000001000, 0x7F0000002000, 0x7F0000003000, -5000]
    lines = run_launch(tmp_path, [tmp_path / "add.c"], "add_launch((CUstream)77, 5, 1, 1, 0x7F0000001000ull, "
                       "0x7F0000002000ull, 0x7F0000003000ull, -5000)", [8, 8, 8, 4])
    assert lines[:3] == [loaded(spec), "function add", "launch grid 5 1 1 block 128 1 1 shared 0 stream 77 extra 0"]
    assert [line.split()[-1] for line in lines[3:7]] == packed(spec, values)
    assert lines[-1] == "status 0"


def test_an_empty_grid_launches_nothing(tmp_path):
    spec = Specialization.load(compile_kernel(tmp_path, ADD, "*f32,*f32,*f32,i32", ["BLOCK=256"]))
    lines = run_launch(tmp_path, [tmp_path / "add.c"], "add_launch(NULL, 0, 1, 1, 0, 0, 0, 0)", [])
    assert lines == [loaded(spec), "function add", "status 0"]


def test_a_tma_gemm_launcher_encodes_its_tensor_maps_as_the_python_launcher_describes_them(tmp_path):
    manifest = compile_kernel(tmp_path, GEMM, GEMM_SIGNATURE, GEMM_CONSTS, target="sm_90a", warps=8)
    spec = Specialization.load(manifest)
    metadata = json.loads(manifest.read_text())
    assert spec.shared_bytes > 48 * 1024
    # A's and B's maps for the K loop's TMA loads, C's for the epilogue's TMA store (`schedule/tma_store.py`)
    assert maps_by_use((tmp_path / "gemm_kernel.ptx").read_text(), list(spec.tensor_maps)) == \
        {"load": ["a_ptr", "b_ptr"], "store": ["c_ptr"]}
    M, N, K = 1000, 1008, 2000
    values = [0x10000, 0x20000, 0x30000, 0x40000, 0x50000, 0x60000, M, N, K, 1.5, K, 1, N, 1]
    call = ("gemm_kernel_launch(NULL, 64, 1, 1, 0x10000, 0x20000, 0x30000, 0x40000, 0x50000, 0x60000, "
            f"{M}, {N}, {K}, 1.5f, {K}, 1, {N}, 1)")
    lines = run_launch(tmp_path, [tmp_path / "gemm_kernel.c"], call, [8] * 6 + [4] * 8 + [128, 128, 128])
    assert lines[2] == f"attribute 8 {spec.shared_bytes}"     # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    assert_maps_described_alike(lines, spec, metadata, values)
    params = [line.split()[-1] for line in lines if line.startswith("param ")]
    assert params[:14] == packed(spec, values)
    assert params[14:] == ["a0" * 128, "a1" * 128, "a2" * 128]   # the maps go by value, after the kernel's own


def test_a_cluster_gemm_launcher_launches_in_clusters_and_refuses_partial_ones(tmp_path):
    consts = [c for c in GEMM_CONSTS if not c.startswith("BN=")] + ["BN=256", "CLUSTER_M=2"]
    manifest = compile_kernel(tmp_path, GEMM, GEMM_SIGNATURE, consts, target="sm_90a", warps=8)
    spec = Specialization.load(manifest)
    assert spec.cluster_dims == (2, 1, 1) and json.loads(manifest.read_text())["cluster_dims"] == [2, 1, 1]
    M, N, K = 1000, 1008, 2000
    args = (f"0x10000, 0x20000, 0x30000, 0x40000, 0x50000, 0x60000, {M}, {N}, {K}, 1.5f, {K}, 1, {N}, 1")
    sizes = [8] * 6 + [4] * 8 + [128, 128, 128]
    lines = run_launch(tmp_path, [tmp_path / "gemm_kernel.c"], f"gemm_kernel_launch((CUstream)9, 64, 1, 1, {args})",
                       sizes)
    launch = next(line for line in lines if line.startswith("launch"))
    assert launch == f"launch_ex grid 64 1 1 block 256 1 1 shared {spec.shared_bytes} stream 9 extra 0 cluster 2 1 1"
    assert lines[-1] == "status 0"
    odd = run_launch(tmp_path, [tmp_path / "gemm_kernel.c"], f"gemm_kernel_launch(NULL, 63, 1, 1, {args})", sizes)
    assert not any(line.startswith("launch") for line in odd) and odd[-1] == "status 1"   # CUDA_ERROR_INVALID_VALUE


def test_link_dispatches_to_the_most_specialized_variant_that_fits(tmp_path):
    general = compile_kernel(tmp_path / "general", ADD, "*f32,*f32,*f32,i32", ["BLOCK=1024"])
    aligned = compile_kernel(tmp_path / "aligned", ADD, "*f32:16,*f32:16,*f32:16,i32:16", ["BLOCK=1024"])
    out = tmp_path / "linked"
    assert main(["link", str(general), str(aligned), "-o", str(out)]) == 0
    for x, n, chosen in [("0x1000", 4096, aligned), ("0x1004", 4096, general), ("0x1000", 4097, general)]:
        lines = run_launch(out, [out / "add.c"], f"add_launch(NULL, 1, 1, 1, {x}, 0x2000, 0x3000, {n})", [8, 8, 8, 4])
        assert lines[:2] == [loaded(Specialization.load(chosen)), "function add"], (x, n)
        assert lines[-1] == "status 0"


def test_without_a_general_variant_arguments_that_fit_none_are_refused(tmp_path):
    aligned = compile_kernel(tmp_path / "aligned", ADD, "*f32:16,*f32:16,*f32:16,i32:16", ["BLOCK=1024"])
    assert main(["link", str(aligned), "-o", str(tmp_path)]) == 0
    lines = run_launch(tmp_path, [tmp_path / "add.c"], "add_launch(NULL, 1, 1, 1, 0x1004, 0x2000, 0x3000, 16)",
                       [8, 8, 8, 4])
    assert lines == ["status 1"]                                     # CUDA_ERROR_INVALID_VALUE, nothing launched


def test_link_refuses_specializations_of_different_kernels_or_the_same_facts_twice(tmp_path, capsys):
    add = compile_kernel(tmp_path / "a", ADD, "*f32,*f32,*f32,i32", ["BLOCK=1024"])
    again = compile_kernel(tmp_path / "b", ADD, "*f32,*f32,*f32,i32", ["BLOCK=512"])
    with pytest.raises(AotError, match="assume the same facts"):
        c_dispatcher([Specialization.load(add), Specialization.load(again)])
    assert main(["link", str(add), str(tmp_path / "missing.json"), "-o", str(tmp_path)]) == 2
    assert "cannot read the manifest" in capsys.readouterr().err


def hip_include() -> Path | None:
    """A folder with hip/hip_runtime.h: $ROCM_PATH/include or /opt/rocm/include."""
    for root in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if root and (Path(root) / "include" / "hip" / "hip_runtime.h").is_file():
            return Path(root) / "include"
    return None


@pytest.mark.skipif(hip_include() is None, reason="needs HIP's headers (ROCm)")
def test_an_amd_launcher_compiles_against_hip(tmp_path):
    pytest.importorskip("ziglang")
    compile_kernel(tmp_path, ADD, "*f32:16,*f32:16,*f32:16,i32", ["BLOCK=1024"], target="gfx942")
    done = subprocess.run([CC, "-std=c11", "-c", "-Wall", "-Werror", "-D__HIP_PLATFORM_AMD__", f"-I{hip_include()}",
                           "add.c"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_attention_launcher_encodes_its_4d_maps_as_the_python_launcher_describes_them(tmp_path):
    """Q, K, V (TMA loads) and O (TMA store) at per-(batch, head) offsets: 4-D maps whose leading (batch, head)
    dims are unbounded, cut to the address space alike in C and in Python."""
    import sys
    sys.path.insert(0, str(ROOT / "tests" / "kernels_lib"))
    from test_attention_compile import FORWARD_SIGNATURE

    kernel = f"{ROOT / 'tessera' / 'kernels_lib' / 'attention_fwd.py'}:attention_fwd_kernel"
    consts = ["D=64", "BM=128", "BN=64", "STAGES=2", "HAS_LEFT=False", "HAS_RIGHT=False", "SOFTCAP=False",
              "VARLEN=False"]
    manifest = compile_kernel(tmp_path, kernel, FORWARD_SIGNATURE.format(t="bf16"), consts, target="sm_90a", warps=8)
    spec = Specialization.load(manifest)
    metadata = json.loads(manifest.read_text())
    assert [len(m["shape"]) for m in metadata["tensor_maps"]] == [4, 4, 4, 4]
    S, H, D = 1000, 8, 64
    strides = [S * H * D, H * D, D, 1]
    values = [0x10000 * (i + 1) for i in range(7)] + [S, S, H, H, 0.125, 0.0, 0, 0] + strides * 4 + [H * S, S] \
        + [0x80000, 0x90000, 0.0, 0.0, 0xA0000, 0, 0, 0, 0, 0.0, 0xB0000, S]
    literal = lambda v: f"{v}f" if isinstance(v, float) else str(v)   # noqa: E731
    call = f"attention_fwd_kernel_launch(NULL, 8, 16, 1, {', '.join(map(literal, values))})"
    sizes = [8 if p.is_pointer else 4 for p in spec.parameters] + [128] * len(metadata["tensor_maps"])
    lines = run_launch(tmp_path, [tmp_path / "attention_fwd_kernel.c"], call, sizes)
    assert_maps_described_alike(lines, spec, metadata, values)
    assert lines[-1] == "status 0"


def test_an_amd_pingpong_launcher_launches_two_programs_a_block(tmp_path):
    """The attention forward with AMD's wave-group ping-pong (PINGPONG on gfx942): the manifest says a block runs
    two programs, and the C launcher turns grid_x programs into (grid_x + 1) / 2 blocks of 512 threads."""
    import sys
    sys.path.insert(0, str(ROOT / "tests" / "kernels_lib"))
    from test_attention_compile import FORWARD_SIGNATURE

    kernel = f"{ROOT / 'tessera' / 'kernels_lib' / 'attention_fwd.py'}:attention_fwd_kernel"
    consts = ["D=64", "BM=128", "BN=16", "STAGES=1", "HAS_LEFT=False", "HAS_RIGHT=False", "SOFTCAP=False",
              "VARLEN=False", "PINGPONG=True"]
    manifest = compile_kernel(tmp_path, kernel, FORWARD_SIGNATURE.format(t="bf16"), consts, target="gfx942", warps=8)
    metadata = json.loads(manifest.read_text())
    assert metadata["programs_per_block"] == 2 and metadata["threads_per_block"] == 512
    source = (tmp_path / "attention_fwd_kernel.c").read_text()
    assert "hipModuleLaunchKernel(attention_fwd_kernel_function, (grid_x + 1u) / 2u, grid_y, grid_z, 512," in source
