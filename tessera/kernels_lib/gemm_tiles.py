"""Which tiles of C a GEMM program computes, and in what order: shared by the plain GEMM (`gemm.py`) and the
fused one (`gemm_fused.py`), so both walk tiles, clusters and cluster-tiles the same way.

`grouped_tile` numbers tiles GROUP_M rows at a time (L2 reuse); `cluster_tile`
gives the programs of a thread-block cluster tiles that share a block of B
(CLUSTER_M) or of A (CLUSTER_N); `for_each_tile` runs a kernel's one-tile
function on each tile the program owns: one tile, every num_programs-th tile
(PERSISTENT), or its member tile of every num_clusters-th cluster-tile
(PERSISTENT with clusters).
"""

from __future__ import annotations

import tessera


@tessera.func
def grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M):
    """Tile number -> (pid_m, pid_n), walking GROUP_M rows of tiles at a time, column by column."""
    group = GROUP_M * num_pid_n                       # tiles per group of GROUP_M rows
    first_m = (tile // group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)        # the last group may have fewer rows
    pid_m = first_m + (tile % group) % size_m
    pid_n = (tile % group) // size_m
    return pid_m, pid_n


@tessera.func
def cluster_tile(program, num_pid_m, num_pid_n, GROUP_M, CLUSTER_M, CLUSTER_N):
    """Program -> (pid_m, pid_n) when CLUSTER_M (or CLUSTER_N) programs in a row form a cluster
    (`tessera.cluster_dims`): the cluster takes a CLUSTER_M x 1 column (1 x CLUSTER_N row) of tiles in grouped
    order, rows (columns) of tiles rounded up to a whole number of clusters, its programs one tile each, so they
    share pid_n and with it every block of B (pid_m: every block of A). A tile past the last loads zeros and
    stores nothing, but still issues its share of the shared operand for its peers."""
    if CLUSTER_M * CLUSTER_N == 1:
        return grouped_tile(program, num_pid_m, num_pid_n, GROUP_M)
    tessera.static_assert(CLUSTER_M == 1 or CLUSTER_N == 1, "a cluster shares B (CLUSTER_M) or A (CLUSTER_N), "
                          "not both")
    if CLUSTER_M > 1:
        tessera.static_assert(GROUP_M % CLUSTER_M == 0, "GROUP_M must be a multiple of CLUSTER_M")
        pid_mc, pid_n = grouped_tile(program // CLUSTER_M, tessera.cdiv(num_pid_m, CLUSTER_M), num_pid_n,
                                     GROUP_M // CLUSTER_M)
        return pid_mc * CLUSTER_M + program % CLUSTER_M, pid_n
    pid_m, pid_nc = grouped_tile(program // CLUSTER_N, num_pid_m, tessera.cdiv(num_pid_n, CLUSTER_N), GROUP_M)
    return pid_m, pid_nc * CLUSTER_N + program % CLUSTER_N


@tessera.func
def for_each_tile(TILE, args, num_pid_m, num_pid_n, GROUP_M, PERSISTENT, CLUSTER_M, CLUSTER_N):
    """TILE(pid_m, pid_n, *args) for each tile of the num_pid_m x num_pid_n grid this program computes.

    Not persistent: the program's one tile (`cluster_tile`). PERSISTENT: every num_programs-th tile in grouped
    order. PERSISTENT with clusters: one cluster per CLUSTER_M * CLUSTER_N SMs, each taking every
    (num_programs / cluster size)-th cluster-tile, its programs their member tiles of it (`cluster_tile`'s
    numbering). The programs of a cluster run the same cluster-tiles, so their multicast fills stay in
    lockstep; a member tile past C loads zeros, stores nothing, and still issues its share of the shared
    operand for its peer. (The unclustered persistent walk stays a loop of its own rather than a cluster of
    one: folding it in changes sm_90a code.)"""
    if PERSISTENT and CLUSTER_M * CLUSTER_N > 1:
        CLUSTER = CLUSTER_M * CLUSTER_N
        cluster_tiles = tessera.cdiv(num_pid_m, CLUSTER_M) * tessera.cdiv(num_pid_n, CLUSTER_N)
        for ct in range(tessera.program_id(0) // CLUSTER, cluster_tiles, tessera.num_programs(0) // CLUSTER):
            pid_m, pid_n = cluster_tile(ct * CLUSTER + tessera.program_id(0) % CLUSTER, num_pid_m, num_pid_n,
                                        GROUP_M, CLUSTER_M, CLUSTER_N)
            TILE(pid_m, pid_n, *args)
    elif PERSISTENT:    # one program per SM, each taking every num_programs-th tile
        for tile in range(tessera.program_id(0), num_pid_m * num_pid_n, tessera.num_programs(0)):
            pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
            TILE(pid_m, pid_n, *args)
    else:               # one program per tile
        pid_m, pid_n = cluster_tile(tessera.program_id(0), num_pid_m, num_pid_n, GROUP_M, CLUSTER_M, CLUSTER_N)
        TILE(pid_m, pid_n, *args)
