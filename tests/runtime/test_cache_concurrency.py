"""Many processes sharing one cache directory: every one gets a valid kernel, one valid entry remains.

Eight spawned worker processes start each round together (a barrier), so
they really do race on the same key.
"""

import multiprocessing
import os
import time

import pytest

from tessera.runtime.cache import BinaryCache, CacheEntry, decode_entry

WORKERS = 8
KEY = "5e" * 32
HAMMER_SECONDS = 0.5
_barrier = None


def deterministic_entry(variant: int = 0) -> CacheEntry:
    return CacheEntry(name="add", target="sm_90a", metadata={"num_threads": 128, "variant": variant},
                      ptx=f"// variant {variant}\n" * 50, binary=bytes(range(256)) * 40 + bytes([variant]))


def _start(barrier) -> None:
    global _barrier
    _barrier = barrier


def compile_through_cache(directory: str, use_lock: bool, log: str) -> tuple[int, CacheEntry]:
    cache = BinaryCache(directory, lock=use_lock)

    def compile_fn() -> CacheEntry:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.2)
        return deterministic_entry()

    _barrier.wait(timeout=60)
    return os.getpid(), cache.get_or_compile(KEY, compile_fn)


def hammer(directory: str, role: str, variant: int) -> tuple[set[int | None], int]:
    """Writers replace the entry over and over; readers must only ever see a whole entry."""
    cache = BinaryCache(directory)
    seen = set()
    _barrier.wait(timeout=60)
    deadline = time.monotonic() + HAMMER_SECONDS
    while time.monotonic() < deadline:
        if role == "write":
            cache.put(KEY, deterministic_entry(variant))
        else:
            entry = cache.get(KEY)
            seen.add(None if entry is None else entry.metadata["variant"])
            assert entry is None or entry == deterministic_entry(entry.metadata["variant"])
    return seen, cache.stats.corrupt


@pytest.fixture(scope="module")
def pool():
    context = multiprocessing.get_context("spawn")
    with context.Pool(WORKERS, initializer=_start, initargs=(context.Barrier(WORKERS),)) as workers:
        yield workers


def assert_one_valid_entry(directory) -> CacheEntry:
    names = sorted(p.name for p in directory.iterdir())
    assert names == [f"{KEY}.tsr"], names   # no temp files, no lock files
    return decode_entry(KEY, (directory / names[0]).read_bytes())


@pytest.mark.parametrize("use_lock", [True, False], ids=["locked", "unlocked"])
def test_racing_processes_all_get_the_kernel_and_leave_one_entry(pool, tmp_path, use_lock):
    directory, log = tmp_path / "cache", tmp_path / "compiles.log"
    results = pool.starmap(compile_through_cache, [(str(directory), use_lock, str(log))] * WORKERS, chunksize=1)
    assert len({pid for pid, _ in results}) == WORKERS
    assert all(entry == deterministic_entry() for _, entry in results)
    assert assert_one_valid_entry(directory) == deterministic_entry()
    compiles = log.read_text().split()
    if use_lock:
        assert len(compiles) == 1   # the lock saves the duplicate work...
    else:
        assert 1 <= len(compiles) <= WORKERS   # ...but correctness never depended on it


def test_readers_never_see_a_partial_entry_while_writers_replace_it(pool, tmp_path):
    directory = tmp_path / "cache"
    BinaryCache(directory).put(KEY, deterministic_entry(0))
    jobs = [(str(directory), "write", v) for v in range(1, 4)] + [(str(directory), "read", 0)] * (WORKERS - 3)
    results = pool.starmap(hammer, jobs, chunksize=1)
    assert sum(corrupt for _, corrupt in results) == 0
    seen = set().union(*(s for s, _ in results[3:]))
    assert seen <= {0, 1, 2, 3}   # never a miss: the file is always some writer's whole entry
    assert seen & {1, 2, 3}       # the readers did overlap the writers
    assert assert_one_valid_entry(directory).metadata["variant"] in {1, 2, 3}


def test_threads_racing_in_one_process_get_the_same_result(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    cache, calls = BinaryCache(tmp_path), []

    def compile_fn():
        calls.append(1)
        time.sleep(0.05)
        return deterministic_entry()

    with ThreadPoolExecutor(8) as threads:
        results = list(threads.map(lambda _: cache.get_or_compile(KEY, compile_fn), range(8)))
    assert all(entry == deterministic_entry() for entry in results)
    assert len(calls) == 1   # flock on separate open()s excludes threads too
    assert assert_one_valid_entry(tmp_path) == deterministic_entry()
