"""The warm launch path: a cheap fingerprint of the arguments selects the prepared launcher.

It must never be coarser than the specialization key: two launches with the
same fingerprint must be the same specialization, or the wrong binary runs.
"""

import pytest
from hypothesis import given, settings, strategies as st

import tessera
from tessera.dsl import kernel as kernel_module
from test_gpu_launch import FakeDeviceArray


@tessera.kernel
def scaled_copy(x_ptr, out_ptr, n, scale, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    tessera.store(out_ptr + offs, tessera.load(x_ptr + offs, mask=offs < n) * scale, mask=offs < n)


BASE = 0x7F0000000000
arrays = st.builds(lambda offset, typestr, n: FakeDeviceArray(n, typestr=typestr, address=BASE + offset),
                   st.sampled_from([0, 4, 16, 32, 4096, 4100]), st.sampled_from(["<f4", "<f2"]),
                   st.sampled_from([16, 64, 1024]))
ints = st.one_of(st.sampled_from([0, 1, 16, 17, 32, 2**31 - 1, 2**31, -(2**31) - 1]), st.integers(-100, 100))
launches = st.tuples(arrays, arrays, ints, st.one_of(st.floats(-2, 2), st.just(1.0)),
                     st.sampled_from([16, 32, 16.0, True]))


def slow_key(launch):
    x, out, n, scale, block = launch
    return scaled_copy._bind((x, out, n, scale), {"BLOCK": block}).key


def fingerprint(launch):
    x, out, n, scale, block = launch
    return scaled_copy.fast_launches.fingerprint((x, out, n, scale), {"BLOCK": block}, 4)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(first=launches, second=launches)
def test_equal_fingerprints_mean_equal_specializations(first, second):
    a, b = fingerprint(first), fingerprint(second)
    if a is not None and a == b:
        assert slow_key(first) == slow_key(second)


def test_unusual_calls_take_the_slow_path():
    x, out = FakeDeviceArray(64), FakeDeviceArray(64, address=BASE + 4096)
    fast = scaled_copy.fast_launches
    assert fast.fingerprint((x, out, 64), {"scale": 1.0, "BLOCK": 64}, 4) is None     # runtime arg by keyword
    assert fast.fingerprint((x, out, 2**64, 1.0), {"BLOCK": 64}, 4) is None           # u64: let the binder decide
    assert fast.fingerprint((x, out, 64, 1.0), {"BLOCK": [64]}, 4) is None            # unhashable constexpr
    assert fast.fingerprint((x, out, 64, 1.0), {"BLOCK": 64}, 4) != fast.fingerprint(
        (x, out, 64, 1.0), {"BLOCK": 64}, 8)                                           # num_warps matters


def test_a_repeated_launch_skips_binding(monkeypatch):
    launched, bound = [], []

    class FakeLauncher:
        def __call__(self, grid, args, stream=None):
            launched.append((grid, len(args)))

    real_bind = kernel_module.Kernel._bind
    monkeypatch.setattr(kernel_module.Kernel, "_bind", lambda self, a, k: bound.append(1) or real_bind(self, a, k))
    monkeypatch.setattr(kernel_module, "launch_on_gpu", lambda *a, **k: FakeLauncher()(a[2], a[1].runtime_args)
                        or FakeLauncher())
    x, out = FakeDeviceArray(64), FakeDeviceArray(64, address=BASE + 4096)
    for _ in range(3):
        scaled_copy[(1,)](x, out, 64, 2.0, BLOCK=64)
    assert len(bound) == 1, "only the first launch binds and classifies its arguments"
    assert launched == [((1,), 4)] * 3


def test_fingerprint_groups_over_a_grid_of_launches_are_single_specializations():
    import itertools

    arrays_ = [FakeDeviceArray(n, typestr=t, address=BASE + off)
               for off, t, n in itertools.product([0, 16, 4, 4096], ["<f4", "<f2"], [16, 1024])]
    groups: dict = {}
    launches_ = list(itertools.product(arrays_[::3], arrays_[1::3], [1, 16, 17, 32, 2**31], [0.5, 1.0],
                                       [16, 16.0, True]))
    for launch in launches_:
        groups.setdefault(fingerprint(launch), set()).add(slow_key(launch))
    assert len(groups) < len(launches_) / 2, "the grid must contain launches that share a fingerprint"
    assert all(len(keys) == 1 for keys in groups.values())
