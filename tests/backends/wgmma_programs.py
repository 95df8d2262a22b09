"""A hand-built thread-IR wgmma kernel: one warpgroup computes out = a @ bt.T for a 64 x K `a` and an N x K `bt`.

The 128 threads copy both operands, 16 bytes per thread and step, from global memory into shared memory in
the K-major 128-byte-swizzled layout (`WgmmaSmemLayout(rows, K, 2, 128)`: 16-byte chunk c of row r goes to
chunk c ^ (r % 8) of the row's 128 bytes), fence the generic-proxy writes for the async proxy, wait at a
barrier, then issue K/16 chained wgmmas whose descriptors advance 32 bytes along K, commit, wait, and store
the `wgmma_accumulator(N)` registers to `out` (64 x N f32, row-major).

Keyword switches leave out or add one step, so the simulator tests can show each rule being enforced;
`warpgroups` > 1 has every warpgroup repeat the first one's work. Needs N * K >= 1024 (whole copy steps).
"""

from __future__ import annotations

from tessera.ir.wgmma_layouts import WgmmaSmemLayout

M = 64


def wgmma_kernel(n: int, k: int = 64, *, dtype: str = "bf16", proxy_fence: bool = True, wgmma_fence: bool = True,
                 wait: bool = True, read_before_wait: bool = False, overwrite_in_flight: bool = False,
                 barrier: bool = True, store: bool = True, warpgroups: int = 1, stacked: bool = False) -> str:
    """The m64nNk(k) kernel as IR text; the switches drop or add one step of the protocol. `stacked`: the
    accumulator is a stack of two fragments (`wgmma` `offset`): the K chain runs on the lower one, then again
    on the upper one, and the upper one is stored."""
    a_tile, b_tile = WgmmaSmemLayout(M, k, 2, 128), WgmmaSmemLayout(n, k, 2, 128)
    b_base = a_tile.nbytes
    lines = [f"func @wgmma_m64n{n}k{k}(%a: ptr<{dtype}>, %bt: ptr<{dtype}>, %out: ptr<f32>) attributes "
             f"{{num_threads = {128 * warpgroups}, shared_bytes = {b_base + b_tile.nbytes}}} {{",
             "  %thread = thread_id : i32"]
    consts: dict[int, str] = {}

    def const(v: int) -> str:
        if v not in consts:
            consts[v] = f"%c{v}"
            lines.append(f"  %c{v} = constant {{value = {v}}} : i32")
        return consts[v]

    for i in range(8):
        const(i)
    # every warpgroup does the same work (and writes the same values) as the first
    lines.append(f"  %tid = rem %thread, {const(128)} : i32")
    lines += [f"  %iota = pack {', '.join(f'%c{i}' for i in range(8))} : regs<8xi32>",
              f"  %sa = shared_alloc {{bytes = {a_tile.nbytes}, offset = 0}} : ptr<{dtype}, shared>",
              f"  %sb = shared_alloc {{bytes = {b_tile.nbytes}, offset = {b_base}}} : ptr<{dtype}, shared>"]

    # -- global -> shared, swizzled: chunk j = tid + 128 q is row j // (K/8), chunk j % (K/8) of the operand
    chunks_per_row = k // 8
    for name, src, dst, rows in (("a", "%a", "%sa", M), ("b", "%bt", "%sb", n)):
        lines += [f"  %{name}g = splat {src} : regs<8xptr<{dtype}>>",
                  f"  %{name}s = splat {dst} : regs<8xptr<{dtype}, shared>>"]
        for q in range(rows * chunks_per_row // 128):
            v = f"{name}{q}"
            lines += [f"  %j_{v} = add %tid, {const(128 * q)} : i32",
                      f"  %row_{v} = div %j_{v}, {const(chunks_per_row)} : i32",
                      f"  %chunk_{v} = rem %j_{v}, {const(chunks_per_row)} : i32",
                      f"  %r8_{v} = and %row_{v}, {const(7)} : i32",
                      f"  %sw_{v} = xor %chunk_{v}, %r8_{v} : i32",
                      f"  %rowoff_{v} = mul %row_{v}, {const(64)} : i32",
                      f"  %swoff_{v} = mul %sw_{v}, {const(8)} : i32",
                      f"  %soff_{v} = add %rowoff_{v}, %swoff_{v} : i32",
                      f"  %goff_{v} = mul %j_{v}, {const(8)} : i32",
                      f"  %gsp_{v} = splat %goff_{v} : regs<8xi32>",
                      f"  %gv_{v} = add %gsp_{v}, %iota : regs<8xi32>",
                      f"  %gp_{v} = addptr %{name}g, %gv_{v} : regs<8xptr<{dtype}>>",
                      f"  %x_{v} = load %gp_{v} {{vector = 8}} : regs<8x{dtype}>",
                      f"  %ssp_{v} = splat %soff_{v} : regs<8xi32>",
                      f"  %sv_{v} = add %ssp_{v}, %iota : regs<8xi32>",
                      f"  %sp_{v} = addptr %{name}s, %sv_{v} : regs<8xptr<{dtype}, shared>>",
                      f"  store %sp_{v}, %x_{v} {{vector = 8}}"]
    if proxy_fence:
        lines.append("  fence_proxy_async")
    if barrier:
        lines.append("  barrier")

    # -- K/16 chained wgmmas; slice s starts 16 elements (32 bytes) further along each row
    if wgmma_fence:
        lines.append("  wgmma_fence")
    regs = n if stacked else n // 2
    lines.append(f"  %acc = constant {{value = 0.0}} : regs<{regs}xf32>")
    acc = "%acc"
    for s in range(k // 16):
        for name, tile in (("a", a_tile), ("b", b_tile)):
            desc = tile.descriptor(0, s)
            lines += [f"  %{name}p{s} = addptr %s{name}, {const(16 * s)} : ptr<{dtype}, shared>",
                      f"  %{name}d{s} = wgmma_desc %{name}p{s} {{lbo = {desc.lbo}, sbo = {desc.sbo}, swizzle = 128}} : i64"]
    for offset in ((0, n // 2) if stacked else (None,)):
        for s in range(k // 16):
            attr = "" if offset is None else f", offset = {offset}"
            name = f"%d{s}" if offset is None else f"%d{s}_{offset}"
            lines.append(f"  {name} = wgmma %ad{s}, %bd{s}, {acc} {{dtype = \"{dtype}\", k = 16, m = 64, "
                         f"n = {n}{attr}}} : regs<{regs}xf32>")
            acc = name
    lines.append("  wgmma_commit")
    if overwrite_in_flight:
        lines += ["  barrier", "  store %sp_a0, %x_b0 {vector = 8}"]   # a barrier does not wait for wgmma
    if read_before_wait:
        lines.append(f"  %early = extract {acc} {{index = 0}} : f32")
    if wait:
        lines.append("  wgmma_wait {pending = 0}")
    if not store:
        lines += ["  return", "}", ""]
        return "\n".join(lines)
    if stacked:         # the upper fragment, after the wait
        lines += [f"  %up{i} = extract {acc} {{index = {n // 2 + i}}} : f32" for i in range(n // 2)]
        lines.append(f"  %upper = pack {', '.join(f'%up{i}' for i in range(n // 2))} : regs<{n // 2}xf32>")
        acc = "%upper"

    # -- registers -> out: register i of lane l in warp w is D[16w + l/4 + 8((i/2)%2)][8(i/4) + 2(l%4) + i%2]
    lines += [f"  %warp = div %tid, {const(32)} : i32",
              f"  %lane = rem %tid, {const(32)} : i32",
              f"  %group = div %lane, {const(4)} : i32",
              f"  %quad = rem %lane, {const(4)} : i32",
              f"  %w16 = mul %warp, {const(16)} : i32",
              "  %row0 = add %w16, %group : i32",
              f"  %rowoff = mul %row0, {const(n)} : i32",
              f"  %col0 = mul %quad, {const(2)} : i32",
              "  %base = add %rowoff, %col0 : i32"]
    for i in range(n // 2):
        offset = 8 * ((i // 2) % 2) * n + 8 * (i // 4) + i % 2
        lines += [f"  %o{i} = add %base, {const(offset)} : i32",
                  f"  %p{i} = addptr %out, %o{i} : ptr<f32>",
                  f"  %v{i} = extract {acc} {{index = {i}}} : f32",
                  f"  store %p{i}, %v{i}"]
    lines += ["  return", "}", ""]
    return "\n".join(lines)
