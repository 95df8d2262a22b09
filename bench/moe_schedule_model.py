"""A CPU model of how long the one-launch MoE layer's GEMM tickets take in each ticket order, against the
multi-kernel path, from bytes and a bandwidth share: why block-by-block tickets ran at 0.3-0.8x the multi-kernel
path on an H100 (bench/results/2026-11-26-h100-run8) and what phase-ordered tickets should give.

    python bench/moe_schedule_model.py            # every model at 1, 16, 64 tokens

The model: P resident programs (1 per SM: the decode plan's 4-stage ring is 147 KB of shared memory); a tile
streams its weight bytes (gate_up: 2 BN x H, down: BN x I, bf16) and the programs streaming at a moment share
`achieved` GB/s, each at most `per_sm` GB/s; a down tile whose block's gate_up tiles are not all done spins
(streams nothing). The multi-kernel path is the same tiles with every gate_up tile before every down tile and
no waits, plus one launch boundary between them. Routing is uniform top-k (DeepSeek-V3's groups ignored).
"""

from __future__ import annotations

import argparse
import random

MODELS = {"mixtral": (4096, 14336, 8, 2), "deepseek_v3": (7168, 2048, 256, 8), "qwen3": (2048, 768, 128, 8)}
BM, BN_UP, BN_DOWN = 16, 64, 64          # plan.DECODE as H100 run 8 ran it (1 program per SM)


def blocks_in_use(tokens: int, E: int, K: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    counts = [0] * E
    for _ in range(tokens):
        for e in rng.sample(range(E), K):
            counts[e] += 1
    return sum(-(-c // BM) for c in counts)


def tickets(model: str, blocks: int, phase_order: bool) -> list[tuple[str, int, float]]:
    """(kind, block, bytes) in ticket order."""
    H, I, _, _ = MODELS[model]
    up = [("up", b, 2 * BN_UP * H * 2) for b in range(blocks) for _ in range(-(-I // BN_UP))]
    down = [("down", b, BN_DOWN * I * 2) for b in range(blocks) for _ in range(-(-H // BN_DOWN))]
    if phase_order:
        return up + down
    n_up, n_down = -(-I // BN_UP), -(-H // BN_DOWN)
    return [t for b in range(blocks) for t in up[b * n_up:(b + 1) * n_up] + down[b * n_down:(b + 1) * n_down]]


def simulate(items: list, programs: int, achieved: float, per_sm: float, n_up: int) -> float:
    """Seconds until every ticket is done (fluid processor sharing; events when a tile finishes)."""
    remaining = {}                       # program -> bytes left of its tile
    waiting = {}                         # program -> block it waits for
    done_up = [0] * (max(b for _, b, _ in items) + 1)
    queue = iter(enumerate(items))
    now = 0.0

    def take(p):
        nxt = next(queue, None)
        if nxt is None:
            return
        _, (kind, block, size) = nxt
        if kind == "down" and done_up[block] < n_up:
            waiting[p] = (block, size)
        else:
            remaining[p] = (kind, block, size)

    for p in range(programs):
        take(p)
    while remaining or waiting:
        for p, (block, size) in list(waiting.items()):
            if done_up[block] >= n_up:
                del waiting[p]
                remaining[p] = ("down", block, size)
        if not remaining:
            raise RuntimeError("every program waits: the order deadlocks")
        rate = min(per_sm, achieved / len(remaining))
        p, (kind, block, size) = min(remaining.items(), key=lambda kv: kv[1][2])
        step = size / rate
        now += step
        for q in list(remaining):
            k, b, s = remaining[q]
            remaining[q] = (k, b, s - rate * step)
        for q, (k, b, s) in list(remaining.items()):
            if s <= 1e-6:
                del remaining[q]
                if k == "up":
                    done_up[b] += 1
                take(q)
    return now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=132, help="resident programs (H100: 132 SMs x 1)")
    parser.add_argument("--achieved", type=float, default=2100.0, help="GB/s the multi-kernel GEMMs reach together")
    parser.add_argument("--per-sm", type=float, default=100.0, help="GB/s one program streams at most")
    parser.add_argument("--boundary-us", type=float, default=4.0, help="a kernel boundary in a graph (drain + fill)")
    args = parser.parse_args()
    achieved, per_sm = args.achieved * 1e9, args.per_sm * 1e9
    for model, (H, I, E, K) in MODELS.items():
        for tokens in (1, 16, 64):
            blocks = blocks_in_use(tokens, E, K)
            n_up = -(-I // BN_UP)
            multi = (simulate(tickets(model, blocks, True)[:blocks * n_up], args.programs, achieved, per_sm, n_up)
                     + simulate(tickets(model, blocks, True)[blocks * n_up:], args.programs, achieved, per_sm, 0)
                     + args.boundary_us * 1e-6)
            old = simulate(tickets(model, blocks, False), args.programs, achieved, per_sm, n_up)
            new = simulate(tickets(model, blocks, True), args.programs, achieved, per_sm, n_up)
            print(f"{model:>11} {tokens:>3} tokens ({blocks:>3} blocks, {n_up} gate_up + {-(-H // BN_DOWN)} down "
                  f"tiles each): multi-kernel GEMMs {multi * 1e3:.3f} ms; one launch block by block "
                  f"{old * 1e3:.3f} ms ({multi / old:.2f}x), phase-ordered {new * 1e3:.3f} ms ({multi / new:.2f}x)")


if __name__ == "__main__":
    main()
