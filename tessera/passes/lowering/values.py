"""What a tile-IR value becomes when lowered: registers (`Regs`), a view's parts, or a slot of a ring buffer.

Scalars stay thread-IR scalars (every thread computes the same value). A
tile is a `Regs`: the N registers (`regs<N x T>`) one thread holds and the
layout that says which element each register is. A tensor view has no op of
its own (`ViewParts`). A load that a software-pipelined loop copies ahead is
its slot of a shared-memory ring (`RingOperand`), which a tensor-core `dot`
reads without a register round trip (`passes/schedule/software_pipeline.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tessera.ir import dtypes as dt
from tessera.ir.core import Operation, Value
from tessera.ir.layouts import RegisterLayout
from tessera.ir.types import ScalarType

if TYPE_CHECKING:
    from ..schedule.pipeline_plan import PipelinedLoad

I32 = ScalarType(dt.i32)


@dataclass(frozen=True)
class Regs:
    """A lowered tile: its registers (a `regs<N x T>` value) and their layout."""

    value: Value
    layout: RegisterLayout

    @property
    def count(self) -> int:
        return self.value.type.count

    @property
    def element(self):
        return self.value.type.element


@dataclass(frozen=True)
class ViewParts:
    """A lowered tensor view: base pointer, sizes and strides as thread-IR scalars (no op of its own)."""

    base: Value
    sizes: tuple[Value, ...]
    strides: tuple[Value, ...]
    source: Operation           # the tile-IR make_view, for what the alignment analysis knows


@dataclass(frozen=True)
class RingOperand:
    """A pipelined load's block in the current iteration: elements [offset, offset + slot) of `ring`."""

    ring: Value
    offset: Value
    load: "PipelinedLoad"
    in_flight: int = 0              # wgmma groups the dot may leave in flight (`PipelinePlan.in_flight`)

    def slot(self, ctx) -> Value:
        """Pointer to the slot's first element (laid out as `load.slot_layout`)."""
        return ctx.emit("addptr", self.ring, self.offset)
