"""Q of the persistent warp-specialized attention forward comes from the producer warpgroup, and with the
overlapped order the peeled K block and the last V block too, each group behind an empty barrier of its own
(`passes/schedule/tile_operands.py`): the SIMT simulator agrees with the tile interpreter, and reports the race
or the deadlock when either side of an empty barrier is taken away."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tessera.backends.simt import run_threads  # noqa: E402
from tessera.kernels_lib.attention_fwd import LOG2E  # noqa: E402
from tessera.kernels_lib.attention_fwd_persistent import attention_fwd_persistent_kernel  # noqa: E402
from tessera.passes.schedule import tile_operands  # noqa: E402
from tessera.passes.thread_passes import lower  # noqa: E402

from attention_reference import nan_padded_kv  # noqa: E402

B, SQ, SK, H, H_KV, D, BM, BN, PROGRAMS = 2, 70, 50, 4, 2, 32, 128, 32, 3   # 8 tiles on 3 programs


def problem(causal: bool, overlap: bool = False):
    """(the kernel's arguments with O and LSE NaN-filled, its constexprs) for the small problem above."""
    q, k, v, k_rows, v_rows = nan_padded_kv(B, SQ, SK, H, H_KV, D, seed=1)
    o, lse = np.full(tuple(q.shape), np.nan, np.float16), np.full((B, H, SQ), np.nan, np.float32)
    strides = [s for x in (q, k, v) for s in x.stride()] + [s // 2 for s in o.strides]
    args = [q.numpy(), k_rows.numpy(), v_rows.numpy(), o, lse, B, SQ, SK, H, H_KV, LOG2E / math.sqrt(D), 0.0, 0, 0,
            *strides, lse.strides[0] // 4, lse.strides[1] // 4]
    options = dict(D=D, BM=BM, BN=BN, HAS_LEFT=False, HAS_RIGHT=causal, SOFTCAP=False, STAGES=2, WS=True,
                   OVERLAP=overlap)
    return args, options


def on_the_simulator(args, options):
    """O and LSE of the kernel lowered for sm_90a (8 consumer warps and the producer warpgroup) run by the SIMT
    simulator on PROGRAMS programs."""
    fn = lower(attention_fwd_persistent_kernel.specialize(*args, **options).module, "sm_90a", 8).functions[0]
    args = list(args)
    args[3], args[4] = args[3].copy(), args[4].copy()
    run_threads(fn, args, (PROGRAMS,))
    return args[3], args[4]


@pytest.mark.parametrize("causal, overlap", [(True, False), (False, False), (True, True)])
def test_the_simt_simulator_agrees_with_the_interpreter(causal, overlap):
    """Each program runs 2-3 tiles, so the producer's Q loads go round the buffer's two phases."""
    args, options = problem(causal, overlap)
    o, lse = on_the_simulator(args, options)
    interpreted = list(args)
    interpreted[3], interpreted[4] = args[3].copy(), args[4].copy()
    attention_fwd_persistent_kernel[(PROGRAMS,)](*interpreted, **options)
    assert not np.isnan(o).any() and not np.isnan(interpreted[3]).any()
    np.testing.assert_allclose(o.astype(np.float32), interpreted[3].astype(np.float32), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(lse, interpreted[4], rtol=1e-4, atol=1e-4)


def test_a_producer_that_does_not_wait_for_q_empty_races(monkeypatch):
    """Without its wait the producer writes the next tile's Q over bytes a consumer wgmma of this tile read."""
    monkeypatch.setattr(tile_operands, "await_release", lambda ctx, operands, parity: None)
    with pytest.raises(Exception, match="shared-memory race: the tma_load overwrites bytes in use"):
        on_the_simulator(*problem(True))


def test_consumers_that_do_not_release_q_deadlock_the_producer(monkeypatch):
    """Without the consumers' arrivals the producer waits for Q's empty barrier forever."""
    monkeypatch.setattr(tile_operands, "release", lambda ctx, group, in_flight=False: None)
    with pytest.raises(Exception, match=r"DEADLOCK(.|\n)*0 of 2 arrivals seen"):
        on_the_simulator(*problem(True))


def without(name, where):
    """tile_operands.<name> (`await_release` or `release`) doing nothing for the group at `where` only."""
    original = getattr(tile_operands, name)

    def patched(ctx, group, *rest, **kwargs):
        if group is not None and group.where == where:
            return None
        return original(ctx, group, *rest, **kwargs)
    return patched


def test_overlapped_order_without_the_producers_wait_for_k_lo_races(monkeypatch):
    """The overlapped order's peeled K block (HEAD) has a buffer of its own: without the producer's wait for its
    release the producer writes the next tile's K_lo while this tile's first S wgmma reads it. (The same
    mutation for the last V block, TAIL, goes unseen here: the simulator lets the consumers run at each of the
    producer's arrivals, its expect_tx included, so they finish the tile's last P V before the producer's next
    V load; `test_attention_persistent.py` checks that the wait is there.)"""
    monkeypatch.setattr(tile_operands, "await_release", without("await_release", tile_operands.HEAD))
    with pytest.raises(Exception, match="shared-memory race"):
        on_the_simulator(*problem(True, overlap=True))


@pytest.mark.parametrize("where", [tile_operands.HEAD, tile_operands.TAIL])
def test_overlapped_order_without_the_consumers_release_of_k_lo_or_v_last_deadlocks(where, monkeypatch):
    """Without the consumers' arrivals on the peeled K's (HEAD) or the last V's (TAIL) empty barrier the producer
    waits for it forever."""
    monkeypatch.setattr(tile_operands, "release", without("release", where))
    with pytest.raises(Exception, match=r"DEADLOCK(.|\n)*0 of 2 arrivals seen"):
        on_the_simulator(*problem(True, overlap=True))
