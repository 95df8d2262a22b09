"""The on-disk binary cache: compiled kernels kept across processes.

    cache = BinaryCache()                      # $TESSERA_CACHE_DIR, else ~/.cache/tessera
    entry = cache.get_or_compile(key, compile_fn)   # key from `cache_key.cache_key(...)`

`TESSERA_CACHE_DIR=""` (set but empty) disables the disk cache: every
lookup misses and nothing is written.

One entry is one file, `<key>.tsr`:

    offset  size  field
    0       8     magic b"TSRCACHE"
    8       2     format version (little-endian u16, FORMAT_VERSION)
    10      2     flags (0; reserved)
    12      4     length of the JSON manifest in bytes (u32)
    16      8     length of the payload in bytes (u64)
    24      32    sha256 of bytes 0..24 followed by the manifest and the payload
    56      ...   manifest: UTF-8 JSON {key, name, target, metadata, sections}
    ...     ...   payload: the sections back to back, in manifest order
                  ("ptx" always, "binary" (cubin or hsaco) when there is one, "stage:<name>" for
                  any other stage text kept)

A reader opens only regular files (never following a symlink, never blocking
on a FIFO or device) of at most MAX_ENTRY_BYTES, then checks the magic, the
version, that the file is exactly as long as the header says, the checksum, and that the manifest names the key it was
looked up under; an entry failing any check is a miss, is counted, and is
removed (unless another process has already replaced it); an entry that
cannot be read or removed (a read-only cache, a foreign file in its place)
is a CacheWarning and the kernel is compiled again. Nothing is
unpickled or evaluated: the manifest is JSON and the payload is text plus the
GPU binary.

Writers build the entry in a temp file in the same directory (named with the
pid and random bytes), fsync it and `os.replace` it into place, so a reader
sees either the old file or the new one, never a mix. Processes compiling the
same kernel at once each end up with a valid entry; an advisory lock file
(`fcntl.flock`) keeps them from doing the work twice, but nothing depends on
it: without the lock every process compiles and the last rename wins.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat as statmod
import struct
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

try:
    import fcntl
except ImportError:   # not on Linux/macOS: no lock, which costs only duplicate compiles
    fcntl = None

MAGIC = b"TSRCACHE"
FORMAT_VERSION = 2   # 2: the binary section is "binary" (cubin or hsaco), was "cubin"
FIELDS = struct.Struct("<8sHHIQ")   # magic, version, flags, manifest length, payload length
HEADER_SIZE = FIELDS.size + 32       # ... then the sha256
SUFFIX = ".tsr"
KEY_PATTERN = re.compile(r"[0-9a-f]{64}")
MAX_ENTRY_BYTES = 1 << 30   # no compiled kernel comes near; a larger "entry" is not one of ours
STALE_TEMP_SECONDS = 600   # `clear` leaves younger temp files alone: a writer may be about to rename them
LOCK_POLL_SECONDS = 0.01


class CacheError(RuntimeError):
    """The cache directory cannot be used (not writable, not a directory, ...)."""


class CacheWarning(UserWarning):
    """A compiled kernel could not be saved; it is still used, just not kept."""


@dataclass
class CacheEntry:
    """One compiled kernel as the cache stores it. `metadata` must be JSON data (tuples come back as lists)."""

    name: str
    target: str
    metadata: dict[str, Any]
    ptx: str
    binary: bytes | None = None      # the cubin (NVIDIA) or hsaco (AMD)
    stages: dict[str, str] = field(default_factory=dict)   # other stage texts, optional

    @classmethod
    def from_compiled(cls, compiled: Any, keep_stages: bool = False) -> "CacheEntry":
        """From a `tessera.dsl.compiler.CompiledKernel` (read by attribute: the runtime does not import dsl)."""
        stages = {k: v for k, v in compiled.stages.items() if k != "ptx"} if keep_stages else {}
        # AMD kernels have no PTX: the entry's text is empty and `binary` is the hsaco.
        return cls(compiled.name, compiled.target, dict(compiled.metadata), compiled.stages.get("ptx", ""),
                   compiled.binary, stages)


@dataclass(frozen=True)
class EntryInfo:
    key: str
    kernel: str | None     # None when the entry is corrupt
    target: str | None
    size: int              # bytes on disk
    mtime: float
    valid: bool


@dataclass
class CacheStats:
    """What this `BinaryCache` object has seen (this process only)."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0       # entries found damaged and removed
    compiles: int = 0      # compile_fn calls made by get_or_compile
    writes: int = 0


class CorruptEntry(Exception):
    """Raised by `decode_entry`; the cache turns it into a miss."""


def default_cache_directory() -> Path | None:
    """`$TESSERA_CACHE_DIR` if set (None, meaning disabled, when set to ""), else `~/.cache/tessera`."""
    configured = os.environ.get("TESSERA_CACHE_DIR")
    if configured is None:
        return Path.home() / ".cache" / "tessera"
    return Path(configured).expanduser() if configured else None


class BinaryCache:
    """Compiled kernels on disk, keyed by `cache_key`. Safe to share between processes."""

    def __init__(self, directory: str | os.PathLike | None = None, *, lock: bool = True,
                 lock_timeout: float = 120.0):
        if directory is None:
            self.directory = default_cache_directory()
        else:
            self.directory = Path(directory).expanduser() if str(directory) else None
        self.lock = lock and fcntl is not None
        self.lock_timeout = lock_timeout
        self.stats = CacheStats()

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def __repr__(self) -> str:
        return f"BinaryCache({str(self.directory) if self.enabled else 'disabled'})"

    def path(self, key: str) -> Path:
        """Where the entry for `key` lives."""
        _check_key(key)
        if self.directory is None:
            raise CacheError("the disk cache is disabled (TESSERA_CACHE_DIR is set to an empty string)")
        return self.directory / f"{key}{SUFFIX}"

    # -- lookups and writes -------------------------------------------------

    def get(self, key: str) -> CacheEntry | None:
        """The entry stored under `key`, or None (missing or corrupt: a corrupt file is removed)."""
        _check_key(key)
        entry = self._load(key)
        if entry is None:
            self.stats.misses += 1
        else:
            self.stats.hits += 1
        return entry

    def put(self, key: str, entry: CacheEntry) -> None:
        """Store `entry` under `key` atomically, replacing any entry there. Raises CacheError if it cannot."""
        _check_key(key)
        if not self.enabled:
            return
        final = self.path(key)
        data = encode_entry(key, entry)
        temp = final.with_name(f".{key}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise CacheError(f"cannot write to the tessera binary cache at {self.directory}: "
                             f"{exc.strerror or exc}; set TESSERA_CACHE_DIR to a writable directory, "
                             f"or to an empty string to disable the disk cache") from exc
        self.stats.writes += 1

    def get_or_compile(self, key: str, compile_fn: Callable[[], CacheEntry]) -> CacheEntry:
        """The entry under `key`, calling `compile_fn()` and storing its result on a miss.

        Many processes may call this for one key at once: each returns a
        valid entry. A failure to store is a CacheWarning, not an error: the
        kernel compiled, so it is returned anyway.
        """
        _check_key(key)
        if not self.enabled:
            self.stats.misses += 1
            return self._compile(compile_fn)
        entry = self._load(key)
        if entry is None:
            with self._locked(key):
                entry = self._load(key)   # another process may have stored it while we waited
                if entry is None:
                    self.stats.misses += 1
                    entry = self._compile(compile_fn)
                    try:
                        self.put(key, entry)
                    except CacheError as exc:
                        warnings.warn(str(exc), CacheWarning, stacklevel=2)
                    return entry
        self.stats.hits += 1
        return entry

    # -- housekeeping ---------------------------------------------------------

    def entries(self) -> list[EntryInfo]:
        """Every entry on disk, sorted by key; damaged ones are listed with valid=False (and left alone)."""
        infos = []
        for path in self._entry_paths():
            key = path.name[:-len(SUFFIX)]
            try:
                data, stat = read_entry_file(path)
            except FileNotFoundError:   # removed by another process since we listed the directory
                continue
            except (OSError, CorruptEntry):
                stat = path.lstat()
                infos.append(EntryInfo(key, None, None, stat.st_size, stat.st_mtime, False))
                continue
            try:
                entry = decode_entry(key, data)
                infos.append(EntryInfo(key, entry.name, entry.target, stat.st_size, stat.st_mtime, True))
            except CorruptEntry:
                infos.append(EntryInfo(key, None, None, stat.st_size, stat.st_mtime, False))
        return infos

    def clear(self) -> int:
        """Remove every entry (and stale temp and lock files); returns how many entries were removed."""
        removed = 0
        for path in self._entry_paths():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
        if self.enabled and self.directory.is_dir():
            now = time.time()
            for path in self.directory.glob(".*.tmp"):
                with contextlib.suppress(FileNotFoundError):
                    if now - path.stat().st_mtime > STALE_TEMP_SECONDS:
                        path.unlink()
            for path in self.directory.glob(".*.lock"):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()   # at worst a waiting process compiles a kernel twice
        return removed

    def info(self) -> dict[str, Any]:
        """Where the cache is, how many entries it holds and their total size, and this process's counts."""
        entries = self.entries()
        return {"directory": str(self.directory) if self.enabled else None, "enabled": self.enabled,
                "entries": len(entries), "total_bytes": sum(e.size for e in entries),
                "stats": asdict(self.stats)}

    # -- internals ------------------------------------------------------------

    def _load(self, key: str) -> CacheEntry | None:
        if not self.enabled:
            return None
        path = self.path(key)
        try:
            data, stat = read_entry_file(path)
        except (FileNotFoundError, NotADirectoryError):   # no entry (or no cache directory) yet
            return None
        except (OSError, CorruptEntry) as exc:      # unreadable, or not a regular file of ours
            self.stats.corrupt += 1
            warnings.warn(f"tessera binary cache: cannot use {path} ({_reason(exc)}); compiling the kernel again",
                          CacheWarning, stacklevel=3)
            return None
        try:
            return decode_entry(key, data)
        except CorruptEntry:
            self.stats.corrupt += 1
            try:
                _remove_if_unchanged(path, stat)
            except OSError as exc:                   # e.g. a read-only cache directory
                warnings.warn(f"tessera binary cache: {path} is damaged and cannot be removed ({_reason(exc)}); "
                              f"compiling the kernel again", CacheWarning, stacklevel=3)
            return None

    def _compile(self, compile_fn: Callable[[], CacheEntry]) -> CacheEntry:
        entry = compile_fn()
        if not isinstance(entry, CacheEntry):
            raise TypeError(f"compile_fn must return a CacheEntry, got {type(entry).__name__}")
        self.stats.compiles += 1
        return entry

    def _entry_paths(self) -> list[Path]:
        if not self.enabled or not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.glob(f"*{SUFFIX}")
                      if KEY_PATTERN.fullmatch(p.name[:-len(SUFFIX)]))

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """Hold `.<key>.lock` while compiling, if possible. Best effort: on any trouble, go on unlocked."""
        if not self.lock:
            yield
            return
        path = self.directory / f".{key}.lock"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:   # put() will report the directory's problem
            yield
            return
        try:
            acquired = _acquire(fd, self.lock_timeout)
            try:
                yield
            finally:
                if acquired:
                    # Unlink while still holding the lock, then release: waiters on this inode wake and
                    # find the entry; newcomers create a fresh lock file and find it too.
                    _remove_if_unchanged(path, os.fstat(fd))
                    fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise ValueError(f"a cache key is 64 lowercase hex digits (from cache_key()), got {key!r:.80}")


def _acquire(fd: int, timeout: float) -> bool:
    """flock(fd) exclusively, polling so that a stuck holder cannot block us forever."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(LOCK_POLL_SECONDS)
        except OSError:   # e.g. a filesystem without flock support
            return False


def read_entry_file(path: Path) -> tuple[bytes, os.stat_result]:
    """The bytes and stat of the entry file at `path`: raises CorruptEntry for anything but a regular file of
    at most MAX_ENTRY_BYTES, without following a symlink or waiting on a FIFO or a device."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptEntry("a symbolic link, not an entry") from None
        raise
    with open(fd, "rb") as f:
        stat = os.fstat(fd)
        if not statmod.S_ISREG(stat.st_mode):
            raise CorruptEntry("not a regular file")
        if stat.st_size > MAX_ENTRY_BYTES:
            raise CorruptEntry(f"{stat.st_size} bytes, more than any entry")
        return f.read(MAX_ENTRY_BYTES + 1), stat


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _remove_if_unchanged(path: Path, stat: os.stat_result) -> None:
    """Unlink `path` unless another process has replaced it since `stat` was taken (best effort)."""
    try:
        now = os.stat(path)
        if (now.st_ino, now.st_dev) == (stat.st_ino, stat.st_dev):
            os.unlink(path)
    except FileNotFoundError:
        pass


# -- the file format ---------------------------------------------------------------


def encode_entry(key: str, entry: CacheEntry) -> bytes:
    """The bytes of `<key>.tsr` for `entry` (see the module docstring for the layout)."""
    sections = [("ptx", entry.ptx.encode("utf-8"))]
    if entry.binary is not None:
        sections.append(("binary", bytes(entry.binary)))
    sections += [(f"stage:{name}", text.encode("utf-8")) for name, text in sorted(entry.stages.items())]
    manifest = {"key": key, "name": entry.name, "target": entry.target, "metadata": entry.metadata,
                "sections": [[name, len(blob)] for name, blob in sections]}
    try:
        manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cache entry metadata for kernel {entry.name!r} must be JSON data "
                        f"(str, numbers, bool, None, lists, dicts with str keys): {exc}") from None
    body = manifest_bytes + b"".join(blob for _, blob in sections)
    fields = FIELDS.pack(MAGIC, FORMAT_VERSION, 0, len(manifest_bytes), len(body) - len(manifest_bytes))
    return fields + _checksum(fields, body) + body


def decode_entry(key: str, data: bytes) -> CacheEntry:
    """Check and parse the bytes of `<key>.tsr`; raises CorruptEntry on any damage."""
    if len(data) < HEADER_SIZE:
        raise CorruptEntry(f"{len(data)} bytes is shorter than the header")
    magic, version, flags, manifest_len, payload_len = FIELDS.unpack_from(data)
    if magic != MAGIC or version != FORMAT_VERSION or flags != 0:
        raise CorruptEntry("bad magic, format version or flags")
    if len(data) != HEADER_SIZE + manifest_len + payload_len:
        raise CorruptEntry(f"{len(data)} bytes, but the header describes {HEADER_SIZE + manifest_len + payload_len}")
    body = memoryview(data)[HEADER_SIZE:]
    if _checksum(data[:FIELDS.size], body) != data[FIELDS.size:HEADER_SIZE]:
        raise CorruptEntry("checksum mismatch")
    try:
        manifest = json.loads(bytes(body[:manifest_len]).decode("utf-8"))
        if manifest["key"] != key:
            raise CorruptEntry("the entry was stored under another key")
        blobs, offset = {}, manifest_len
        for name, length in manifest["sections"]:
            blobs[name] = bytes(body[offset:offset + length])
            offset += length
        if offset != manifest_len + payload_len or "ptx" not in blobs:
            raise CorruptEntry("the sections do not fill the payload")
        stages = {name[len("stage:"):]: blob.decode("utf-8") for name, blob in blobs.items()
                  if name.startswith("stage:")}
        return CacheEntry(str(manifest["name"]), str(manifest["target"]), dict(manifest["metadata"]),
                          blobs["ptx"].decode("utf-8"), blobs.get("binary"), stages)
    except (ValueError, KeyError, TypeError) as exc:   # JSON/UTF-8 errors are ValueErrors
        raise CorruptEntry(f"unreadable manifest: {exc}") from None


def _checksum(fields: bytes, body: bytes | memoryview) -> bytes:
    digest = hashlib.sha256(fields)
    digest.update(body)
    return digest.digest()
