"""Helpers as compile-time values: a kernel takes a @tessera.func as a constexpr and calls it (the library's
fusion hooks), splices tuples into calls with *, and takes nested tuples of constexprs; the helper's source is
part of the binary cache key."""

import numpy as np

import tessera
from tessera.runtime.cache_key import canonical


@tessera.func
def add_scaled(x, y, s):
    return x + y * s


@tessera.func
def mul_scaled(x, y, s):
    return x * y * s


@tessera.kernel
def apply(x_ptr, y_ptr, out_ptr, s, n, FN: tessera.constexpr, PLAN: tessera.constexpr, BLOCK: tessera.constexpr):
    offsets = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offsets, mask=offsets < n)
    y = tessera.load(y_ptr + offsets, mask=offsets < n)
    extra = (y, s) if PLAN[0][1] else (y, 1.0)
    tessera.store(out_ptr + offsets, FN(x, *extra), mask=offsets < n)


def run(fn, plan, s=3.0):
    x, y = np.arange(10, dtype=np.float32), np.full(10, 2.0, np.float32)
    out = np.zeros_like(x)
    apply[(1,)](x, y, out, s, 10, FN=fn, PLAN=plan, BLOCK=16)
    return x, y, out


def test_a_helper_passed_as_a_constexpr_is_inlined_with_spliced_arguments():
    x, y, out = run(add_scaled, (("scaled", True),))
    np.testing.assert_array_equal(out, x + y * 3.0)
    x, y, out = run(mul_scaled, (("unscaled", False),))
    np.testing.assert_array_equal(out, x * y)


def tile_ir(fn):
    z = np.zeros(10, np.float32)
    return apply.ir(z, z, z, 3.0, 10, FN=fn, PLAN=(("a", True),), BLOCK=16)


def test_each_helper_is_its_own_specialization():
    assert "= add %x" in tile_ir(add_scaled) and "= mul %x, %y" in tile_ir(mul_scaled)


def test_the_cache_key_of_a_helper_is_its_name_source_and_dependencies():
    key = canonical(add_scaled)
    assert key[0].endswith("DeviceFunction")
    name, source_hash = key[1][1][0][1], key[1][1][1][1]
    assert name.endswith("add_scaled") and source_hash == add_scaled.source.source_hash
    assert canonical(add_scaled) != canonical(mul_scaled)
