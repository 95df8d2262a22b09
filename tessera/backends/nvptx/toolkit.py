"""Where the CUDA toolkit's pieces live: ptxas and libdevice.

Searched in this order (the first hit wins):

1. an explicit override: `TESSERA_PTXAS` / `TESSERA_LIBDEVICE` (a file path);
2. ptxas on `PATH` (libdevice next to it: `<bin>/../nvvm/libdevice`);
3. `$CUDA_HOME`, `$CUDA_PATH`, `$CUDA_ROOT`, then `/usr/local/cuda` and
   `/usr/local/cuda-*` (newest first), `/opt/cuda`;
4. NVIDIA's pip wheels, under the `nvidia` namespace package in
   site-packages: CUDA 13 wheels put everything under `nvidia/cu13/`
   (`nvidia-cuda-nvcc` ships `bin/ptxas`, `nvidia-nvvm` ships
   `nvvm/libdevice/libdevice.10.bc`); CUDA 12 wheels
   (`nvidia-cuda-nvcc-cu12`) ship both under `nvidia/cuda_nvcc/`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

LIBDEVICE_NAME = "libdevice.10.bc"
SYSTEM_ROOTS = (Path("/usr/local/cuda"), Path("/opt/cuda"))
VERSIONED_ROOTS = (Path("/usr/local"), "cuda-*")   # /usr/local/cuda-13.0, ...
_WHEEL_ROOTS = ("cu13", "cu12", "cuda_nvcc")  # under site-packages/nvidia/


def cuda_roots() -> list[Path]:
    """Candidate toolkit roots (each may hold bin/ptxas and nvvm/libdevice), best first."""
    return list(_roots())


def _roots() -> Iterator[Path]:
    """`cuda_roots`, found lazily: a search that stops at ptxas on PATH (the usual case) neither globs
    /usr/local nor asks the import system for NVIDIA's wheels (a new process looks for ptxas before its
    first cache hit)."""
    seen: set[Path] = set()

    def candidates() -> Iterator[Path]:
        on_path = shutil.which("ptxas")
        if on_path:
            yield Path(on_path).resolve().parent.parent
        for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
            if os.environ.get(var):
                yield Path(os.environ[var])
        yield SYSTEM_ROOTS[0]
        parent, pattern = VERSIONED_ROOTS
        yield from sorted(parent.glob(pattern), key=_version_key, reverse=True)
        yield from SYSTEM_ROOTS[1:]
        yield from wheel_roots()

    for root in candidates():
        if root not in seen:
            seen.add(root)
            yield root


def wheel_roots() -> list[Path]:
    """`site-packages/nvidia/{cu13,cu12,cuda_nvcc}` directories of installed NVIDIA wheels."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(base) / name for name in _WHEEL_ROOTS for base in spec.submodule_search_locations
            if (Path(base) / name).is_dir()]


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path.name))


def find_libdevice() -> Path | None:
    """Path of libdevice.10.bc, or None (math then uses hardware approximations)."""
    override = os.environ.get("TESSERA_LIBDEVICE")
    if override:
        return Path(override) if Path(override).is_file() else None
    for root in _roots():
        candidate = root / "nvvm" / "libdevice" / LIBDEVICE_NAME
        if candidate.is_file():
            return candidate
    return None


def find_ptxas_path() -> Path | None:
    """Path of a ptxas executable, or None."""
    override = os.environ.get("TESSERA_PTXAS")
    if override:
        return Path(override) if Path(override).is_file() else None
    for root in _roots():
        candidate = root / "bin" / "ptxas"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None
