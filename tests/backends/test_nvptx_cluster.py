"""Thread-block clusters -> PTX: the kernel's cluster shape becomes .explicitcluster / .reqnctapercluster, each
cluster op its instruction (multicast TMA with a CTA mask, mapa + remote arrive, barrier.cluster, the special
registers), all assembled by ptxas for sm_90a; targets or kernels without clusters are refused before LLVM."""

import re
import sys
from pathlib import Path

import pytest

from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.backends.nvptx.errors import CodegenError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "simt"))
from cluster_kernels import multicast_copy  # noqa: E402
from ir_text import kernel  # noqa: E402

HAS_PTXAS = find_ptxas() is not None


def test_multicast_copy_lowers_every_cluster_op_and_assembles_for_sm_90a():
    artifacts = compile_thread_ir(kernel(multicast_copy()), "sm_90a", assemble=HAS_PTXAS)
    ptx = artifacts.ptx
    assert re.search(r"\.explicitcluster\s+\.reqnctapercluster 2, 1, 1", ptx)
    assert re.search(r"mov.u32\s+%r\d+, %cluster_ctarank;", ptx) and re.search(r"mov.u32\s+%r\d+, %clusterid.x;", ptx)
    # the cluster barrier after the inits and before the exit
    assert ptx.count("barrier.cluster.arrive.aligned;") == 2 and ptx.count("barrier.cluster.wait.aligned;") == 2
    assert ptx.index("fence.mbarrier_init.release.cluster") < ptx.index("barrier.cluster.arrive.aligned")
    # one multicast box per block, to ranks 0 and 1 (mask 3 in a 16-bit register)
    load = re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.tile\.mbarrier::complete_tx::bytes"
                     r"\.multicast::cluster \[%rd\d+\], \[%rd\d+, \{%r\d+, %r\d+\}\], \[[^\]]+\], (%rs\d+);", ptx)
    assert load and re.search(rf"mov\.b16\s+{re.escape(load.group(1))}, 3;", ptx)
    # the remote arrivals: the peer's address by mapa, then a cluster-scope release arrive on it
    assert len(re.findall(r"mapa\.shared::cluster\.u(?:32|64)\s+%r", ptx)) == 2
    assert ptx.count("mbarrier.arrive.shared::cluster.b64 _") == 2
    if HAS_PTXAS:
        assert artifacts.cubin


def test_a_kernel_without_clusters_keeps_plain_tma_and_no_cluster_directives():
    from tma_kernels import tile_copy
    ptx = compile_thread_ir(kernel(tile_copy()), "sm_90a", assemble=False).ptx
    assert ".explicitcluster" not in ptx and ".multicast::cluster" not in ptx


def test_cluster_ops_need_a_cluster_shape():
    text = multicast_copy().replace(", cluster_dims = [2, 1, 1]", "")
    with pytest.raises(CodegenError, match="needs a cluster, but the kernel has no cluster_dims"):
        compile_thread_ir(kernel(text), "sm_90a", assemble=False)


@pytest.mark.parametrize("dims, message", [([4, 4, 2], "a cluster of 32 blocks"),
                                           ([0, 1, 1], "must be 1 to 3 positive ints")])
def test_bad_cluster_shapes_are_refused(dims, message):
    with pytest.raises(CodegenError, match=message):
        compile_thread_ir(kernel(multicast_copy(cluster=tuple(dims))), "sm_90a", assemble=False)


def test_targets_without_clusters_are_refused_before_llvm():
    with pytest.raises(CodegenError, match="sm_80 has no thread-block clusters"):
        compile_thread_ir(kernel(multicast_copy()), "sm_80", assemble=False)
