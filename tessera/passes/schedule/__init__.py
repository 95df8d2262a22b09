"""Scheduling transforms: how loops and explicit shared memory are laid out in time, beside per-op lowering.
They may import `tessera.ir` and the rest of `tessera.passes`, building on `passes/lowering/`.

Where `passes/lowering/` says what each op computes per thread, these
modules decide when data moves and who moves it: software pipelining of
`tessera.pipeline` loops (`pipeline_plan.py` plans, `software_pipeline.py`
emits, `tma_fill.py` fills ring slots by TMA, `multicast.py` shares a TMA
ring's operand across a thread-block cluster, `persistent.py` lets a
persistent kernel's tiles share one ring's mbarriers), warp specialization
(`warp_specialization.py`, whose producer also loads the blocks read only
after the loop: `tail_operands.py`; in a persistent kernel's tile loop,
`warp_specialized_tiles.py`, whose producer also loads the tile's
once-a-tile operands: `tile_operands.py`), the explicit shared buffers and their copies
(`shared_buffers.py`), the language's mbarriers (`mbarriers.py`) and block stores by TMA
(`tma_store.py`; a 16-bit accumulator written to shared memory by stmatrix: `stmatrix_store.py`);
`loops.py` picks each `for`'s schedule. They run inside the tile -> thread
lowering, registering into its op table, and build on its context
(`passes/lowering/`), which refers to them only in type annotations.
"""

# Importing the modules registers the lowerings of `for` and of the smem_* ops.
from . import loops, mbarriers, multicast, shared_buffers, tma_operand, tma_store  # noqa: F401
