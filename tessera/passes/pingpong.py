"""pingpong: the turn-taking barriers of each warpgroup's copy of a `pingpong` loop, once its waits are placed.

Input: thread IR in which the warp-specialized lowering gave each consumer warpgroup a copy of the key loop
marked `pingpong_turn = [mine, other]` (`schedule/warp_specialization.py`, `_pingpong_loops`), after
`defer_wgmma_wait` has placed its waits. Job: in each such body, `named_barrier {id = mine}` (wait for this
warpgroup's turn) just before its first `wgmma_fence`, and `named_barrier {id = other, arrive}` (hand the turn
on) just after the last `wgmma_commit` before its first wait: the products are issued back to back in a turn,
and the other warpgroup's are issued while this one waits and runs its softmax. Why after the waits are
placed: an arrive synchronizes, so a wait moved later would stop before it (`defer_wgmma_wait.py`), and the
depth-1 wait of FlashAttention-3's order would become a depth-0 one. Guarantee: nothing else changes; a body
without a wgmma issue is left alone.
"""

from __future__ import annotations

from tessera.ir.core import Block, Function, Operation

TURN_THREADS = 256      # both consumer warpgroups meet at each barrier: one arrives, the other waits


def insert_pingpong_barriers(fn: Function) -> int:
    """Add the barriers to every marked loop of `fn` in place (see the module docstring); returns how many."""
    loops = [op for op in fn.walk() if op.name == "for" and "pingpong_turn" in op.attrs]
    return sum(_take_turns(op) for op in loops)


def _take_turns(loop: Operation) -> int:
    body: Block = loop.regions[0]
    mine, other = loop.attrs["pingpong_turn"]
    count = TURN_THREADS
    names = [op.name for op in body.ops]
    if "wgmma_fence" not in names:
        return 0
    first_wait = names.index("wgmma_wait") if "wgmma_wait" in names else len(names)
    commits = [i for i, name in enumerate(names[:first_wait]) if name == "wgmma_commit"]
    if not commits:
        return 0
    _insert(body, commits[-1] + 1, Operation("named_barrier", [], [], {"id": other, "count": count, "arrive": True}))
    _insert(body, names.index("wgmma_fence"), Operation("named_barrier", [], [], {"id": mine, "count": count}))
    return 1


def _insert(block: Block, index: int, op: Operation) -> None:
    op.parent = block
    block.ops.insert(index, op)
