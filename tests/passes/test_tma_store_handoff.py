"""TMA stores (`schedule/tma_store.py`) whose writes the kernel itself reads, or hands to another program.

Specification (PTX ISA: `cp.async.bulk.wait_group.read` waits only until the bulk groups have read their
source; without .read it waits until their writes are done and visible to the waiting thread, and the
completion implies a generic-async proxy fence):

* a store whose memory an op of the kernel may read (the same pointer argument, or one the launch did not
  find disjoint) waits with `bulk_wait_group` (the full wait) right after its commit, then a barrier, and is
  never left in flight across a loop's iterations: the block's own reads, and another program's after a
  release, see the writes;
* every release (atomic, release store) in a kernel that may store by TMA comes after thread 0's full wait and
  a barrier, so it publishes the TMA stores' writes, as it does the threads' stores (a program that acquires
  it may overwrite them);
* a store nothing in the kernel reads keeps the read-wait alone;
* the SIMT simulator agrees with the tile interpreter, and reports the race when a needed full wait is
  weakened to the read-wait or dropped (the mutations below).
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.backends.interp import InterpreterError
from tessera.backends.simt import run_threads
from tessera.ir.core import Operation
from tessera.passes.thread_passes import lower

BM, BN = 32, 32             # a 4 KiB float32 block: the smallest a TMA store takes (`TMA_STORE_MIN_BYTES`)


@tessera.kernel
def store_then_reload(x_ptr, out_ptr, y_ptr, rows, BM: tessera.constexpr, BN: tessera.constexpr):
    """out[p] = 2 x[p], then y[p] = out[p] + 1, read back from memory (no ordered op at all)."""
    p = tessera.program_id(0)
    out = tessera.view(out_ptr, (rows, BN))
    out.block((BM, BN), (p, 0)).store(tessera.view(x_ptr, (rows, BN)).block((BM, BN), (p, 0)).load() * 2.0)
    tessera.view(y_ptr, (rows, BN)).block((BM, BN), (p, 0)).store(out.block((BM, BN), (p, 0)).load() + 1.0)


@tessera.kernel
def publish_then_sum(x_ptr, parts_ptr, total_ptr, counter_ptr, rows, BM: tessera.constexpr,
                     BN: tessera.constexpr):
    """parts[p] = 2 x[p]; the last program to count itself in sums every part into total (stream K's hand-off)."""
    p, programs = tessera.program_id(0), tessera.num_programs(0)
    parts = tessera.view(parts_ptr, (rows, BN))
    parts.block((BM, BN), (p, 0)).store(tessera.view(x_ptr, (rows, BN)).block((BM, BN), (p, 0)).load() * 2.0)
    if tessera.atomic_add(counter_ptr, 1) == programs - 1:
        acc = parts.block((BM, BN), (0, 0)).load()
        for q in range(1, programs):
            acc = acc + parts.block((BM, BN), (q, 0)).load()
        tessera.view(total_ptr, (BM, BN)).block((BM, BN), (0, 0)).store(acc)


@tessera.kernel
def hand_over_then_overwrite(x_ptr, out_ptr, flag_ptr, rows, BM: tessera.constexpr, BN: tessera.constexpr):
    """Program 0 stores x[0] into out's block (nothing in the kernel reads out) and raises the flag; program 1
    waits for it and then overwrites the same block with x[1] by the threads: its write must be the last."""
    p = tessera.program_id(0)
    x = tessera.view(x_ptr, (rows, BN))
    if p == 0:
        tessera.view(out_ptr, (rows, BN)).block((BM, BN), (0, 0)).store(x.block((BM, BN), (0, 0)).load())
        tessera.atomic_add(flag_ptr, 1)
    else:
        while tessera.load(flag_ptr, sem="acquire") < 1:
            tessera.nanosleep(32)
        offsets = tessera.arange(0, BM)[:, None] * BN + tessera.arange(0, BN)[None, :]
        tessera.store(out_ptr + offsets, x.block((BM, BN), (1, 0)).load())


def lowered(kernel, args):
    return lower(kernel.specialize(*args, BM=BM, BN=BN).module, "sm_90a", 4).functions[0]


def ops(fn, name):
    return [op for op in fn.walk() if op.name == name]


def weaken_full_waits(fn):
    """The mutation: every full wait (`bulk_wait_group`) becomes the read-wait (`bulk_wait_group_read`)."""
    for old in ops(fn, "bulk_wait_group"):
        block = old.parent
        new = Operation("bulk_wait_group_read", [], [], dict(old.attrs), loc=old.loc)
        new.parent = block
        block.ops[block.ops.index(old)] = new


def drop_waits_before_releases(fn):
    """The mutation: the full wait thread 0 runs before each release is gone (the `if` holding only it)."""
    for release in ops(fn, "atomic_rmw") + ops(fn, "store_release"):
        block = release.parent
        at = block.ops.index(release)
        guard = next(op for op in reversed(block.ops[:at]) if op.name == "if")
        assert [op.name for op in guard.regions[0].ops] == ["bulk_wait_group", "yield"]
        block.ops.remove(guard)


def problem(programs, seed=0):
    rows = programs * BM
    x = np.random.default_rng(seed).standard_normal((rows, BN)).astype(np.float32)
    return x, rows


# --- a store the kernel reads back --------------------------------------------------------------------------

def reload_args(programs=2):
    x, rows = problem(programs)
    return [x, np.zeros_like(x), np.zeros_like(x), rows]


def test_a_store_read_back_waits_for_its_writes_and_the_simulator_agrees():
    args = reload_args()
    fn = lowered(store_then_reload, args)
    out_store, y_store = ops(fn, "tma_store")          # y is read by no op: its store keeps the read-wait
    (full,) = ops(fn, "bulk_wait_group")
    (read,) = ops(fn, "bulk_wait_group_read")
    assert full.attrs["pending"] == 0 and full.parent is out_store.parent and read.parent is y_store.parent
    run_threads(fn, args, (2,))
    reference = reload_args()
    store_then_reload[(2,)](*reference, BM=BM, BN=BN)
    np.testing.assert_array_equal(args[2], reference[2])
    np.testing.assert_array_equal(args[2], 2 * args[0] + 1)


def test_the_simulator_reports_a_read_back_after_only_the_read_wait():
    args = reload_args()
    fn = lowered(store_then_reload, args)
    weaken_full_waits(fn)
    with pytest.raises(InterpreterError, match=r"global-memory race: this load touches memory that the tma_store "
                                               r"at .*test_tma_store_handoff.py:\d+.* may still be writing"):
        run_threads(fn, args, (2,))


# --- a store another program reads after the hand-off -------------------------------------------------------

def sum_args(programs=3):
    x, rows = problem(programs, seed=1)
    return [x, np.zeros_like(x), np.zeros((BM, BN), np.float32), np.zeros(1, np.int32), rows]


def test_parts_read_by_the_last_program_wait_in_full_and_the_simulator_agrees():
    args = sum_args()
    fn = lowered(publish_then_sum, args)
    assert len(ops(fn, "tma_store")) == 2      # the part (read by the last program) and the total (read by none)
    assert [op.parent for op in ops(fn, "bulk_wait_group")][0] is ops(fn, "tma_store")[0].parent
    assert len(ops(fn, "bulk_wait_group_read")) == 1
    run_threads(fn, args, (3,), global_races=True)
    np.testing.assert_allclose(args[2], 2 * args[0].reshape(3, BM, BN).sum(axis=0), rtol=1e-6)


def test_the_simulator_reports_parts_published_before_their_writes_complete():
    args = sum_args()
    fn = lowered(publish_then_sum, args)
    weaken_full_waits(fn)
    with pytest.raises(InterpreterError, match=r"global-memory race: this load in block \(2, 0, 0\) touches "
                                               r"'parts_ptr' that block \(0, 0, 0\) wrote with tma_store"):
        run_threads(fn, args, (3,), global_races=True)


# --- a store nobody reads, overwritten after the hand-off --------------------------------------------------

def overwrite_args():
    x, rows = problem(2, seed=2)
    return [x, np.zeros_like(x), np.zeros(1, np.int32), rows]


def test_a_release_after_a_tma_store_waits_for_it_in_full():
    args = overwrite_args()
    fn = lowered(hand_over_then_overwrite, args)
    assert ops(fn, "tma_store") and ops(fn, "bulk_wait_group_read"), "out is read by no op: the read-wait"
    (release,) = ops(fn, "atomic_rmw")
    block = release.parent
    before = [op.name for op in block.ops[:block.ops.index(release)]]
    assert before[-2:] == ["if", "barrier"]          # thread 0's full wait, then the block's barrier
    run_threads(fn, args, (2,), global_races=True)
    np.testing.assert_array_equal(args[1][:BM], args[0][BM:])


def test_the_simulator_reports_a_release_before_the_tma_store_completes():
    args = overwrite_args()
    fn = lowered(hand_over_then_overwrite, args)
    drop_waits_before_releases(fn)
    with pytest.raises(InterpreterError, match=r"global-memory race: this store in block \(1, 0, 0\) touches "
                                               r"'out_ptr' that block \(0, 0, 0\) wrote with tma_store"):
        run_threads(fn, args, (2,), global_races=True)


def test_ptx_waits_in_full_before_the_release():
    """As compiled (ptxas when installed): the bulk store, and `cp.async.bulk.wait_group 0` without .read."""
    x, rows = problem(2)
    compiled = hand_over_then_overwrite.compile(signature="*f32:16,*f32:16,*i32:16,i32", target="sm_90a",
                                                num_warps=4, BM=BM, BN=BN)
    lines = [line.strip() for line in compiled.stages["ptx"].splitlines()]
    assert any(line.startswith("cp.async.bulk.tensor.2d.global.shared::cta") for line in lines)
    assert "cp.async.bulk.wait_group 0;" in [" ".join(line.split()) for line in lines]


@pytest.mark.gpu
def test_the_hand_offs_on_the_gpu():
    """What the next GPU session shows (sm_90): parts stored by TMA and summed by the last program, and the block
    program 1 overwrites after the flag, come out as on the CPU (every run: a late TMA write would lose)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU (TMA)")
    for _ in range(20):
        x, parts, total, counter, rows = sum_args(programs=8)
        x, parts, total, counter = (torch.from_numpy(a).cuda() for a in (x, parts, total, counter))
        publish_then_sum[(8,)](x, parts, total, counter, rows, BM=BM, BN=BN)
        torch.testing.assert_close(total, 2 * x.reshape(8, BM, BN).sum(dim=0), rtol=1e-5, atol=1e-5)
        x, out, flag, rows = (torch.from_numpy(a).cuda() if isinstance(a, np.ndarray) else a for a in overwrite_args())
        hand_over_then_overwrite[(2,)](x, out, flag, rows, BM=BM, BN=BN)
        assert torch.equal(out[:BM], x[BM:])
