"""Hand-written thread-IR kernels around mbarriers and TMA loads, shared by the simulator and ptxas tests.

`tile_copy(...)`: one mbarrier, thread 0 initializes it, fences it for the
async proxy, and after a block barrier announces the box's bytes and issues
one TMA load of the box at (%row, %col); every thread waits for phase 0 and
copies the box from shared memory to `out` (rows of `cols` elements,
reading through the 128B swizzle when asked). Pieces can be left out to
build the broken kernels the tests expect to be reported.

`ring(...)`: a 2-stage ring over K boxes stacked along rows: stage s = k % 2
is refilled with box k + 2 once every thread has copied box k out, and the
wait on stage s's barrier uses parity (k // 2) & 1, flipping at each reuse.
"""

BOX_ROWS, BOX_COLS = 64, 64
THREADS = 128


def _unswizzle(element: str, swizzled: bool, n: str) -> str:
    """IR computing, into %at{n}, the shared element where element `element` of the box landed."""
    if not swizzled:
        return f"    %at{n} = add {element}, %c0 : i32\n"
    return (f"    %byte{n} = shl {element}, %c1 : i32\n"                 # 2-byte elements
            f"    %c7{n} = constant {{value = 7}} : i32\n"
            f"    %c4{n} = constant {{value = 4}} : i32\n"
            f"    %row8{n} = shr %byte{n}, %c7{n} : i32\n"
            f"    %row8m{n} = and %row8{n}, %c7{n} : i32\n"
            f"    %flip{n} = shl %row8m{n}, %c4{n} : i32\n"
            f"    %sbyte{n} = xor %byte{n}, %flip{n} : i32\n"
            f"    %at{n} = shr %sbyte{n}, %c1 : i32\n")


def _copy_out(tile: str, base: str, swizzled: bool, n: str = "") -> str:
    """Every thread copies elements tid*32 .. tid*32+31 of the 64x64 box at `tile` to out[`base` + e];
    `n` suffixes the value names, so that a function can hold several copies."""
    return (f"  %first{n} = mul %tid, %c32 : i32\n"
            f"  %last{n} = add %first{n}, %c32 : i32\n"
            f"  for %first{n}, %last{n}, %c1 {{\n"
            f"  ^(%e{n}: i32):\n"
            + _unswizzle(f"%e{n}", swizzled, n) +
            f"    %src{n} = addptr {tile}, %at{n} : ptr<bf16, shared>\n"
            f"    %v{n} = load %src{n} : bf16\n"
            f"    %oe{n} = add {base}, %e{n} : i32\n"
            f"    %dst{n} = addptr %out, %oe{n} : ptr<bf16>\n"
            f"    store %dst{n}, %v{n}\n"
            "    yield\n"
            "  }\n")


PROLOGUE = """\
  %tid = thread_id : i32
  %c0 = constant {value = 0} : i32
  %c1 = constant {value = 1} : i32
  %c32 = constant {value = 32} : i32
  %box_bytes = constant {value = 8192} : i32
  %leader = cmp %tid, %c0 {pred = "eq"} : bool
"""


def tile_copy(*, swizzled=False, init=True, fence=True, sync_after_init=True, arrive=True, expect_bytes=8192,
              wait=True, parity=0, read_before_wait=False, second_box=False) -> str:
    """`second_box`: also load the box at (%col, %row) into a second buffer on the same barrier (announce
    16384 bytes then) and copy it to out[4096:]."""
    head = (f"func @tma_tile(%tm: tensormap, %out: ptr<bf16>, %row: i32, %col: i32) attributes "
            f"{{num_threads = {THREADS}, shared_bytes = 17408}} {{\n")
    body = PROLOGUE.replace("8192", str(expect_bytes)) + (
        "  %tile = shared_alloc {bytes = 8192, offset = 0} : ptr<bf16, shared>\n"
        "  %bar = shared_alloc {bytes = 8, offset = 8192} : ptr<i64, shared>\n"
        "  %par = constant {value = %d} : i32\n".replace("%d", str(parity))
        + "  %tile2 = shared_alloc {bytes = 8192, offset = 9216} : ptr<bf16, shared>\n"
        + "  %c4096 = constant {value = 4096} : i32\n")
    setup = ("    mbarrier_init %bar, %c1\n" if init else "") + ("    fence_mbarrier_init\n" if fence else "")
    body += f"  if %leader {{\n{setup}    yield\n  }} {{\n    yield\n  }}\n"
    if sync_after_init:
        body += "  barrier\n"
    announce = "    mbarrier_arrive_expect_tx %bar, %box_bytes\n" if arrive else ""
    again = "    tma_load %tile2, %tm, %col, %row, %bar\n" if second_box else ""
    body += (f"  if %leader {{\n{announce}    tma_load %tile, %tm, %row, %col, %bar\n{again}    yield\n"
             "  } {\n    yield\n  }\n")
    copy = _copy_out("%tile", "%c0", swizzled) + (_copy_out("%tile2", "%c4096", swizzled, "_2") if second_box else "")
    if read_before_wait:
        body += copy
    if wait:
        body += "  mbarrier_wait %bar, %par\n"
    if not read_before_wait:
        body += copy
    return head + body + "  return\n}\n"


def ring(num_tiles: int, *, flip_parity=True) -> str:
    """Copy `num_tiles` 64x64 boxes (box k at rows 64k..) through a 2-stage TMA ring into `out`."""
    head = (f"func @tma_ring(%tm: tensormap, %out: ptr<bf16>) attributes "
            f"{{num_threads = {THREADS}, shared_bytes = 16400}} {{\n")
    body = PROLOGUE + (
        "  %c2 = constant {value = 2} : i32\n"
        "  %c64 = constant {value = 64} : i32\n"
        "  %c4096 = constant {value = 4096} : i32\n"
        f"  %k_end = constant {{value = {num_tiles}}} : i32\n"
        "  %tiles = shared_alloc {bytes = 16384, offset = 0} : ptr<bf16, shared>\n"
        "  %bars = shared_alloc {bytes = 16, offset = 16384} : ptr<i64, shared>\n"
        "  %bar1 = addptr %bars, %c1 : ptr<i64, shared>\n"
        "  %tile1 = addptr %tiles, %c4096 : ptr<bf16, shared>\n"
        "  if %leader {\n"
        "    mbarrier_init %bars, %c1\n"
        "    mbarrier_init %bar1, %c1\n"
        "    fence_mbarrier_init\n"
        "    mbarrier_arrive_expect_tx %bars, %box_bytes\n"
        "    tma_load %tiles, %tm, %c0, %c0, %bars\n"
        "    mbarrier_arrive_expect_tx %bar1, %box_bytes\n"
        "    tma_load %tile1, %tm, %c64, %c0, %bar1\n"
        "    yield\n"
        "  } {\n    yield\n  }\n"
        "  barrier\n"
        "  for %c0, %k_end, %c1 {\n"
        "  ^(%k: i32):\n"
        "    %s = rem %k, %c2 : i32\n"
        "    %use = div %k, %c2 : i32\n"
        + ("    %parity = and %use, %c1 : i32\n" if flip_parity else "    %parity = and %c0, %c1 : i32\n") +
        "    %bar = addptr %bars, %s : ptr<i64, shared>\n"
        "    %soff = mul %s, %c4096 : i32\n"
        "    %tile = addptr %tiles, %soff : ptr<bf16, shared>\n"
        "    mbarrier_wait %bar, %parity\n"
        "    %base = mul %k, %c4096 : i32\n"
        + _indent(_copy_out("%tile", "%base", False, "_r")) +
        "    barrier\n"
        "    %next = add %k, %c2 : i32\n"
        "    %more = cmp %next, %k_end {pred = \"lt\"} : bool\n"
        "    %refill = and %more, %leader : bool\n"
        "    if %refill {\n"
        "      %row = mul %next, %c64 : i32\n"
        "      mbarrier_arrive_expect_tx %bar, %box_bytes\n"
        "      tma_load %tile, %tm, %row, %c0, %bar\n"
        "      yield\n"
        "    } {\n      yield\n    }\n"
        "    yield\n"
        "  }\n")
    return head + body + "  return\n}\n"


def _indent(text: str) -> str:
    return "".join("  " + line + "\n" for line in text.splitlines())
