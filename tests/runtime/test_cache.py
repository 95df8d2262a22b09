"""The binary cache: the key changes exactly when the compiled code could, and a damaged entry is never loaded.

Concurrent processes are in `test_cache_concurrency.py`.
"""

import ast
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import tessera
from tessera.ir import dtypes
from tessera.runtime import cache_key as cache_key_module
from tessera.runtime.cache import (
    HEADER_SIZE, BinaryCache, CacheEntry, CacheError, CacheWarning, CorruptEntry, decode_entry, encode_entry,
)
from tessera.runtime.cache_key import cache_key, canonical, compiler_identity, package_source_hash

SPEC = (("x_ptr", "ptr<f32>", True, False), ("n", "i32", False, False), ("BLOCK", "int", 1024))
BASE = dict(kernel_source_hash="k" * 64, callee_hashes=["c1", "c2"], specialization=SPEC,
            options={"num_warps": 4, "num_stages": 2}, target="sm_90a")


def key_with(**changes) -> str:
    return cache_key(**{**BASE, **changes})


def small_entry(**changes) -> CacheEntry:
    fields = dict(name="add", target="sm_90a", metadata={"num_threads": 128, "shared_bytes": 0, "registers": 12},
                  ptx=".version 8.0\n.target sm_90a\n", binary=b"\x7fELF\x00\x01", stages={})
    return CacheEntry(**{**fields, **changes})


KEY = key_with()


# -- the key ---------------------------------------------------------------------


def test_the_key_is_a_sha256_hex_digest_and_deterministic():
    assert len(KEY) == 64 and int(KEY, 16) >= 0
    assert key_with() == KEY


def test_option_order_and_callee_order_do_not_change_the_key():
    assert key_with(options={"num_stages": 2, "num_warps": 4}) == KEY
    assert key_with(callee_hashes=("c2", "c1")) == KEY
    assert key_with(callee_hashes=iter(["c1", "c2", "c1"])) == KEY


def replace_constexpr(value):
    return SPEC[:2] + (("BLOCK", value),)


@pytest.mark.parametrize("changes", [
    {"kernel_source_hash": "K" * 64},
    {"callee_hashes": ["c1", "c2-edited"]},
    {"callee_hashes": ["c1", "c2", "c3"]},
    {"callee_hashes": []},
    {"specialization": SPEC[:2] + (("BLOCK", "int", 512),)},
    {"specialization": (("x_ptr", "ptr<f16>", True, False),) + SPEC[1:]},      # a dtype
    {"specialization": (("x_ptr", "ptr<f32>", False, False),) + SPEC[1:]},     # alignment
    {"options": {"num_warps": 8, "num_stages": 2}},
    {"options": {"num_warps": 4, "num_stages": 2, "fast_math": True}},
    {"target": "sm_80"},
], ids=lambda c: next(iter(c)))
def test_the_key_changes_with_each_input(changes):
    assert key_with(**changes) != KEY


def test_one_true_and_one_point_zero_are_different_constexprs():
    keys = {key_with(specialization=replace_constexpr(v)) for v in (1, True, 1.0, "1", None)}
    assert len(keys) == 5
    assert key_with(specialization=replace_constexpr(0.0)) != key_with(specialization=replace_constexpr(-0.0))
    nan = float("nan")
    assert key_with(specialization=replace_constexpr(nan)) == key_with(specialization=replace_constexpr(nan))


def test_dtype_objects_are_keyed_by_value():
    f32, f16 = dtypes.f32, dtypes.f16
    assert key_with(specialization=replace_constexpr(f32)) == key_with(specialization=replace_constexpr(dtypes.f32))
    assert key_with(specialization=replace_constexpr(f32)) != key_with(specialization=replace_constexpr(f16))
    assert key_with(specialization=replace_constexpr(f32)) != key_with(specialization=replace_constexpr("f32"))


def test_a_tuple_and_a_list_with_the_same_items_differ():
    assert canonical((1, 2)) != canonical([1, 2])
    assert canonical({1: "a"}) != canonical({"1": "a"})


def test_values_without_a_stable_serialization_are_rejected():
    with pytest.raises(TypeError, match="cannot put a value of type builtins.object"):
        key_with(specialization=replace_constexpr(object()))
    with pytest.raises(TypeError, match="options must be a dict"):
        key_with(options=[("num_warps", 4)])


def test_the_compiler_identity_is_part_of_the_key(monkeypatch):
    identity = compiler_identity()
    monkeypatch.setattr(cache_key_module, "compiler_identity", lambda: {**identity, "tessera": "99.0"})
    assert key_with() != KEY
    monkeypatch.setattr(cache_key_module, "compiler_identity", lambda: {**identity, "llvm": "1.2.3"})
    assert key_with() != KEY
    monkeypatch.setattr(cache_key_module, "compiler_identity", lambda: {**identity, "source": "0" * 64})
    assert key_with() != KEY
    monkeypatch.setattr(cache_key_module, "compiler_identity", lambda: dict(identity))
    assert key_with() == KEY


def test_the_compiler_identity_names_tessera_llvm_and_its_own_source():
    import llvmlite
    import llvmlite.binding as llvm

    identity = compiler_identity()
    assert identity["tessera"] == tessera.__version__
    assert identity["llvm"] == ".".join(map(str, llvm.llvm_version_info))
    assert identity["llvmlite"] == llvmlite.__version__
    assert identity["source"] == package_source_hash()
    assert compiler_identity() is identity   # computed once per process


def test_the_source_hash_covers_py_and_lark_files_only(tmp_path):
    (tmp_path / "ir").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "ir" / "grammar.lark").write_text("start: NAME\n")
    before = package_source_hash(tmp_path)
    (tmp_path / "notes.txt").write_text("ignored")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.cpython-311.py").write_text("ignored")
    assert package_source_hash(tmp_path) == before
    (tmp_path / "ir" / "grammar.lark").write_text("start: NUMBER\n")
    after_grammar = package_source_hash(tmp_path)
    assert after_grammar != before
    (tmp_path / "a.py").write_text("x = 2\n")
    assert package_source_hash(tmp_path) != after_grammar
    # moving content between files changes the hash too
    (tmp_path / "a.py").write_text("")
    (tmp_path / "b.py").write_text("x = 2\n")
    assert package_source_hash(tmp_path) not in (before, after_grammar)


# -- entries on disk ---------------------------------------------------------------


def test_put_then_get_round_trips(tmp_path):
    cache = BinaryCache(tmp_path)
    for entry in (small_entry(), small_entry(binary=None), small_entry(stages={"llvm_ir": "define void @add()"})):
        cache.put(KEY, entry)
        assert cache.get(KEY) == entry
    assert cache.stats.hits == 3 and cache.stats.writes == 3


def test_an_entry_is_one_file_with_a_header(tmp_path):
    cache = BinaryCache(tmp_path)
    cache.put(KEY, small_entry())
    assert [p.name for p in tmp_path.iterdir()] == [f"{KEY}.tsr"]
    data = cache.path(KEY).read_bytes()
    assert data[:8] == b"TSRCACHE" and HEADER_SIZE == 56
    assert data == encode_entry(KEY, small_entry())   # deterministic: racing writers write the same bytes


def test_a_missing_entry_is_a_miss(tmp_path):
    cache = BinaryCache(tmp_path / "not-yet-created")
    assert cache.get(KEY) is None
    assert cache.stats.misses == 1 and cache.entries() == [] and cache.clear() == 0


def write_and_get(tmp_path, data: bytes):
    cache = BinaryCache(tmp_path)
    cache.path(KEY).write_bytes(data)
    return cache, cache.get(KEY)


def test_every_truncation_is_detected_and_removed(tmp_path):
    data = encode_entry(KEY, small_entry())
    assert len(data) < 400
    for length in range(len(data)):
        cache, entry = write_and_get(tmp_path, data[:length])
        assert entry is None and cache.stats.corrupt == 1, length
        assert not cache.path(KEY).exists()
    cache, entry = write_and_get(tmp_path, data + b"\x00")
    assert entry is None and cache.stats.corrupt == 1


def test_every_single_bit_flip_is_detected_and_removed(tmp_path):
    data = encode_entry(KEY, small_entry())
    for bit in range(len(data) * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        cache, entry = write_and_get(tmp_path, bytes(damaged))
        assert entry is None and cache.stats.corrupt == 1, bit
        assert not cache.path(KEY).exists()


entries = st.builds(
    CacheEntry,
    name=st.text(min_size=1, max_size=20), target=st.sampled_from(["sm_80", "sm_90a", "sm_100"]),
    metadata=st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8) | st.booleans() | st.none(),
                             max_size=4),
    ptx=st.text(max_size=200), binary=st.none() | st.binary(max_size=200),
    stages=st.dictionaries(st.sampled_from(["tile_ir", "llvm_ir"]), st.text(max_size=50), max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(entry=entries, data=st.data())
def test_any_entry_round_trips_and_any_damage_is_detected(entry, data):
    encoded = encode_entry(KEY, entry)
    assert decode_entry(KEY, encoded) == entry
    edits = data.draw(st.lists(st.tuples(st.integers(0, len(encoded) - 1), st.integers(1, 255)), min_size=1,
                               max_size=4, unique_by=lambda e: e[0]))
    damaged = bytearray(encoded)
    for position, mask in edits:
        damaged[position] ^= mask
    with pytest.raises(CorruptEntry):
        decode_entry(KEY, bytes(damaged))


def test_an_entry_filed_under_another_key_is_not_served(tmp_path):
    other = key_with(target="sm_80")
    cache, entry = write_and_get(tmp_path, encode_entry(other, small_entry()))
    assert entry is None and cache.stats.corrupt == 1


def test_get_or_compile_compiles_once_then_hits(tmp_path):
    cache, calls = BinaryCache(tmp_path), []

    def compile_fn():
        calls.append(1)
        return small_entry()

    assert cache.get_or_compile(KEY, compile_fn) == small_entry()
    assert cache.get_or_compile(KEY, compile_fn) == small_entry()
    assert BinaryCache(tmp_path).get_or_compile(KEY, compile_fn) == small_entry()   # e.g. the next process
    assert len(calls) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{KEY}.tsr"]   # no temp or lock files left


def test_a_corrupt_entry_is_recompiled_never_loaded(tmp_path):
    cache = BinaryCache(tmp_path)
    cache.put(KEY, small_entry(ptx="stale"))
    path = cache.path(KEY)
    path.write_bytes(path.read_bytes()[:-3])
    assert cache.get_or_compile(KEY, lambda: small_entry(ptx="fresh")).ptx == "fresh"
    assert cache.stats.corrupt == 1 and cache.stats.compiles == 1
    assert BinaryCache(tmp_path).get(KEY).ptx == "fresh"


def test_compile_fn_must_return_an_entry(tmp_path):
    with pytest.raises(TypeError, match="must return a CacheEntry"):
        BinaryCache(tmp_path).get_or_compile(KEY, lambda: b"cubin")


def test_metadata_must_be_json_data(tmp_path):
    with pytest.raises(TypeError, match="metadata for kernel 'add' must be JSON data"):
        BinaryCache(tmp_path).put(KEY, small_entry(metadata={"when": object()}))


def test_keys_must_come_from_cache_key(tmp_path):
    cache = BinaryCache(tmp_path)
    for bad in ("../../etc/passwd", KEY.upper(), KEY[:-1], 123):
        with pytest.raises(ValueError, match="64 lowercase hex digits"):
            cache.get(bad)


# -- housekeeping ------------------------------------------------------------------


def test_entries_and_info_report_what_is_on_disk(tmp_path):
    cache = BinaryCache(tmp_path)
    other = key_with(target="sm_80")
    cache.put(KEY, small_entry())
    cache.put(other, small_entry(name="mul", target="sm_80", binary=None))
    listed = {e.key: e for e in cache.entries()}
    assert set(listed) == {KEY, other}
    assert (listed[KEY].kernel, listed[KEY].target, listed[other].kernel) == ("add", "sm_90a", "mul")
    assert listed[KEY].size == cache.path(KEY).stat().st_size and listed[KEY].mtime > 0
    info = cache.info()
    assert info["directory"] == str(tmp_path) and info["entries"] == 2
    assert info["total_bytes"] == sum(p.stat().st_size for p in tmp_path.iterdir())


def test_entries_list_damaged_files_as_invalid_without_removing_them(tmp_path):
    cache = BinaryCache(tmp_path)
    cache.put(KEY, small_entry())
    cache.path(KEY).write_bytes(b"TSRCACHE")
    [info] = cache.entries()
    assert not info.valid and info.kernel is None and cache.path(KEY).exists()


def test_clear_removes_every_entry(tmp_path):
    cache = BinaryCache(tmp_path)
    for target in ("sm_80", "sm_90a", "sm_100"):
        cache.put(key_with(target=target), small_entry(target=target))
    (tmp_path / "unrelated.txt").write_text("not ours")
    assert cache.clear() == 3
    assert cache.entries() == [] and cache.info()["entries"] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["unrelated.txt"]


# -- configuration and errors --------------------------------------------------------


def test_the_directory_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "kernels"))
    assert BinaryCache().directory == tmp_path / "kernels"
    monkeypatch.delenv("TESSERA_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert BinaryCache().directory == tmp_path / ".cache" / "tessera"


def test_an_empty_cache_dir_disables_the_disk_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_CACHE_DIR", "")
    monkeypatch.chdir(tmp_path)
    cache, calls = BinaryCache(), []
    assert not cache.enabled and repr(cache) == "BinaryCache(disabled)"
    cache.put(KEY, small_entry())
    assert cache.get(KEY) is None
    for _ in range(2):
        cache.get_or_compile(KEY, lambda: calls.append(1) or small_entry())
    assert len(calls) == 2
    assert cache.entries() == [] and cache.clear() == 0 and list(tmp_path.iterdir()) == []
    assert cache.info() == {"directory": None, "enabled": False, "entries": 0, "total_bytes": 0,
                            "stats": {"hits": 0, "misses": 3, "corrupt": 0, "compiles": 2, "writes": 0}}


def test_an_unusable_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = BinaryCache(blocker / "cache")   # cannot be created, even by root
    with pytest.raises(CacheError, match=r"cannot write to the tessera binary cache at .*a-file/cache: .*"
                                         r"set TESSERA_CACHE_DIR to a writable directory"):
        cache.put(KEY, small_entry())
    assert list(tmp_path.iterdir()) == [blocker]


def test_get_or_compile_still_returns_the_kernel_when_it_cannot_be_saved(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        entry = BinaryCache(blocker / "cache").get_or_compile(KEY, small_entry)
    assert entry == small_entry()
    [warning] = caught
    assert warning.category is CacheWarning and "TESSERA_CACHE_DIR" in str(warning.message)


def test_the_cache_never_unpickles_or_evaluates():
    runtime = Path(cache_key_module.__file__).parent
    for name in ("cache.py", "cache_key.py"):
        tree = ast.parse((runtime / name).read_text())
        imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
        imported = {alias.name.split(".")[0] for node in imports for alias in node.names}
        imported |= {node.module.split(".")[0] for node in imports if isinstance(node, ast.ImportFrom) and node.module}
        assert not imported & {"pickle", "marshal", "shelve", "dill", "cloudpickle"}, name
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
        called = {node.func.id for node in calls if isinstance(node.func, ast.Name)}
        assert not called & {"eval", "exec"}, name
        modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert not any(m.startswith(("dsl", "tessera.dsl")) for m in modules), name   # runtime sits below dsl


def test_the_compiler_identity_is_stored_once_per_installation(tmp_path, monkeypatch):
    from tessera.runtime import identity as identity_module

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    compiler_identity.cache_clear()
    try:
        first = compiler_identity()
        assert list((tmp_path / "identity").glob("*.json")), "the identity is written to the cache directory"
        compiler_identity.cache_clear()
        monkeypatch.setattr(identity_module, "_compute_identity", lambda: pytest.fail("computed again"))
        assert compiler_identity() == first           # a new process reads it: no hashing, no LLVM
    finally:
        compiler_identity.cache_clear()


def test_the_installation_stamp_changes_when_a_source_file_changes(tmp_path):
    from tessera.runtime.identity import installation_stamp

    (tmp_path / "a.py").write_text("x = 1\n")
    before = installation_stamp(tmp_path)
    assert installation_stamp(tmp_path) == before
    (tmp_path / "a.py").write_text("x = 22\n")
    assert installation_stamp(tmp_path) != before
    (tmp_path / "b.lark").write_text("start: NAME\n")
    assert installation_stamp(tmp_path) != before
    before = installation_stamp(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.py").write_text("bytecode is not source\n")
    (tmp_path / "notes.txt").write_text("neither is this\n")
    assert installation_stamp(tmp_path) == before
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.py").write_text("y = 3\n")
    assert installation_stamp(tmp_path) != before, "files in subpackages count"
