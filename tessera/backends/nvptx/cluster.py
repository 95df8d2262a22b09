"""Thread-block cluster ops -> LLVM NVVM intrinsics (sm_90+; see `tessera/ir/cluster_ops.py`).

| op / attribute                 | PTX                                                                       |
| ------------------------------ | ------------------------------------------------------------------------- |
| fn.attrs["cluster_dims"]       | .explicitcluster, .reqnctapercluster X, Y, Z (`"nvvm.cluster_dim"`)       |
| cluster_rank                   | mov.u32 r, %cluster_ctarank                                               |
| cluster_id {axis}              | mov.u32 r, %clusterid.{x,y,z}                                             |
| cluster_arrive                 | barrier.cluster.arrive.aligned                                            |
| cluster_wait                   | barrier.cluster.wait.aligned                                              |
| mbarrier_arrive_cluster        | mapa.shared::cluster r, bar, cta; mbarrier.arrive.shared::cluster.b64 _, [r], 1 |
| tma_load {multicast = m}       | cp.async.bulk.tensor ... .multicast::cluster [dst], [map, {..}], [bar], m |

The remote arrive has PTX's default semantics, release at CTA scope, as
CUTLASS's `ClusterBarrier::arrive(cta_id)`: what it publishes is that this
block's reads of a ring slot are over (its wgmma groups retired, its threads
past a barrier), which the peer's TMA then overwrites. `.release.cluster`
would make ptxas put MEMBAR.ALL.GPU before every arrival, in the K loop.

`.reqnctapercluster` fixes the cluster shape at compile time, so a launch
must pass the same dims (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: the runtime's
`cluster_launch.py`). The ops need the target feature "cluster"
(`REQUIRED_FEATURES`), checked before LLVM like the TMA ops.
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir.core import Function

from ..llvm.types import I32
from .codegen_table import codegen_for

_AXES = "xyz"
REQUIRED_FEATURES = {name: ("cluster", "thread-block clusters (sm_90+)") for name in (
    "cluster_rank", "cluster_id", "cluster_arrive", "cluster_wait", "mbarrier_arrive_cluster")}


def cluster_dims(fn: Function) -> tuple[int, int, int] | None:
    """The kernel's cluster shape (x, y, z), or None when it is launched without clusters (or with 1 x 1 x 1)."""
    dims = fn.attrs.get("cluster_dims")
    if not dims:
        return None
    dims = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    return None if dims == (1, 1, 1) else dims


def cluster_attribute(fn: Function) -> str | None:
    """The LLVM function attribute that makes NVPTX emit `.explicitcluster` and `.reqnctapercluster`."""
    dims = cluster_dims(fn)
    return None if dims is None else f'"nvvm.cluster_dim"="{dims[0]},{dims[1]},{dims[2]}"'


@codegen_for("cluster_rank")
def _rank(lw, op):
    return lw.intrinsic("llvm.nvvm.read.ptx.sreg.cluster.ctarank", [])


@codegen_for("cluster_id")
def _cluster_id(lw, op):
    return lw.intrinsic(f"llvm.nvvm.read.ptx.sreg.clusterid.{_AXES[op.attrs['axis']]}", [])


@codegen_for("cluster_arrive")
def _arrive(lw, op):
    lw.intrinsic("llvm.nvvm.barrier.cluster.arrive.aligned", [])


@codegen_for("cluster_wait")
def _wait(lw, op):
    lw.intrinsic("llvm.nvvm.barrier.cluster.wait.aligned", [])


@codegen_for("mbarrier_arrive_cluster")
def _arrive_remote(lw, op, bar, cta):
    remote = lw.intrinsic("llvm.nvvm.mapa.shared.cluster", [bar, cta])
    lw.intrinsic("llvm.nvvm.mbarrier.arrive.scope.cta.space.cluster", [remote, ir.Constant(I32, 1)])
