"""Hand-written thread-IR kernels around TMA stores, shared by the simulator and ptxas tests.

`tile_store(...)`: every thread copies elements tid*32 .. tid*32+31 of a
64x64 bf16 tile from `inp` into shared memory (through the 128B swizzle
when asked, where a TMA store of a 128B-swizzled map reads them), fences
its writes for the async proxy, and after a block barrier thread 0 issues
one TMA store of the tile to the box at (%row, %col) of the map's tensor,
commits the bulk group and waits for its reads (`full_wait`: and then for
its writes). Pieces can be left out (or a rewrite of the tile added before
the wait) to build the broken kernels the tests expect to be reported.

`tile_store_loop(...)`: the same store in a loop of two iterations, as a
persistent kernel's tile loop lowers it (`passes/schedule/tma_store.py`):
iteration i copies tile i (elements 4096 i ..) into the one shared tile and
stores it at (%row, %col + 64 i) without waiting; the wait for the last
store's read comes before the next iteration's writes (then a barrier), and
once more after the loop. `wait` moves that wait ("before_write", "after_write")
or drops it ("none"); `barrier_after_wait` and `final_wait` drop the rest.
"""

from tma_kernels import BOX_COLS, BOX_ROWS, PROLOGUE, THREADS, _unswizzle

__all__ = ["BOX_COLS", "BOX_ROWS", "tile_store", "tile_store_loop"]


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


def tile_store(*, swizzled=False, fence=True, barrier=True, commit=True, wait=True, rewrite_before_wait=False,
               full_wait=False) -> str:
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
    if full_wait:                   # the writes complete too (what a later read or release of them needs)
        issue += "    bulk_wait_group {pending = 0}\n"
    body += f"  if %leader {{\n{issue}    yield\n  }} {{\n    yield\n  }}\n"
    return head + body + "  return\n}\n"


_WAIT = "    if %leader {\n      bulk_wait_group_read {pending = 0}\n      yield\n    } {\n      yield\n    }\n"


def tile_store_loop(*, wait="before_write", barrier_after_wait=True, final_wait=True) -> str:
    head = (f"func @tma_store_loop(%tm: tensormap, %inp: ptr<bf16>, %row: i32, %col: i32) attributes "
            f"{{num_threads = {THREADS}, shared_bytes = 8192}} {{\n")
    body = PROLOGUE + ("  %tile = shared_alloc {bytes = 8192, offset = 0} : ptr<bf16, shared>\n"
                       "  %c2 = constant {value = 2} : i32\n"
                       "  %c64 = constant {value = 64} : i32\n"
                       "  %c4096 = constant {value = 4096} : i32\n"
                       "  for %c0, %c2, %c1 {\n"
                       "  ^(%i: i32):\n")
    waited = _WAIT + ("    barrier\n" if barrier_after_wait else "")
    if wait == "before_write":
        body += waited
    body += ("    %base = mul %i, %c4096 : i32\n"
             "    %first = mul %tid, %c32 : i32\n"
             "    %last = add %first, %c32 : i32\n"
             "    for %first, %last, %c1 {\n"
             "    ^(%e: i32):\n"
             "      %ie = add %base, %e : i32\n"
             "      %src = addptr %inp, %ie : ptr<bf16>\n"
             "      %v = load %src : bf16\n"
             "      %dst = addptr %tile, %e : ptr<bf16, shared>\n"
             "      store %dst, %v\n"
             "      yield\n"
             "    }\n")
    if wait == "after_write":
        body += waited
    body += ("    fence_proxy_async\n"
             "    barrier\n"
             "    %shift = mul %i, %c64 : i32\n"
             "    %at_col = add %col, %shift : i32\n"
             "    if %leader {\n"
             "      tma_store %tile, %tm, %row, %at_col\n"
             "      bulk_commit_group\n"
             "      yield\n"
             "    } {\n"
             "      yield\n"
             "    }\n"
             "    yield\n"
             "  }\n")
    if final_wait:
        body += _WAIT.replace("\n    ", "\n  ").replace("    if", "  if", 1) + "  barrier\n"
    return head + body + "  return\n}\n"
