"""Thread ops for warp specialization on sm_90a: register rebalancing, electing a lane, named barriers.

A warp-specialized Hopper kernel splits its block into a *producer*
warpgroup that issues TMA copies and *consumer* warpgroups that run wgmma
on what landed (see `tests/backends/ws_gemm_programs.py`). Three ops let
the two sides live side by side:

    setmaxnreg {action = "dec", count = 40}     the producer gives registers back ...
    setmaxnreg {action = "inc", count = 232}    ... and the consumers take them (setmaxnreg.{inc,dec}.sync.aligned.u32)
    %e = elect_sync : bool                      true in one lane of each warp (elect.sync): who issues the copies
    named_barrier {id = 1, count = 256}         bar.sync 1, 256: only the consumers' 256 threads meet here

`setmaxnreg` sets the per-thread register budget of the executing warpgroup
(`count` a multiple of 8 in [24, 256]); all 128 threads of the warpgroup
execute it together, and the kernel needs a known block size (NVPTX always
emits `"nvvm.maxntid"`). `named_barrier` waits until `count` threads (whole
warps) have arrived at barrier `id` (1..15; 0 is the block-wide `barrier`).

The SIMT semantics are `backends/simt/warp_specialization.py`, the
PTX `backends/nvptx/warp_specialization.py`. Registered into `ops.OPS` like
`thread_ops`.
"""

from __future__ import annotations

from . import dtypes as dt
from .ops import SYNCHRONIZES, require
from .thread_ops import define_thread_op
from .types import ScalarType

SETMAXNREG_ACTIONS = ("inc", "dec")
SETMAXNREG_RANGE = (24, 256)
NAMED_BARRIER_IDS = range(1, 16)
MAX_BLOCK_THREADS = 1024


def _infer_setmaxnreg(ts, a):
    lo, hi = SETMAXNREG_RANGE
    require(a["action"] in SETMAXNREG_ACTIONS,
            f"setmaxnreg action is \"inc\" (take registers) or \"dec\" (give them back), got {a['action']!r}")
    require(lo <= a["count"] <= hi and a["count"] % 8 == 0,
            f"setmaxnreg count is a multiple of 8 in [{lo}, {hi}] registers per thread, got {a['count']}")
    return []


def _infer_named_barrier(ts, a):
    require(a["id"] in NAMED_BARRIER_IDS,
            f"named_barrier id is in 1..15 (barrier 0 is the block-wide `barrier`), got {a['id']}")
    require(0 < a["count"] <= MAX_BLOCK_THREADS and a["count"] % 32 == 0,
            f"named_barrier count is a number of whole warps' threads: a multiple of 32 in [32, "
            f"{MAX_BLOCK_THREADS}], got {a['count']}")
    return []


define_thread_op("setmaxnreg", "Set this warpgroup's per-thread register budget to `count` (a multiple of 8 in "
                 "[24, 256]): `action` \"dec\" releases registers, \"inc\" waits for and takes them "
                 "(setmaxnreg.{inc,dec}.sync.aligned.u32, sm_90a); all 128 threads of the warpgroup execute it "
                 "together.", 0, attrs={"action": "str", "count": "int"}, infer=_infer_setmaxnreg, pure=False)
define_thread_op("elect_sync", "True in exactly one lane of each warp (the lowest; elect.sync with the full-warp "
                 "member mask, so every lane of the warp executes it together), false in the others: the one "
                 "thread that issues a warp's TMA copies or arrivals.", 0,
                 infer=lambda ts, a: [ScalarType(dt.bool_)], pure=False)
define_thread_op("named_barrier", "Wait until `count` threads (whole warps) have arrived at barrier `id` (1..15), "
                 "ordering their shared-memory accesses (bar.sync id, count): a barrier for a subset of the "
                 "block, such as the consumer warpgroups of a warp-specialized kernel. With `arrive`, count "
                 "this thread's arrival and go on without waiting (bar.arrive id, count): the other side of a "
                 "turn one group of warps hands to another (FlashAttention-3's warpgroup ping-pong).", 0,
                 attrs={"id": "int", "count": "int"}, optional_attrs={"arrive": "bool"},
                 infer=_infer_named_barrier, pure=False, **SYNCHRONIZES)
