"""The merge of decode's key splits (tessera/kernels_lib/attention_split_kv.py, `merge_splits`): in the split
launch itself (the last program of each row group to count itself in merges; the default) or by the combine
kernel after it ($TESSERA_DECODE_SEPARATE_COMBINE=1), on the CPU interpreter.

Specification:

* the merge in the launch matches float64 attention over the gathered cache with many splits merged a few at
  a time, splits that see no key, GQA-packed rows (one row of a group; sixteen), lengths 0, 1 and odd,
  windows, and the unified max;
* it is the two-launch path's result bit for bit, whatever order the programs run in (whichever split arrives
  last, the splits are added in split order);
* it leaves its counters at 0, so the next call (same shape, same counters, no clearing launch) is right;
* the op launches what the variable asks for; one split launches no merge and takes no counters.
"""

from __future__ import annotations

import importlib
import itertools
import random

import pytest

torch = pytest.importorskip("torch")

from tessera.backends.interp.interpreter import run_program  # noqa: E402
from tessera.kernels_lib import attention_decode  # noqa: E402
from tessera.kernels_lib.attention_split_kv import attention_decode_kernel  # noqa: E402

from test_attention import check  # noqa: E402
from test_attention_decode import expected, paged_case  # noqa: E402

SEPARATE = "TESSERA_DECODE_SEPARATE_COMBINE"
AD = importlib.import_module("tessera.kernels_lib.attention_decode")      # the module (the package exports the op)

CASES = {   # seqlens, case options, op options
    # 16 packed rows of head dim 64: 2 splits a merge step, 4 steps, the last half past the splits; the
    # 1-token sequence's splits 1 .. 6 see no key
    "seven-splits-in-steps-of-two": ([150, 33, 1], {"Sq": 2, "H": 16, "H_kv": 2, "D": 64}, {"num_splits": 7}),
    "one-row-per-group-twelve-splits": ([190, 77], {"H": 4, "H_kv": 4}, {"num_splits": 12}),
    "lengths-0-1-and-odd": ([0, 1, 45, 77], {"Sq": 1, "H": 8, "H_kv": 2}, {"num_splits": 5}),
    "window-six-splits": ([150, 61], {"Sq": 2}, {"window": 20, "num_splits": 6}),
    "unified-max-odd-lengths": ([1, 77, 45], {"H": 8, "H_kv": 2}, {"num_splits": 5, "unified_max": 2.0}),
    "unified-max-falls-back": ([99, 3], {"Sq": 2}, {"num_splits": 4, "unified_max": -30.0}),
}


def _run(name, separate, monkeypatch):
    seqlens, case, options = CASES[name]
    tensors = paged_case(seqlens, **case, seed=len(name))
    monkeypatch.setenv(SEPARATE, "1" if separate else "0")
    return tensors, options, attention_decode(*tensors, **options)


@pytest.mark.parametrize("name", list(CASES))
def test_the_merge_in_the_launch_matches_float64_attention(name, monkeypatch):
    tensors, options, (out, lse) = _run(name, False, monkeypatch)
    window = options.get("window", -1)
    check(out, lse, *expected(*tensors, True, (window, window)))


@pytest.mark.parametrize("name", list(CASES))
def test_the_merge_in_the_launch_is_the_two_launch_paths_bit_for_bit(name, monkeypatch):
    _, _, (out, lse) = _run(name, False, monkeypatch)
    _, _, (out2, lse2) = _run(name, True, monkeypatch)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


class Recorder:
    """Stands in for a kernel: records each launch (grid, arguments, options), then runs it as `run` says."""

    def __init__(self, kernel, run=None):
        self.kernel, self.run, self.launches = kernel, run, []

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.launches.append((grid, args, options))
            if self.run is None:
                return self.kernel[grid](*args, **options)
            return self.run(grid, args, options)
        return launch


def shuffled(seed):
    """A launch of the split kernel whose programs run one at a time in a random order, not the grid's."""
    def run(grid, args, options):
        options = {k: v for k, v in options.items() if k != "num_warps"}
        arrays = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
        fn = attention_decode_kernel.specialize(*arrays, **options).module.functions[0]
        programs = list(itertools.product(*(range(n) for n in grid)))
        random.Random(seed).shuffle(programs)
        for program in programs:
            run_program(fn, arrays, program, grid)
    return run


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["seven-splits-in-steps-of-two", "unified-max-odd-lengths"])
def test_whichever_split_arrives_last_the_bits_are_the_same(name, seed, monkeypatch):
    """The grid's order makes the last split the last to arrive; here any split may be, and the merge reads
    the partials in split order all the same."""
    _, _, (out, lse) = _run(name, True, monkeypatch)
    recorder = Recorder(attention_decode_kernel, shuffled(seed))
    monkeypatch.setattr(AD, "attention_decode_kernel", recorder)
    _, _, (got, got_lse) = _run(name, False, monkeypatch)
    (grid, args, options), = recorder.launches
    assert options["COMBINE"] and grid[0] == CASES[name][2]["num_splits"]
    assert torch.equal(got, out) and torch.equal(got_lse, lse)
    assert not args[9].any()                        # the counters, back at 0


def test_the_counters_are_left_at_zero_and_reused_by_the_next_call(monkeypatch):
    """No launch clears the counters: the merging program resets its own. A second call of the same shape
    takes the same counters and is right (were one left at its count, no program of that row group would see
    splits - 1 and its rows of O would be whatever torch.empty held)."""
    monkeypatch.setattr(AD, "_COUNTERS", {})
    recorder = Recorder(attention_decode_kernel)
    monkeypatch.setattr(AD, "attention_decode_kernel", recorder)
    seqlens, case, options = CASES["lengths-0-1-and-odd"]
    for seed in (1, 2):
        tensors = paged_case(seqlens, **case, seed=seed)
        out, lse = attention_decode(*tensors, **options)
        check(out, lse, *expected(*tensors))
    (counters,) = AD._COUNTERS.values()
    assert counters.numel() == len(seqlens) * 2 and not counters.any()
    assert all(args[9] is counters for _, args, _ in recorder.launches)


@pytest.mark.parametrize("separate, splits, kernels", [
    (False, 3, ["attention_decode_kernel"]),
    (True, 3, ["attention_decode_kernel", "attention_decode_combine_kernel"]),
    (False, 1, ["attention_decode_kernel"]),
    (True, 1, ["attention_decode_kernel"]),
])
def test_the_variable_picks_the_path_and_one_split_merges_nothing(separate, splits, kernels, monkeypatch):
    monkeypatch.setattr(AD, "_COUNTERS", {})
    launched = []
    for name in ("attention_decode_kernel", "attention_decode_combine_kernel"):
        kernel = getattr(AD, name)
        monkeypatch.setattr(AD, name, Recorder(kernel, lambda grid, args, options, kernel=kernel: (
            launched.append((kernel.name, options)), kernel[grid](*args, **options))))
    monkeypatch.setenv(SEPARATE, "1" if separate else "0")
    tensors = paged_case([40, 17], Sq=2)
    out, lse = attention_decode(*tensors, num_splits=splits)
    check(out, lse, *expected(*tensors))
    assert [name for name, _ in launched] == kernels
    assert launched[0][1]["COMBINE"] == (splits > 1 and not separate)
    assert bool(AD._COUNTERS) == (splits > 1 and not separate)
