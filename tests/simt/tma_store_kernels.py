"""Hand-written thread-IR kernels around TMA stores, shared by the simulator and ptxas tests.

`tile_store(...)`: every thread copies elements tid*32 .. tid*32+31 of a
64x64 bf16 tile from `inp` into shared memory (through the 128B swizzle
when asked, where a TMA store of a 128B-swizzled map reads them), fences
its writes for the async proxy, and after a block barrier thread 0 issues
one TMA store of the tile to the box at (%row, %col) of the map's tensor,
commits the bulk group and waits for its reads. Pieces can be left out (or
a rewrite of the tile added before the wait) to build the broken kernels
the tests expect to be reported.
"""

from tma_kernels import BOX_COLS, BOX_ROWS, PROLOGUE, THREADS, _unswizzle

__all__ = ["BOX_COLS", "BOX_ROWS", "tile_store"]


def _fill(swizzled: bool) -> str:
    return ("  %first = mul %tid, %c32 : i32\n"
            "  %last = add %first, %c32 : i32\n"
            "  for %first, %last, %c1 {\n"
            "  ^(%e: i32):\n"
            + _unswizzle("%e", swizzled, "") +
            "    %src = addptr %inp, %e : ptr<bf16>\n"
            "    %v = load %src : bf16\n"
            "    %dst = addptr %tile, %at : ptr<bf16, shared>\n"
            "    store %dst, %v\n"
            "    yield\n"
            "  }\n")


def tile_store(*, swizzled=False, fence=True, barrier=True, commit=True, wait=True, rewrite_before_wait=False) -> str:
    head = (f"func @tma_store_tile(%tm: tensormap, %inp: ptr<bf16>, %row: i32, %col: i32) attributes "
            f"{{num_threads = {THREADS}, shared_bytes = 8192}} {{\n")
    body = PROLOGUE + "  %tile = shared_alloc {bytes = 8192, offset = 0} : ptr<bf16, shared>\n" + _fill(swizzled)
    if fence:
        body += "  fence_proxy_async\n"
    if barrier:
        body += "  barrier\n"
    issue = "    tma_store %tile, %tm, %row, %col\n" + ("    bulk_commit_group\n" if commit else "")
    if rewrite_before_wait:
        issue += "    %zero = load %inp : bf16\n    store %tile, %zero\n"
    if wait:
        issue += "    bulk_wait_group_read {pending = 0}\n"
    body += f"  if %leader {{\n{issue}    yield\n  }} {{\n    yield\n  }}\n"
    return head + body + "  return\n}\n"
