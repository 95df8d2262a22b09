"""`ThreadGroups`: which threads run the rest of the kernel, and so what "every thread waits" means.

Normally every thread of the block runs to the end, and a barrier is
`barrier` (bar.sync 0). A warp-specialized loop (`schedule/warp_specialization.py`)
splits the block: its producer warpgroup exits after the loop, and the rest
of the kernel runs in the consumers' branch of an `if`, so every later
barrier is a named barrier of the consumer threads only (a CTA-wide one would
never complete), and the kernel's `return` closes that branch first.
"""

from __future__ import annotations

from .emitter import Emitter

CONSUMER_BARRIER_ID = 1        # the named barrier of a warp-specialized kernel's consumers (0 is bar.sync 0)


class ThreadGroups:
    """The threads still running; `consumers` is None until a warp-specialized loop leaves only its consumers."""

    def __init__(self, out: Emitter):
        self.out = out
        self.consumers: int | None = None

    def keep_only_consumers(self, consumers: int) -> None:
        """From here on only threads 0 .. consumers-1 run (the insertion point is in their branch)."""
        self.consumers = consumers

    def barrier(self) -> None:
        """Every running thread waits: the block, or after a warp-specialized loop its consumer threads."""
        if self.consumers is None:
            self.out.create("barrier")
        else:
            self.out.create("named_barrier", attrs={"id": CONSUMER_BARRIER_ID, "count": self.consumers})

    def end_kernel(self) -> None:
        """At the kernel's `return`: close the consumers' branch, so the `return` follows the `if` in the body."""
        if self.consumers is not None:
            self.out.create("yield")
            self.out.b.block = self.out.fn.body
