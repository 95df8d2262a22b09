"""ld.lld: the relocatable AMDGPU object (ET_REL) -> a loadable code object (hsaco, ET_DYN).

    linker = find_linker()              # None when there is none
    hsaco = link(object_bytes, linker)  # ld.lld -shared --no-undefined k.o -o k.hsaco

Where a linker is looked for, in order (the first that exists wins):

1. `$TESSERA_LLD`: a path to ld.lld;
2. ROCm: `$ROCM_PATH/llvm/bin/ld.lld`, then `/opt/rocm/llvm/bin/ld.lld`;
3. `PATH`: `ld.lld`, then the versioned Debian/Ubuntu names `ld.lld-22` .. `ld.lld-17`;
4. the lld inside the `ziglang` wheel (`pip install ziglang`, part of the
   `test` extra): `python -m ziglang ld.lld ...` (LLD 22: links code object v5).

lld 14 and older link only code object v4; this backend emits v5, so use a
recent one. Without any, `compile_thread_ir` returns no hsaco (or, with
`link=True`, raises `LinkerError` naming these options).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..llvm.errors import BackendError
from ..llvm.run import compile_timeout

LLD_ENV = "TESSERA_LLD"
VERSIONED_NAMES = tuple(f"ld.lld-{v}" for v in range(22, 16, -1))
NO_LINKER_MESSAGE = (
    "no ld.lld was found to link the AMDGPU code object (hsaco); any of these works: "
    "`pip install ziglang` (its bundled lld; part of `pip install tessera[test]`), "
    "ROCm's $ROCM_PATH/llvm/bin/ld.lld or /opt/rocm/llvm/bin/ld.lld, "
    "`apt-get install lld-19` (ld.lld-19 on PATH) or any ld.lld >= 15 on PATH, "
    "or set TESSERA_LLD to the path of an ld.lld")


class LinkerError(BackendError):
    """ld.lld failed or none was found; `stderr` is what it printed."""

    def __init__(self, message: str, stderr: str = ""):
        self.stderr = stderr
        super().__init__(f"{message}\n{stderr.rstrip()}" if stderr.strip() else message)


@dataclass(frozen=True)
class Linker:
    command: tuple[str, ...]   # what runs ld.lld: (path,) or (python, -m, ziglang, ld.lld)
    origin: str                # which rule found it: TESSERA_LLD, ROCm, PATH, ziglang

    def __str__(self) -> str:
        return f"{' '.join(self.command)} (from {self.origin})"


@functools.cache
def find_linker() -> Linker | None:
    """The first ld.lld of the search order above, or None."""
    explicit = os.environ.get(LLD_ENV)
    if explicit:
        return Linker((explicit,), LLD_ENV) if Path(explicit).is_file() else None
    rocm_candidates = [Path(os.environ["ROCM_PATH"]) / "llvm/bin/ld.lld"] if os.environ.get("ROCM_PATH") else []
    for candidate in [*rocm_candidates, Path("/opt/rocm/llvm/bin/ld.lld")]:
        if candidate.is_file():
            return Linker((str(candidate),), "ROCm")
    for name in ("ld.lld", *VERSIONED_NAMES):
        found = shutil.which(name)
        if found:
            return Linker((found,), "PATH")
    if importlib.util.find_spec("ziglang") is not None:
        return Linker((sys.executable, "-m", "ziglang", "ld.lld"), "ziglang")
    return None


def link(object_bytes: bytes, linker: Linker | None = None) -> bytes:
    """The code object (ET_DYN) linked from relocatable `object_bytes`; LinkerError on failure."""
    linker = linker or find_linker()
    if linker is None:
        raise LinkerError(NO_LINKER_MESSAGE)
    with tempfile.TemporaryDirectory(prefix="tessera-lld-") as tmp:
        source, output = Path(tmp) / "kernel.o", Path(tmp) / "kernel.hsaco"
        source.write_bytes(object_bytes)
        command = [*linker.command, "-shared", "--no-undefined", str(source), "-o", str(output)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=compile_timeout())
        except (OSError, subprocess.TimeoutExpired) as e:
            raise LinkerError(f"running {linker} failed: {e}") from None
        if done.returncode != 0 or not output.is_file():
            raise LinkerError(f"{linker} could not link the AMDGPU code object (exit status {done.returncode})",
                              done.stderr or done.stdout)
        return output.read_bytes()
