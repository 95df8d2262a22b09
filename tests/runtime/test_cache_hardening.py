"""The binary cache trusts nothing it finds in its folder: a FIFO, a device behind a symlink, a huge file or a
damaged entry it cannot remove are each a warning and a recompile, never a hang, an unbounded read or a crash."""

import os
import threading
import warnings

import pytest

from tessera.runtime import cache as cache_module
from tessera.runtime.cache import MAX_ENTRY_BYTES, SUFFIX, BinaryCache, CacheEntry, CacheWarning

KEY = "ab" * 32


def compiled() -> CacheEntry:
    return CacheEntry("add", "sm_80", {"num_threads": 128}, ptx="// ptx")


def compile_with(cache: BinaryCache) -> tuple[CacheEntry, list]:
    """get_or_compile in a thread with a deadline (a blocking open would hang the test, not end it)."""
    result = {}

    def work():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result["entry"] = cache.get_or_compile(KEY, compiled)
            result["warnings"] = [w for w in caught if issubclass(w.category, CacheWarning)]
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive(), "the cache blocked"
    return result["entry"], result["warnings"]


@pytest.fixture
def cache(tmp_path):
    return BinaryCache(tmp_path, lock=False)


def test_a_fifo_in_place_of_an_entry_is_not_waited_on(cache, tmp_path):
    os.mkfifo(tmp_path / f"{KEY}{SUFFIX}")
    entry, caught = compile_with(cache)
    assert entry == compiled() and "not a regular file" in str(caught[0].message)


def test_a_symlink_to_a_device_is_not_read(cache, tmp_path):
    (tmp_path / f"{KEY}{SUFFIX}").symlink_to("/dev/zero")
    entry, caught = compile_with(cache)
    assert entry == compiled() and "symbolic link" in str(caught[0].message)


def test_a_huge_file_is_not_read(cache, tmp_path):
    with open(tmp_path / f"{KEY}{SUFFIX}", "wb") as f:
        f.truncate(MAX_ENTRY_BYTES + 1)                  # sparse: no disk used
    entry, caught = compile_with(cache)
    assert entry == compiled() and "more than any entry" in str(caught[0].message)


def test_a_damaged_entry_that_cannot_be_removed_is_compiled_again(cache, tmp_path, monkeypatch):
    (tmp_path / f"{KEY}{SUFFIX}").write_bytes(b"not an entry")

    def read_only(path, stat):       # what a read-only cache folder does to the repair (even as root)
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(cache_module, "_remove_if_unchanged", read_only)
    monkeypatch.setattr(BinaryCache, "put", lambda self, key, entry: None)
    entry, caught = compile_with(cache)
    assert entry == compiled() and "cannot be removed (Permission denied)" in str(caught[0].message)


def test_the_listing_marks_foreign_files_damaged_without_reading_them(cache, tmp_path):
    os.mkfifo(tmp_path / f"{KEY}{SUFFIX}")
    [info] = cache.entries()
    assert info.key == KEY and not info.valid
