"""The fusion driver: which launches to fuse, in what order, and the record of every decision.

`fuse_launches(launches, live_out, aliased)` walks the launches in order.
Each is tried vertically against the launch built so far (`vertical.py`:
matching tiles; `lanes.py`: a lane map re-indexed onto the producer's
tile); a fused producer's store of an intermediate is dropped when no later
launch touches the buffer and it is not in `live_out`. Then adjacent
launches that touch disjoint buffers are merged horizontally
(`horizontal.py`). Each attempt, made or refused, is a `Decision`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from tessera.ir.core import Module
from tessera.ir.verifier import verify_function

from ..cse import CSE
from ..dce import DCE
from ..rewrite import clone_function
from ..tile_passes import default_tile_passes

from . import horizontal, lanes, vertical
from .launches import Launch
from .merge import Refused


@dataclass(frozen=True)
class Decision:
    kind: str                     # "vertical", "lane map" or "horizontal"
    kernels: tuple[str, ...]      # the launches considered, by kernel name (fused ones joined by "+")
    fused: bool
    reason: str = ""              # why not (refused), or what was dropped (fused)

    def __str__(self) -> str:
        names = " -> ".join(self.kernels) if self.kind != "horizontal" else " | ".join(self.kernels)
        verdict = "fused" if self.fused else "not fused"
        return f"{self.kind} {names}: {verdict}" + (f" ({self.reason})" if self.reason else "")


@dataclass
class FusionPlan:
    launches: list[Launch]
    decisions: list[Decision] = field(default_factory=list)

    def report(self) -> str:
        return "\n".join(str(d) for d in self.decisions)


def fuse_launches(launches: Sequence[Launch], live_out: frozenset[str] = frozenset(),
                  aliased: frozenset[str] = frozenset(), horizontal_fusion: bool = True) -> FusionPlan:
    """The launches to run instead of `launches` (same effect on the buffers in `live_out` and on every buffer
    not written only as an intermediate), and every decision taken."""
    plan = FusionPlan([])
    launches = [replace(cleaned(launch), origin=launch.origin or (i,)) for i, launch in enumerate(launches)]
    for index, launch in enumerate(launches):
        if not plan.launches:
            plan.launches.append(launch)
            continue
        later = set().union(*(l.buffers() for l in launches[index + 1:])) | set(live_out)
        fused = _vertical(plan, plan.launches[-1], launch, later, aliased)
        if fused is not None:
            plan.launches[-1] = fused
        else:
            plan.launches.append(launch)
    if horizontal_fusion:
        plan.launches = horizontal.merge_adjacent(plan.launches, aliased, plan.decisions.append, Decision)
    for launch in plan.launches:
        if len(launch.sources) > 1:
            tidy(launch.fn)
        verify_function(launch.fn)
    return plan


def cleaned(launch: Launch) -> Launch:
    """A copy of the launch with its function canonicalized, CSE'd and DCE'd: one value per computation, so
    that the proofs compare values, not the frontend's duplicates (the caller's IR is left alone)."""
    module = Module([clone_function(launch.fn)])
    for p in default_tile_passes():
        p.run(module)
    return replace(launch, fn=module.functions[0])


def tidy(fn) -> None:
    """CSE and DCE on a fused function: the twins its parts computed alike (program ids, indices, masks)
    become one (folding is left to the compile that follows)."""
    module = Module([fn])
    for p in (CSE(), DCE()):
        p.run(module)


def _vertical(plan: FusionPlan, producer: Launch, consumer: Launch, later: set[str], aliased) -> Launch | None:
    names = ("+".join(producer.sources), consumer.name)
    proof = vertical.prove(producer, consumer, aliased)
    if isinstance(proof, vertical.Proof):
        drop = frozenset(b for b in proof.stores if b not in later)
        try:
            fused = vertical.fuse(producer, consumer, proof, drop)
        except Refused as exc:
            plan.decisions.append(Decision("vertical", names, False, str(exc)))
            return None
        what = f"forwarded {', '.join(sorted(proof.stores))}" + (f"; dropped the store of {', '.join(sorted(drop))}"
                                                              if drop else "")
        plan.decisions.append(Decision("vertical", names, True, what))
        return fused
    by_lanes = lanes.absorb(producer, consumer, later, aliased)
    if isinstance(by_lanes, Launch):
        plan.decisions.append(Decision("lane map", names, True,
                                       f"{consumer.name} re-indexed onto {producer.name}'s output tile"))
        return by_lanes
    reason = proof if by_lanes is None else f"{proof}; as a lane map: {by_lanes}"
    plan.decisions.append(Decision("vertical", names, False, reason))
    return None
