"""Thread-level ops for thread-block clusters (sm_90+): where a block sits in its cluster, the cluster barrier,
and arrivals on a peer block's mbarrier.

A *cluster* is a group of blocks (CTAs) launched together on neighbouring SMs
(`fn.attrs["cluster_dims"]`, e.g. (2, 1, 1): blocks 2c and 2c + 1 along x form
cluster c). Its blocks may read and write each other's shared memory
(`shared::cluster` addresses), so one TMA load can land in several of them
(`tma_load {multicast = mask}`: the box is written at the same shared offset
in every block whose bit is set, and its bytes complete the mbarrier at the
same offset in each of them).

Ordering rules the ops encode (PTX ISA, "Cluster", "mbarrier"):

* a peer may touch a block's mbarriers (multicast copies, remote arrivals) only
  after their init is visible cluster-wide: `fence_mbarrier_init` by the
  initializing thread, then `cluster_arrive` + `cluster_wait` by every thread;
* a block must not exit while a peer may still write into it (multicast) or
  arrive on its mbarriers: a final `cluster_arrive` + `cluster_wait`.

`cluster_arrive` / `cluster_wait` are `.aligned`: every thread of the block
executes them, none in divergent code. Registered into `ops.OPS` like
`thread_ops`.
"""

from __future__ import annotations

from . import dtypes as dt
from .ops import SYNCHRONIZES, define, require
from .thread_ops import define_thread_op
from .types import PointerType, ScalarType

MAX_CLUSTER_SIZE = 16           # sm_90: 8 portable, 16 with cudaFuncAttributeNonPortableClusterSizeAllowed
_I32 = ScalarType(dt.i32)
_MBARRIER = PointerType(dt.i64, "shared")


def _infer_cluster_id(ts, a):
    require(a["axis"] in (0, 1, 2), f"cluster_id axis must be 0, 1 or 2, got {a['axis']}")
    return [_I32]


def _infer_arrive_cluster(ts, a):
    bar, cta = ts
    require(bar == _MBARRIER, f"mbarrier_arrive_cluster takes an mbarrier, a {_MBARRIER}, got {bar}")
    require(cta == _I32, f"mbarrier_arrive_cluster's block rank must be i32, got {cta}")
    return []


# (tile-level too: `tessera.cluster_rank()` / `tessera.cluster_id(axis)`, scalars every thread computes alike)
define("cluster_rank", "This program's rank in its cluster (%cluster_ctarank), i32: 0 .. cluster size - 1, x "
       "fastest; 0 without clusters.", 0, infer=lambda ts, a: [_I32])
define("cluster_id", "This program's cluster along grid axis `axis` (%clusterid.{x,y,z}): program_id(axis) // "
       "cluster_dims[axis], i32.", 0, attrs={"axis": "int"}, infer=_infer_cluster_id)
define_thread_op("cluster_arrive", "This thread arrives on the cluster barrier (barrier.cluster.arrive.aligned, "
                 "release): every thread of every block of the cluster executes it.", 0,
                 infer=lambda ts, a: [], pure=False, **SYNCHRONIZES)
define_thread_op("cluster_wait", "Wait until every thread of the cluster has arrived on the cluster barrier "
                 "(barrier.cluster.wait.aligned, acquire): afterwards this thread sees what they wrote before "
                 "arriving, mbarrier inits included.", 0, infer=lambda ts, a: [], pure=False, **SYNCHRONIZES)
define_thread_op("mbarrier_arrive_cluster", "This thread arrives on the mbarrier at `bar`'s shared offset in block "
                 "`cta` of the cluster, possibly its own (mapa.shared::cluster, then mbarrier.arrive.shared::cluster"
                 ".b64: release at CTA scope).", 2, infer=_infer_arrive_cluster, pure=False, **SYNCHRONIZES)
