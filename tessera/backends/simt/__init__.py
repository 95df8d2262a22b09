"""The SIMT simulator: run thread IR on the CPU, every thread of a block in lockstep (numpy arrays over
threads). It may import `tessera.ir` and the tile interpreter (`tessera.backends.interp`), whose values,
errors and lane-wise semantics it shares.

    from tessera.backends.simt import run_threads
    run_threads(thread_fn, [x, y, out, n], grid=(4,))     # numpy arrays written in place, as run_function does

It proves that layouts, lowering, swizzles and pipelining compute what the
tile interpreter computes: shuffles, mma/mfma/wgmma fragments, shared memory,
cp.async, mbarriers and TMA are emulated exactly, and races, missing waits
and deadlocks are `InterpreterError`s. Files:

    simulator.py     run_threads: blocks, the walk over regions, the active mask
    thread_checks.py verify_thread_ir: what the simulator (and a backend) can run
    ops.py           the SIMT semantics table, thread ids, registers, shuffles, mma/mfma, ld/stmatrix,
                     barriers, cp.async
    control_flow.py  for / if / while under a mask of active threads
    paths.py         cooperative scheduling of divergent paths that wait for each other (warp specialization)
    memory.py        loads, stores and atomics, checked for bounds, races and vector alignment
    scopes.py        release/acquire pairs between blocks whose scopes do not hold each other
    happens_before.py  with global_races=True: blocks' global accesses not ordered after another's write
    low_bit.py       sub-byte addresses, unpack_bits / pack_bits (the low-bit pass's ops)
    shared.py        shared memory and its race detection
    lds_dma.py       AMD's async_copy (global_load_lds): a wave's lanes fill consecutive LDS chunks (M0)
    mbarrier.py      mbarriers and TMA box copies
    cluster.py       thread-block clusters: a cluster's blocks run together (multicast, remote arrivals, barrier)
    tma_store.py     TMA box stores and their bulk groups
    wgmma.py         warpgroup MMA reading shared memory through descriptors
    warp_specialization.py  setmaxnreg, elect_sync, named_barrier
    wave_schedule.py phase_barrier (s_barrier: counts waves), set_priority, sched_fence, wave_uniform
"""

from .simulator import run_threads
from .thread_checks import verify_thread_ir

__all__ = ["run_threads", "verify_thread_ir"]
