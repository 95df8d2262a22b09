"""Tutorial 06: a kernel launched from C, compiled ahead of time.

A service written in C or C++ cannot import Python to launch a kernel. `tessera compile`
therefore also writes a C header and source with the binary embedded and one launch
function, and `tessera link` joins several specializations of a kernel into one launch
function that picks, at run time, the most specialized one the arguments allow:

    tessera compile tutorials/01-vector-add.py:add -s '*f32:16,*f32:16,*f32:16,i32:16' -c BLOCK=1024 -o aligned/
    tessera compile tutorials/01-vector-add.py:add -s '*f32,*f32,*f32,i32' -c BLOCK=1024 -o general/
    tessera link aligned/add.json general/add.json -o linked/
    cc -c linked/add.c -I$CUDA_HOME/include            # then link your program with -lcuda

    CUresult add_launch(CUstream stream, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                        CUdeviceptr x_ptr, CUdeviceptr y_ptr, CUdeviceptr out_ptr, int32_t n);

This script does those steps in a temporary folder, compiles the C with the system's C
compiler when it and cuda.h are found, and, on a machine with an NVIDIA GPU and torch,
builds it into a shared library and launches it on torch tensors. Everywhere it checks the
kernel the C code embeds against numpy on the CPU interpreter.

    python tutorials/06-aot.py
"""

import ctypes
import ctypes.util
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
KERNEL = f"{HERE / '01-vector-add.py'}:add"
N, BLOCK = 10_000, 1024


def tessera(*args: str) -> None:
    """Run the `tessera` command line (as `python -m tessera.cli`, which needs no installed script)."""
    subprocess.run([sys.executable, "-m", "tessera.cli", *args], check=True, stdout=subprocess.DEVNULL)


def cuda_include() -> Path | None:
    """A folder with cuda.h: $CUDA_HOME/include, the nvidia-cuda-runtime wheel, or /usr/local/cuda/include."""
    folders = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"]
    try:
        import nvidia.cuda_runtime
        folders += [Path(p) / "include" for p in nvidia.cuda_runtime.__path__]
    except ImportError:
        pass
    return next((f for f in folders if (f / "cuda.h").is_file()), None)


def build_and_launch_on_the_gpu(linked: Path, include: Path) -> bool:
    """Build linked/add.c into a shared library against the driver and launch it on torch tensors."""
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    subprocess.run(["cc", "-shared", "-fPIC", f"-I{include}", "add.c", "-o", "libadd.so"], cwd=linked, check=True)
    # the driver's cu* symbols resolve when the library loads (a C program would link with -lcuda instead)
    ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(linked / "libadd.so"))
    lib.add_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 3 + [ctypes.c_uint64] * 3 + [ctypes.c_int32]
    x, y = np.random.default_rng(0).standard_normal((2, N)).astype(np.float32)
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    out = torch.empty_like(tx)
    torch.cuda.synchronize()
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    status = lib.add_launch(stream, -(-N // BLOCK), 1, 1, tx.data_ptr(), ty.data_ptr(), out.data_ptr(), N)
    assert status == 0, f"add_launch returned CUresult {status}"
    torch.cuda.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), x + y)
    print(f"launched from C on {torch.cuda.get_device_name()}: matches numpy")
    return True


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="tessera-aot-"))
    tessera("compile", KERNEL, "-s", "*f32:16,*f32:16,*f32:16,i32:16", "-c", f"BLOCK={BLOCK}", "-o", str(folder / "aligned"))
    tessera("compile", KERNEL, "-s", "*f32,*f32,*f32,i32", "-c", f"BLOCK={BLOCK}", "-o", str(folder / "general"))
    tessera("link", str(folder / "aligned" / "add.json"), str(folder / "general" / "add.json"),
            "-o", str(folder / "linked"))
    header = (folder / "linked" / "add.h").read_text()
    print(next(line for line in header.splitlines() if line.startswith("CUresult add_launch")))

    include = cuda_include()
    if shutil.which("cc") and include:
        subprocess.run(["cc", "-std=c11", "-c", "-Wall", "-Werror", f"-I{include}", "add.c"], cwd=folder / "linked",
                       check=True)
        print(f"linked/add.c compiles against {include / 'cuda.h'}")
        launched = build_and_launch_on_the_gpu(folder / "linked", include)
    else:
        print("no C compiler or no cuda.h here: the C sources were written, not compiled")
        launched = False
    if not launched:   # the kernel the C code embeds, on the CPU interpreter
        add = runpy.run_path(str(HERE / "01-vector-add.py"))["add"]
        x, y = np.random.default_rng(0).standard_normal((2, N)).astype(np.float32)
        out = np.empty_like(x)
        add[(-(-N // BLOCK),)](x, y, out, N, BLOCK=BLOCK)
        np.testing.assert_array_equal(out, x + y)
        print("no GPU here: the embedded kernel, run on the CPU interpreter, matches numpy")
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
