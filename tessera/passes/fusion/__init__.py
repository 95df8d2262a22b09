"""Fusion across kernel launches, on tile IR; it may import `tessera.ir` and the rest of `tessera.passes`.

`fuse_launches(launches)` -> the launches to run instead, and why.

Input: the tile IR of kernels launched one after another (`Launch`: the
function, its grid, and for each parameter the name of the buffer or scalar
it receives), plus which buffers are still needed afterwards. Vertical
fusion (`vertical.py`) merges a consumer into the launch before it when it
proves from the IR that the consumer reads exactly the tiles the producer
wrote, under the same program-id mapping and grid, forwarding the values and
dropping the producer's store when nothing else needs it; or (`lanes.py`)
when the consumer is a lane map over a buffer the producer writes whole,
re-indexing it onto the producer's tile. Horizontal fusion (`horizontal.py`)
merges adjacent independent launches into one whose program ids are
partitioned between them. Every refusal keeps its reason. Built on the op
traits (`ir/ops.py`).
"""

from .launches import Launch, launches_from_module, module_from_launches
from .plan import Decision, FusionPlan, fuse_launches

__all__ = ["Decision", "FusionPlan", "Launch", "fuse_launches", "launches_from_module", "module_from_launches"]
