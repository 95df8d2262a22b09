"""The one rule AMD's direct-to-LDS copies add to `async_copy`: a wave's lanes fill consecutive LDS chunks.

On gfx942/gfx950 `async_copy` is `global_load_lds` (`backends/amdgpu/lds_dma.py`), whose LDS address is
not per lane: M0 holds one base for the wave and lane i writes `bytes` at base + i * bytes. A kernel for
such a target (its `target` attribute names a gfx9 GPU) whose lanes ask for other addresses would write
elsewhere on the GPU than here, so the simulator refuses it at the op, naming the first lane that differs.
"""

from __future__ import annotations

import numpy as np

LDS_DMA_TARGETS = ("gfx942", "gfx950")


def check_lanes(ctx, op, threads: np.ndarray, dst_bytes: np.ndarray, size: int) -> None:
    """Raise when the active `threads` of a wave do not copy to wave base + lane * `size` (AMD targets)."""
    if str(ctx.fn.attrs.get("target", "")) not in LDS_DMA_TARGETS:
        return
    warp = ctx.warp_size
    lanes = threads % warp
    bases = dst_bytes - lanes * size
    for wave in np.unique(threads // warp):
        here = threads // warp == wave
        wrong = bases[here] != bases[here][0]
        if wrong.any():
            i = int(np.argmax(wrong))
            lane0, lane = int(lanes[here][0]), int(lanes[here][i])
            raise ctx.error(op, f"async_copy on {ctx.fn.attrs['target']} is a direct-to-LDS load, whose lanes "
                                f"write consecutive {size}-byte chunks from one wave base (M0): lane {lane0} of "
                                f"wave {int(wave)} writes LDS byte {int(dst_bytes[here][0])}, so lane {lane} "
                                f"must write byte {int(bases[here][0]) + lane * size}, not "
                                f"{int(dst_bytes[here][i])}; copy in a layout whose lanes own consecutive chunks")
