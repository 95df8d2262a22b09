"""Thread ops that schedule waves against each other: a barrier that counts waves, priorities, scheduling fences.

AMD's 8-wave ping-pong (HipKittens) runs two groups of waves one phase apart,
so that one group's matrix instructions overlap the other's memory traffic
(`passes/wave_pingpong.py` builds it). Four ops express it:

    phase_barrier {fenced = true}     every wave of the block arrives, wherever it is in the program
    set_priority {level = 1}          this wave's issue priority, 0 (lowest) .. 3
    sched_fence                       no instruction moves across it when the backend schedules
    %g = wave_uniform %x : i32        %x, which the program guarantees is the same in every lane of a wave

`phase_barrier` is AMD's `s_barrier`: the hardware counts waves arriving,
not program points, so a group that executed one extra barrier up front
meets the other group one phase later at every barrier after it. `fenced`
orders shared-memory accesses around it as `barrier` does (a workgroup
release fence before, an acquire fence after); without it only execution.
`set_priority` is `s_setprio` (the arbiter prefers the higher wave when two
may issue), `sched_fence` `llvm.amdgcn.sched.barrier(0)`, `wave_uniform`
`llvm.amdgcn.readfirstlane` (a branch on it is a scalar branch, which a
barrier inside needs). The SIMT semantics are `backends/simt/wave_schedule.py`,
which checks what the GPU cannot: every wave reaches the same number of
phase barriers, and a `wave_uniform` value is uniform.
"""

from __future__ import annotations

from . import dtypes as dt
from .ops import SYNCHRONIZES, require
from .thread_ops import define_thread_op
from .types import ScalarType

PRIORITY_LEVELS = range(0, 4)      # s_setprio's immediate: 0..3


def _infer_set_priority(ts, a):
    require(a["level"] in PRIORITY_LEVELS, f"set_priority level is 0..3 (s_setprio), got {a['level']}")
    return []


def _infer_wave_uniform(ts, a):
    require(ts[0] == ScalarType(dt.i32), f"wave_uniform takes an i32 scalar (readfirstlane), got {ts[0]}")
    return [ts[0]]


define_thread_op("phase_barrier", "Wait until every wave of the block has arrived at a phase_barrier, each wherever "
                 "it is in the program (s_barrier counts waves, not program points: two groups staggered by one "
                 "barrier meet one phase apart). `fenced`: shared-memory accesses before it are ordered before "
                 "those after it, as around `barrier`; otherwise only execution is.", 0,
                 optional_attrs={"fenced": "bool"}, infer=lambda ts, a: [], pure=False, **SYNCHRONIZES)
define_thread_op("set_priority", "This wave's instruction-issue priority from here on, `level` 0 (the default) .. 3 "
                 "(s_setprio): raised around a cluster of matrix instructions so they issue ahead of another "
                 "wave's memory instructions.", 0, attrs={"level": "int"}, infer=_infer_set_priority, pure=False)
define_thread_op("sched_fence", "The backend's instruction scheduler moves nothing across this point "
                 "(llvm.amdgcn.sched.barrier(0)); no effect on what the program computes.", 0,
                 infer=lambda ts, a: [], pure=False)
define_thread_op("wave_uniform", "The operand, which must be the same in every active lane of a wave, as a value "
                 "the backend knows is uniform (readfirstlane): a branch on it is taken by whole waves.", 1,
                 infer=_infer_wave_uniform)
