"""A kernel's cache-relevant dependencies are found without tracing it."""

import tessera
from tessera.dsl.dependencies import kernel_dependencies

SCALE = 3
NAME = "unused-by-kernels"


@tessera.func
def inner(x):
    return x * SCALE


@tessera.func
def outer(x):
    return inner(x) + 1


@tessera.kernel
def uses_helpers(x_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    tessera.store(x_ptr + offs, outer(tessera.load(x_ptr + offs)))


def test_callees_are_found_transitively():
    callees, _ = kernel_dependencies(uses_helpers.source)
    assert sorted(callees) == sorted([outer.source.source_hash, inner.source.source_hash])


def test_global_constants_read_by_the_kernel_or_its_helpers_are_recorded():
    _, constants = kernel_dependencies(uses_helpers.source)
    assert constants["SCALE"] == 3
    assert "NAME" not in constants
