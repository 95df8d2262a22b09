"""A warp-specialized Hopper GEMM in thread IR: c = a @ bt.T for an M x K `a` and N x K `bt` (bf16, K-major), c f32.

One block computes a 128 x BN tile of c with 3 warpgroups (384 threads) around an S-stage ring in shared
memory. Stage s holds the 128 x 64 box of `a` and the BN x 64 box of `bt` for one 64-wide step of K, both
written by TMA in the 128-byte-swizzled K-major layout wgmma reads (`WgmmaSmemLayout(rows, 64, 2, 128)`), and
has two mbarriers: full[s] (1 arrival: the producer's arrive_expect_tx, plus the boxes' bytes) and empty[s]
(256 arrivals: every consumer thread).

    producer, warpgroup 0     setmaxnreg dec 40; one elected thread, for each K step kk (stage s = kk % S):
                              from the second use of s on, wait empty[s] for the consumers' release of the
                              previous use (parity (kk // S - 1) & 1); arrive_expect_tx(full[s], stage bytes);
                              tma_load both boxes into stage s, counted on full[s]
    consumers, warpgroups 1-2 setmaxnreg inc 232; for each K step: wait full[s] (parity (kk // S) & 1); four
                              chained m64nBNk16 wgmmas over the stage, warpgroup g on rows 64(g-1).. of the a
                              box; commit, wait; arrive on empty[s]. Then store the accumulator, masked to M x N.

Boxes that reach past M, N or K are zero-filled by TMA, so any sizes work. Switches build the broken variants
the simulator must report: `empty_wait=False` (the producer refills without waiting: a race),
`producer_first_parity=0` (the producer waits on empty[s] from the first use, for parity (kk // S) & 1 as if
the consumers had already released it once: a deadlock; the correct kernel skips the first wait), and
`expect_tx=False` (full[s] never gets its arrival: a deadlock).
"""

from __future__ import annotations

from tessera.ir.wgmma_layouts import WgmmaSmemLayout

BLOCK_M, BLOCK_K, THREADS = 128, 64, 384
CONSUMER_THREADS = 256


def ws_gemm(stages: int = 2, bn: int = 64, *, empty_wait: bool = True, producer_first_parity: int | None = None,
            expect_tx: bool = True) -> str:
    a_tile, b_tile = WgmmaSmemLayout(BLOCK_M, BLOCK_K), WgmmaSmemLayout(bn, BLOCK_K)
    a_bytes, stage_bytes = a_tile.nbytes, a_tile.nbytes + b_tile.nbytes
    bars = stages * stage_bytes
    lines = [f"func @ws_gemm(%ta: tensormap, %tb: tensormap, %c: ptr<f32>, %m: i32, %n: i32, %k: i32) attributes "
             f"{{num_threads = {THREADS}, shared_bytes = {bars + 16 * stages}}} {{",
             "  %tid = thread_id : i32",
             "  %pm = program_id {axis = 0} : i32",
             "  %pn = program_id {axis = 1} : i32"]
    consts: dict[int, str] = {}

    def c(v: int) -> str:
        if v not in consts:
            consts[v] = f"%c{v}"
            lines.append(f"  %c{v} = constant {{value = {v}}} : i32")
        return consts[v]

    for v in (0, 1, 32, 64, 128, stages, stage_bytes, stage_bytes // 2, a_bytes // 2, CONSUMER_THREADS):
        c(v)
    lines += [f"  %tiles = shared_alloc {{bytes = {bars}, offset = 0}} : ptr<bf16, shared>",
              f"  %full = shared_alloc {{bytes = {8 * stages}, offset = {bars}}} : ptr<i64, shared>",
              f"  %empty = shared_alloc {{bytes = {8 * stages}, offset = {bars + 8 * stages}}} : ptr<i64, shared>",
              f"  %leader = cmp %tid, {c(0)} {{pred = \"eq\"}} : bool",
              "  if %leader {"]
    for s in range(stages):
        lines += [f"    %full{s} = addptr %full, {c(s)} : ptr<i64, shared>",
                  f"    %empty{s} = addptr %empty, {c(s)} : ptr<i64, shared>",
                  f"    mbarrier_init %full{s}, {c(1)}",
                  f"    mbarrier_init %empty{s}, {c(CONSUMER_THREADS)}"]
    lines += ["    fence_mbarrier_init", "    fence_proxy_async", "    yield", "  } {", "    yield", "  }",
              "  barrier",
              f"  %k63 = add %k, {c(63)} : i32",
              f"  %ktiles = div %k63, {c(64)} : i32",
              f"  %wg = div %tid, {c(128)} : i32",
              f"  %is_producer = cmp %wg, {c(0)} {{pred = \"eq\"}} : bool"]
    lines += ["  if %is_producer {", *_producer(stages, bn, c, empty_wait, producer_first_parity, expect_tx),
              "    yield", "  } {", *_consumers(stages, bn, c, a_tile, b_tile), "    yield", "  }",
              "  return", "}", ""]
    # constants were appended where first used; hoist them to the top so every use follows its definition
    const_lines = [line for line in lines if line.startswith("  %c") and " = constant " in line]
    body = [line for line in lines if line not in const_lines]
    return "\n".join(body[:4] + const_lines + body[4:])


def _producer(stages, bn, c, empty_wait, first_parity, expect_tx) -> list[str]:
    out = ["    setmaxnreg {action = \"dec\", count = 40}",
           "    %elected = elect_sync : bool",
           f"    %warp0 = cmp %tid, {c(32)} {{pred = \"lt\"}} : bool",
           "    %lead = and %elected, %warp0 : bool",
           "    if %lead {",
           f"      %row_a = mul %pm, {c(128)} : i32",
           f"      %row_b = mul %pn, {c(bn)} : i32",
           f"      for {c(0)}, %ktiles, {c(1)} {{",
           "      ^(%pk: i32):",
           f"        %ps = rem %pk, {c(stages)} : i32",
           f"        %puse = div %pk, {c(stages)} : i32",
           "        %pfull = addptr %full, %ps : ptr<i64, shared>",
           "        %pempty = addptr %empty, %ps : ptr<i64, shared>"]
    if first_parity is not None:     # broken: waits from the first use on
        out += [f"        %pwrong = add %puse, {c(first_parity)} : i32",
                f"        %ppar = and %pwrong, {c(1)} : i32",
                "        mbarrier_wait %pempty, %ppar"]
    elif empty_wait:
        out += [f"        %reuse = cmp %pk, {c(stages)} {{pred = \"ge\"}} : bool",
                "        if %reuse {",
                f"          %prev = sub %puse, {c(1)} : i32",
                f"          %ppar = and %prev, {c(1)} : i32",
                "          mbarrier_wait %pempty, %ppar",
                "          yield",
                "        } {",
                "          yield",
                "        }"]
    if expect_tx:
        out.append(f"        mbarrier_arrive_expect_tx %pfull, {c(_stage_bytes(bn))}")
    out += [f"        %pbase = mul %ps, {c(_stage_bytes(bn) // 2)} : i32",
            "        %pa = addptr %tiles, %pbase : ptr<bf16, shared>",
            f"        %pb = addptr %pa, {c(WgmmaSmemLayout(BLOCK_M, BLOCK_K).nbytes // 2)} : ptr<bf16, shared>",
            f"        %col = mul %pk, {c(64)} : i32",
            "        tma_load %pa, %ta, %row_a, %col, %pfull",
            "        tma_load %pb, %tb, %row_b, %col, %pfull",
            "        yield",
            "      }",
            "      yield",
            "    } {",
            "      yield",
            "    }"]
    return out


def _stage_bytes(bn: int) -> int:
    return WgmmaSmemLayout(BLOCK_M, BLOCK_K).nbytes + WgmmaSmemLayout(bn, BLOCK_K).nbytes


def _consumers(stages, bn, c, a_tile, b_tile) -> list[str]:
    acc_t = f"regs<{bn // 2}xf32>"
    out = ["    setmaxnreg {action = \"inc\", count = 232}",
           f"    %slab = sub %wg, {c(1)} : i32",
           f"    %slab_at = mul %slab, {c(64 * BLOCK_K)} : i32",
           f"    %zero = constant {{value = 0.0}} : {acc_t}",
           f"    %acc = for {c(0)}, %ktiles, {c(1)}, %zero : {acc_t} {{",
           f"    ^(%ck: i32, %running: {acc_t}):",
           f"      %cs = rem %ck, {c(stages)} : i32",
           f"      %cuse = div %ck, {c(stages)} : i32",
           f"      %cpar = and %cuse, {c(1)} : i32",
           "      %cfull = addptr %full, %cs : ptr<i64, shared>",
           "      %cempty = addptr %empty, %cs : ptr<i64, shared>",
           "      mbarrier_wait %cfull, %cpar",
           f"      %cbase = mul %cs, {c(_stage_bytes(bn) // 2)} : i32",
           "      %ca = addptr %tiles, %cbase : ptr<bf16, shared>",
           "      %cslab = addptr %ca, %slab_at : ptr<bf16, shared>",
           f"      %cb = addptr %ca, {c(a_tile.nbytes // 2)} : ptr<bf16, shared>",
           "      wgmma_fence"]
    acc = "%running"
    slab_tile = WgmmaSmemLayout(64, BLOCK_K)
    for j in range(BLOCK_K // 16):
        for name, base, tile in (("a", "%cslab", slab_tile), ("b", "%cb", b_tile)):
            desc = tile.descriptor(0, j)
            out += [f"      %{name}p{j} = addptr {base}, {c(16 * j)} : ptr<bf16, shared>",
                    f"      %{name}d{j} = wgmma_desc %{name}p{j} {{lbo = {desc.lbo}, sbo = {desc.sbo}, swizzle = 128}} "
                    ": i64"]
        out.append(f"      %d{j} = wgmma %ad{j}, %bd{j}, {acc} {{dtype = \"bf16\", k = 16, m = 64, n = {bn}}} : {acc_t}")
        acc = f"%d{j}"
    out += ["      wgmma_commit",
            "      wgmma_wait {pending = 0}",
            "      mbarrier_arrive %cempty",
            f"      yield {acc}",
            "    }"]
    # registers -> c: register i of lane l in warp w is D[16w + l/4 + 8((i/2)%2)][8(i/4) + 2(l%4) + i%2]
    out += [f"    %t = rem %tid, {c(128)} : i32",
            f"    %warp = div %t, {c(32)} : i32",
            f"    %lane = rem %t, {c(32)} : i32",
            f"    %group = div %lane, {c(4)} : i32",
            f"    %quad = rem %lane, {c(4)} : i32",
            f"    %w16 = mul %warp, {c(16)} : i32",
            f"    %tile_row = mul %pm, {c(128)} : i32",
            f"    %slab_row = mul %slab, {c(64)} : i32",
            "    %r0 = add %tile_row, %slab_row : i32",
            "    %r1 = add %r0, %w16 : i32",
            "    %row0 = add %r1, %group : i32",
            f"    %tile_col = mul %pn, {c(bn)} : i32",
            f"    %q2 = mul %quad, {c(2)} : i32",
            "    %col0 = add %tile_col, %q2 : i32"]
    for i in range(bn // 2):
        dr, dc = 8 * ((i // 2) % 2), 8 * (i // 4) + i % 2
        out += [f"    %row{i}x = add %row0, {c(dr)} : i32",
                f"    %col{i}x = add %col0, {c(dc)} : i32",
                f"    %rin{i} = cmp %row{i}x, %m {{pred = \"lt\"}} : bool",
                f"    %cin{i} = cmp %col{i}x, %n {{pred = \"lt\"}} : bool",
                f"    %in{i} = and %rin{i}, %cin{i} : bool",
                f"    %ro{i} = mul %row{i}x, %n : i32",
                f"    %o{i} = add %ro{i}, %col{i}x : i32",
                f"    %p{i} = addptr %c, %o{i} : ptr<f32>",
                f"    %v{i} = extract %acc {{index = {i}}} : f32",
                f"    store %p{i}, %v{i}, %in{i}"]
    return out
