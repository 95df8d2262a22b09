"""The compiler's identity, part of every binary-cache key, computed once per installation.

    compiler_identity()   # {"tessera": "0.1.0", "source": <sha256 of its .py/.lark files>, "llvm": ..., "llvmlite": ...}

Hashing every source file and loading LLVM to ask its version costs tens of
milliseconds, too much for a process that only wants a cached binary. So the
identity is stored in the cache directory (`identity/<stamp>.json`) under a
*stamp* of the installation: the package's path and, for each of its .py and
.lark files, its relative path, size and modification time, plus the same
facts of llvmlite's library. Reading the stamp is one `scandir` per directory
and one `stat` per file (about 1.4 ms for ~340 files); any edit, reinstall or llvmlite upgrade changes it, and the identity is
then computed again and stored anew. Without a cache directory (or one that
cannot be written) the identity is computed in each process, as before.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import secrets
from pathlib import Path

from ..version import __version__

PACKAGE_ROOT = Path(__file__).resolve().parents[1]   # the `tessera` package directory
SOURCE_SUFFIXES = (".py", ".lark")


@functools.cache
def compiler_identity() -> dict[str, str]:
    """What identifies this compiler build; read from the cache directory when the installation is unchanged."""
    from .cache import default_cache_directory

    stamp = installation_stamp()
    directory = default_cache_directory()
    path = None if directory is None else directory / "identity" / f"{stamp[:32]}.json"
    stored = _read(path)
    if stored is not None and stored.get("stamp") == stamp and isinstance(stored.get("identity"), dict):
        return stored["identity"]
    identity = _compute_identity()
    _write(path, {"stamp": stamp, "identity": identity})
    return identity


def _compute_identity() -> dict[str, str]:
    try:
        import llvmlite
        import llvmlite.binding as llvm
        llvm_version = ".".join(map(str, llvm.llvm_version_info))
        llvmlite_version = llvmlite.__version__
    except ImportError:   # the key must still be computable (e.g. `tessera cache list` without llvmlite)
        llvm_version = llvmlite_version = "unavailable"
    return {"tessera": __version__, "source": package_source_hash(), "llvm": llvm_version,
            "llvmlite": llvmlite_version}


def installation_stamp(root: Path = PACKAGE_ROOT) -> str:
    """sha256 of the facts that change when the compiler's files or llvmlite change (see the module docstring)."""
    files: list[str] = []
    _stat_sources(str(root), "", files)
    facts = [str(root), *sorted(files)]
    spec = importlib.util.find_spec("llvmlite")
    for base in (spec.submodule_search_locations or []) if spec else []:
        with contextlib.suppress(OSError):
            stat = os.stat(os.path.join(base, "binding", "libllvmlite.so"))
            facts.append(f"llvmlite:{base}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(facts).encode()).hexdigest()


def package_source_hash(root: Path = PACKAGE_ROOT) -> str:
    """sha256 over every .py and .lark file under `root`: relative path, length and bytes, in sorted order."""
    digest = hashlib.sha256()
    for relative, path in _source_files(root):
        data = Path(path).read_bytes()
        name = relative.encode()
        # Length-prefix both fields so no two different file sets hash the same stream.
        digest.update(len(name).to_bytes(8, "little") + name + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def _source_files(root: Path) -> list[tuple[str, str]]:
    """(path relative to `root` with '/' separators, path) of the .py and .lark files under `root` (not in
    __pycache__), sorted by the relative path."""
    found = []
    prefix = len(str(root)) + 1
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if d != "__pycache__"]
        for name in files:
            if name.endswith(SOURCE_SUFFIXES):
                path = os.path.join(directory, name)
                found.append((path[prefix:].replace(os.sep, "/"), path))
    return sorted(found)


def _stat_sources(directory: str, prefix: str, facts: list[str]) -> None:
    """Append "relative/path:size:mtime_ns" for each .py and .lark file under `directory` (not in __pycache__).
    One `scandir` per directory and the stat of its entries: about half the cost of `os.walk` plus a separate
    `os.stat` per file, which a new process pays before its first cache hit."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "__pycache__":
                    _stat_sources(entry.path, f"{prefix}{entry.name}/", facts)
            elif entry.name.endswith(SOURCE_SUFFIXES):
                stat = entry.stat()
                facts.append(f"{prefix}{entry.name}:{stat.st_size}:{stat.st_mtime_ns}")


def _read(path: Path | None) -> dict | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):      # missing or damaged: computed again and rewritten
        return None
    return data if isinstance(data, dict) else None


def _write(path: Path | None, document: dict) -> None:
    """Best effort, atomically (temp file + rename): a cache that cannot be written only costs the recompute."""
    if path is None:
        return
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp.write_text(json.dumps(document, sort_keys=True), "utf-8")
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            temp.unlink()
