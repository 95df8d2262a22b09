"""A hand-written thread-IR kernel around `stmatrix`, shared by the simulator and ptxas tests.

`matrices(num, trans, dtype)`: one warp; lane l loads elements 2 num l ..
2 num l + 2 num - 1 of `inp` as its registers, writes them with one stmatrix
x`num` into a (8 num) x 8 shared tile whose row r lane r addresses (matrix
j = rows 8j..8j+7), and after a barrier lane l < 8 num copies tile row l to
row l of `out` (8 num x 8, row-major).
"""

DTYPES = ("f16", "bf16")


def matrices(num: int = 4, trans: bool = False, dtype: str = "f16", misaligned: bool = False) -> str:
    regs = 2 * num
    nbytes = 8 * num * 8 * 2
    lines = [f"func @stmatrix_tile(%inp: ptr<{dtype}>, %out: ptr<{dtype}>) attributes "
             f"{{num_threads = 32, shared_bytes = {nbytes}}} {{",
             "  %tid = thread_id : i32",
             f"  %cregs = constant {{value = {regs}}} : i32",
             "  %c8 = constant {value = 8} : i32",
             f"  %cmats = constant {{value = {8 * num}}} : i32",
             f"  %tile = shared_alloc {{bytes = {nbytes}, offset = 0}} : ptr<{dtype}, shared>",
             "  %first = mul %tid, %cregs : i32"]
    for i in range(regs):
        lines += [f"  %i{i} = constant {{value = {i}}} : i32",
                  f"  %o{i} = add %first, %i{i} : i32",
                  f"  %p{i} = addptr %inp, %o{i} : ptr<{dtype}>",
                  f"  %v{i} = load %p{i} : {dtype}"]
    values = ", ".join(f"%v{i}" for i in range(regs))
    lines.append(f"  %regs = pack {values} : regs<{regs}x{dtype}>")
    # lanes past 8 num repeat the rows (x1 / x2 ignore them); a misaligned row start is 1 element in
    row = "%rowl" if not misaligned else "%rowm"
    lines += ["  %lane_row = rem %tid, %cmats : i32",
              "  %rowl = mul %lane_row, %c8 : i32",
              "  %one = constant {value = 1} : i32",
              "  %rowm = add %rowl, %one : i32",
              f"  %at = addptr %tile, {row} : ptr<{dtype}, shared>",
              f"  stmatrix %at, %regs {{num = {num}, trans = {'true' if trans else 'false'}}}",
              "  barrier",
              "  %mine = cmp %tid, %cmats {pred = \"lt\"} : bool",
              "  if %mine {"]
    for c in range(8):
        lines += [f"    %c{c} = constant {{value = {c}}} : i32",
                  f"    %s{c} = add %rowl, %c{c} : i32",
                  f"    %sp{c} = addptr %tile, %s{c} : ptr<{dtype}, shared>",
                  f"    %x{c} = load %sp{c} : {dtype}",
                  f"    %dp{c} = addptr %out, %s{c} : ptr<{dtype}>",
                  f"    store %dp{c}, %x{c}"]
    lines += ["    yield", "  } {", "    yield", "  }", "  return", "}", ""]
    return "\n".join(lines)


def expected(inp, num: int, trans: bool):
    """What stmatrix x`num` leaves in the (8 num) x 8 tile: lane l's register 2j + e at row (l // 4, 2 (l % 4)
    + e) of matrix j, or at its transpose (2 (l % 4) + e, l // 4) with .trans."""
    import numpy as np
    out = np.zeros((8 * num, 8), inp.dtype)
    regs = inp.reshape(32, 2 * num)
    for lane in range(32):
        for j in range(num):
            for e in range(2):
                r, c = (2 * (lane % 4) + e, lane // 4) if trans else (lane // 4, 2 * (lane % 4) + e)
                out[8 * j + r, c] = regs[lane, 2 * j + e]
    return out
