"""AMDGCN assembly -> object, for kernels with inline assembly.

llvmlite's LLVM has no AMDGPU assembly parser, so it cannot put inline asm
into an object itself (it aborts). A kernel with inline assembly is
therefore emitted as AMDGCN assembly text and assembled by clang's
integrated assembler (`clang -cc1as`): ROCm's clang, a clang on PATH, or
the one the `ziglang` wheel bundles (part of the test extra). A rejected
instruction is an `AssemblerError` with clang's message, which the compile
driver reports at the inline asm's source line.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..llvm.errors import BackendError

ASSEMBLE_TIMEOUT_S = 120
NO_ASSEMBLER_MESSAGE = ("inline assembly on AMD GPUs needs an AMDGCN assembler (llvmlite's LLVM has none): "
                        "`pip install ziglang` (its bundled clang), or ROCm's clang ($ROCM_PATH/llvm/bin/clang)")


class AssemblerError(BackendError):
    """clang could not assemble the AMDGCN text (or none was found)."""


@functools.cache
def find_assembler() -> tuple[str, ...] | None:
    """The command that runs a clang able to assemble AMDGCN, or None."""
    rocm = [Path(os.environ["ROCM_PATH"]) / "llvm/bin/clang"] if os.environ.get("ROCM_PATH") else []
    for candidate in [*rocm, Path("/opt/rocm/llvm/bin/clang")]:
        if candidate.is_file():
            return (str(candidate),)
    found = shutil.which("clang")
    if found:
        return (found,)
    if importlib.util.find_spec("ziglang") is not None:
        return (sys.executable, "-m", "ziglang", "clang")
    return None


def assemble(assembly: str, cpu: str) -> bytes:
    """The relocatable object of AMDGCN `assembly` for `cpu` (gfx942, ...)."""
    clang = find_assembler()
    if clang is None:
        raise AssemblerError(NO_ASSEMBLER_MESSAGE)
    with tempfile.TemporaryDirectory(prefix="tessera-as-") as tmp:
        source, output = Path(tmp) / "kernel.s", Path(tmp) / "kernel.o"
        source.write_text(assembly)
        command = [*clang, "-cc1as", "-triple", "amdgcn-amd-amdhsa", "-target-cpu", cpu, "-filetype", "obj",
                   str(source), "-o", str(output)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=ASSEMBLE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise AssemblerError(f"running {' '.join(clang)} failed: {e}") from None
        if done.returncode != 0 or not output.is_file():
            said = (done.stderr or done.stdout).replace(str(source), "kernel.s").strip()
            raise AssemblerError(f"the AMDGCN assembler rejected the kernel's assembly:\n{said[-3000:]}")
        return output.read_bytes()
