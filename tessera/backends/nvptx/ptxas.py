"""ptxas: PTX -> cubin, and what `ptxas -v` says about the kernel.

    tool = find_ptxas()                 # None when there is none (see toolkit.py)
    cubin, info = assemble(ptx, "sm_90a", tool)
    info["registers"], info["spill_stores"], info["spill_loads"]

`info` holds, for the kernel (the first entry function ptxas reports):
registers, spill_stores, spill_loads (bytes), stack_frame (bytes),
static_shared_bytes (the dynamic buffer is not counted: that is `shared_bytes` of the function),
barriers, constant_bytes (cmem bank -> bytes), plus `functions` (the same
per function) and `log` (ptxas's whole -v output). A failure raises
`PtxasError` carrying ptxas's stderr. The arch-specific targets (sm_90a)
are passed as they are: `-arch=sm_90a`.
"""

from __future__ import annotations

import functools
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..llvm.run import TIMEOUT_ENV, compile_timeout
from .errors import PtxasError
from .toolkit import find_ptxas_path

@dataclass(frozen=True)
class Ptxas:
    path: Path
    version: tuple[int, int]  # the CUDA release it comes from: (13, 0)

    def __str__(self) -> str:
        return f"ptxas {self.version[0]}.{self.version[1]} ({self.path})"


def find_ptxas() -> Ptxas | None:
    """The ptxas to use (see `toolkit.py` for the search order), or None."""
    path = find_ptxas_path()
    if path is None:
        return None
    try:
        return _probe(str(path), path.stat().st_mtime)
    except PtxasError:
        return None


@functools.cache
def _probe(path: str, mtime: float) -> Ptxas:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PtxasError(f"cannot run {path}: {e}") from None
    match = re.search(r"release (\d+)\.(\d+)", out.stdout)
    if out.returncode != 0 or not match:
        raise PtxasError(f"{path} --version did not say which CUDA release it is", out.stderr or out.stdout)
    return Ptxas(Path(path), (int(match.group(1)), int(match.group(2))))


def assemble(ptx: str, arch: str, tool: Ptxas, options: tuple[str, ...] = ()) -> tuple[bytes, dict]:
    """Run `ptxas -arch=<arch> -v` on `ptx`; returns (cubin bytes, parsed -v info)."""
    with tempfile.TemporaryDirectory(prefix="tessera-ptxas-") as tmp:
        source, cubin = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        source.write_text(ptx)
        command = [str(tool.path), f"-arch={arch}", "-v", *options, "-o", str(cubin), str(source)]
        limit = compile_timeout()
        try:
            run = subprocess.run(command, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            raise PtxasError(f"{tool} did not finish within the {limit:g} s limit for {arch} ({TIMEOUT_ENV}=<seconds> "
                             f"raises it)") from None
        except OSError as e:
            raise PtxasError(f"cannot run {tool}: {e}") from None
        log = run.stdout + run.stderr
        if run.returncode != 0:
            raise PtxasError(f"{tool} rejected the PTX for {arch} (exit status {run.returncode}):",
                             log.replace(str(source), "kernel.ptx"))
        return cubin.read_bytes(), parse_info(log)


_FUNCTION = re.compile(r"(?:Compiling entry function|Function properties for) '?([\w$.]+)'?")
_FIELDS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "barriers": re.compile(r"used (\d+) barriers"),
    "static_shared_bytes": re.compile(r"(\d+) bytes smem"),
    "stack_frame": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
}
_CMEM = re.compile(r"(\d+) bytes cmem\[(\d+)\]")


def parse_info(log: str) -> dict:
    """The numbers in `ptxas -v` output, for the kernel and per function (see the module doc)."""
    functions: dict[str, dict] = {}
    current: dict | None = None
    for line in log.splitlines():
        match = _FUNCTION.search(line)
        if match:
            current = functions.setdefault(match.group(1), {"constant_bytes": {}})
            continue
        if current is None:
            continue
        for key, pattern in _FIELDS.items():
            found = pattern.search(line)
            if found:
                current[key] = int(found.group(1))
        for size, bank in _CMEM.findall(line):
            current["constant_bytes"][int(bank)] = int(size)
    kernel = next(iter(functions.values()), {})
    defaults = {key: 0 for key in _FIELDS}
    return {**defaults, **kernel, "functions": functions, "log": log}
