"""A hand-written thread-IR kernel around thread-block clusters, shared by the simulator and ptxas tests.

`multicast_copy(...)`: clusters of 2 blocks along x. Each block's thread 0
initializes two mbarriers (`full`: one arrival plus the box's bytes;
`empty`: one arrival per block of the cluster) and fences them; a cluster
barrier publishes the inits cluster-wide. Thread 0 of each block announces
the whole 64 x 64 box on its own `full`, then issues the half of it (32 rows)
its cluster rank owns, multicast to both blocks (mask 3), so each block's
`full` completes only when its peer's half has landed too. Every thread
waits on `full` and copies the box to out[2 * cluster id + rank], its block. Then thread 0 arrives on
`empty` in both blocks (mapa + remote arrive) and waits for its own `empty`
to see both arrivals; a final cluster barrier keeps either block from
exiting while its peer may still arrive on its mbarriers. Pieces can be left
out to build the broken kernels the tests expect to be reported.
"""

HALF_ROWS, BOX_COLS = 32, 64
THREADS = 128


def multicast_copy(*, start_barrier=True, end_barrier=True, wait_empty=True, peer_half=True, empty_count=2,
                   mask=3, cluster=(2, 1, 1)) -> str:
    dims = ", ".join(map(str, cluster))
    load = f"tma_load %dst, %tm, %row, %col, %full {{multicast = {mask}}}\n"
    issue = ("    " + load if peer_half else
             "    %mine = cmp %rank, %c0 {pred = \"eq\"} : bool\n"
             "    if %mine {\n      " + load + "      yield\n    } {\n      yield\n    }\n")
    arrive = "    mbarrier_arrive_cluster %empty, %c0\n    mbarrier_arrive_cluster %empty, %c1\n"
    return (
        f"func @multicast_copy(%tm: tensormap, %out: ptr<bf16>, %row0: i32, %col: i32) attributes "
        f"{{num_threads = {THREADS}, shared_bytes = 8208, cluster_dims = [{dims}]}} {{\n"
        "  %tid = thread_id : i32\n"
        "  %c0 = constant {value = 0} : i32\n"
        "  %c1 = constant {value = 1} : i32\n"
        "  %c2 = constant {value = 2} : i32\n"
        "  %c32 = constant {value = 32} : i32\n"
        "  %c2048 = constant {value = 2048} : i32\n"
        "  %c4096 = constant {value = 4096} : i32\n"
        "  %box_bytes = constant {value = 8192} : i32\n"
        "  %leader = cmp %tid, %c0 {pred = \"eq\"} : bool\n"
        "  %rank = cluster_rank : i32\n"
        "  %cid = cluster_id {axis = 0} : i32\n"
        "  %tile = shared_alloc {bytes = 8192, offset = 0} : ptr<bf16, shared>\n"
        "  %full = shared_alloc {bytes = 8, offset = 8192} : ptr<i64, shared>\n"
        "  %empty = shared_alloc {bytes = 8, offset = 8200} : ptr<i64, shared>\n"
        "  if %leader {\n"
        "    mbarrier_init %full, %c1\n"
        f"    mbarrier_init %empty, %c{empty_count}\n"
        "    fence_mbarrier_init\n"
        "    yield\n"
        "  } {\n    yield\n  }\n"
        + ("  cluster_arrive\n  cluster_wait\n" if start_barrier else "  barrier\n") +
        "  %half = mul %rank, %c32 : i32\n"
        "  %row = add %row0, %half : i32\n"
        "  %doff = mul %rank, %c2048 : i32\n"
        "  %dst = addptr %tile, %doff : ptr<bf16, shared>\n"
        "  if %leader {\n"
        "    mbarrier_arrive_expect_tx %full, %box_bytes\n"
        + issue +
        "    yield\n"
        "  } {\n    yield\n  }\n"
        "  mbarrier_wait %full, %c0\n"
        "  %pair = mul %cid, %c2 : i32\n"                     # block index = cluster id * 2 + rank
        "  %pid = add %pair, %rank : i32\n"
        "  %base = mul %pid, %c4096 : i32\n"
        "  %first = mul %tid, %c32 : i32\n"
        "  %last = add %first, %c32 : i32\n"
        "  for %first, %last, %c1 {\n"
        "  ^(%e: i32):\n"
        "    %src = addptr %tile, %e : ptr<bf16, shared>\n"
        "    %v = load %src : bf16\n"
        "    %oe = add %base, %e : i32\n"
        "    %o = addptr %out, %oe : ptr<bf16>\n"
        "    store %o, %v\n"
        "    yield\n"
        "  }\n"
        "  barrier\n"
        "  if %leader {\n"
        + arrive + ("    mbarrier_wait %empty, %c0\n" if wait_empty else "") +
        "    yield\n"
        "  } {\n    yield\n  }\n"
        + ("  cluster_arrive\n  cluster_wait\n" if end_barrier else "") +
        "  return\n}\n")
