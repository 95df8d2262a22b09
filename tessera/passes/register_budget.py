"""Register budget: refuse, before any code is generated, tiles one thread cannot hold in registers.

    check_register_budget(assignment, target)     # after assign_layouts, before lower_to_threads

Every tile becomes `layout.local_size` registers per thread, and the backend unrolls every op over them.
Tiles beyond a thread's register file can only spill, and LLVM's (and ptxas's) register allocation and
spill code grow much faster than the tiles: measured on sm_90a, an f32 copy of 1,024 elements per thread
took minutes, one of 512 elements half a minute when masked, an f64 copy of 2,048 elements per thread
more than 120 s, a chain of math over three live f32 tiles of 256 elements per thread 50 s, and four
transcendental functions over one such tile 30 s (LLVM 9 s, ptxas the rest), over 128 elements per
thread still 11 s (23 s on a busy machine). So:

* each tile value (op results, loop-carried arguments, the layouts an operand is converted to) may hold
  at most `MAX_TILE_ELEMENTS` elements per thread (every element is an instruction of its own, and a
  masked access a branch) and at most `MAX_TILE_REGISTERS` 32-bit registers per thread;
* at every point of the program the data tiles live there (defined, with a use still to come; a value
  used inside a loop lives through the loop) may hold at most `MAX_LIVE_REGISTERS` per thread.

Address arithmetic (pointer tiles, and integer or bool tiles that pure ops compute from `arange`,
constants and scalars without reading memory: offsets and masks) counts against the elements but not the
registers: each register of it is a constant plus a per-thread base, which LLVM folds into the address or
recomputes where it is used. A kernel past a limit is a `LoweringError` at the op that makes the tile (or
where the live tiles peak, listing the largest), naming what a thread would hold, the limit, and how to
split the work: the number of warps that brings it under the limit, a smaller block, or a loop.
"""

from __future__ import annotations

import math

from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.ops import OPS
from tessera.ir.target import Target
from tessera.ir.types import TileType, scalar_dtype

from .errors import LoweringError
from .layout_assignment import LayoutAssignment
from .mma import mma_plan

MAX_TILE_ELEMENTS = 512     # elements per thread of one tile (f16/bf16 at MAX_TILE_REGISTERS, packed in pairs)
MAX_TILE_REGISTERS = 256    # 1 KiB per thread: all of an NVIDIA thread's 255 registers, half of an AMD one's 512
MAX_LIVE_REGISTERS = 512    # 2 KiB per thread live at once: twice an NVIDIA thread's registers, all of an AMD one's
MAX_UNROLLED_WORK = 12288   # per thread: 4 transcendental functions over 128 elements (16,384) took 11-23 s
MATH_WEIGHT = 32            # instructions per element of an op in the `math` numerics family (libdevice-sized)


def tile_registers(tile: TileType, per_thread: int) -> int:
    """The 32-bit registers `per_thread` elements of `tile` take (pointers: 64 bits each)."""
    dtype = scalar_dtype(tile)
    return math.ceil(per_thread * (64 if dtype is None else dtype.bits) / 32)


def address_arithmetic(fn: Function) -> set[Value]:
    """The tile values of `fn` that are address arithmetic: pointer tiles, and integer or bool tiles that pure
    ops without regions compute from other such tiles and scalars, without reading memory."""
    found: set[Value] = set()
    for op in fn.walk():
        opdef = OPS.get(op.name)
        computed = (opdef is not None and opdef.pure and not opdef.reads_memory and not opdef.has_regions
                    and all(v in found or not isinstance(v.type, TileType) for v in op.operands))
        for value in op.results:
            if not isinstance(value.type, TileType):
                continue
            dtype = scalar_dtype(value.type)
            if dtype is None or (computed and dtype.kind in ("int", "uint", "bool")):
                found.add(value)
    return found


def check_register_budget(assignment: LayoutAssignment, target: Target) -> None:
    """Raise LoweringError at the first tile past MAX_TILE_ELEMENTS or MAX_TILE_REGISTERS per thread, else
    where the live data tiles peak past MAX_LIVE_REGISTERS, else at the largest share of unrolled work past
    MAX_UNROLLED_WORK (see the module docstring). The advice covers every limit at once: it names the warps
    that bring the whole kernel under all of them."""
    fn = assignment.function
    addresses = address_arithmetic(fn)

    def registers(value: Value, per_thread: int) -> int:
        return 0 if value in addresses else tile_registers(value.type, per_thread)

    too_big = [(op, value, per_thread, registers(value, per_thread)) for op in fn.walk()
               for value, per_thread in _tiles_of(op, assignment)]
    held = {v: registers(v, assignment.layouts[v].local_size) for v in assignment.layouts}
    live = LiveTiles(fn, {v: r for v, r in held.items() if r})
    work = unrolled_work(assignment, target)
    total = sum(work.values())
    factor = max([math.ceil(r / MAX_TILE_REGISTERS) for *_, r in too_big]
                 + [math.ceil(n / MAX_TILE_ELEMENTS) for _, _, n, _ in too_big]
                 + [math.ceil(live.peak_registers / MAX_LIVE_REGISTERS), math.ceil(total / MAX_UNROLLED_WORK), 1])
    if factor == 1:
        return
    advice = _advice(factor, assignment, target)
    for op, value, per_thread, count in too_big:
        if count > MAX_TILE_REGISTERS or per_thread > MAX_TILE_ELEMENTS:
            raise LoweringError(_tile_message(value.type, per_thread, count, assignment, target) + advice, op,
                                fn.name)
    if live.peak_registers > MAX_LIVE_REGISTERS:
        raise LoweringError(_live_message(live, assignment, target) + advice, live.peak_op, fn.name)
    raise LoweringError(_work_message(work, assignment) + advice, max(work, key=work.get), fn.name)


def unrolled_work(assignment: LayoutAssignment, target: Target) -> dict[Operation, int]:
    """Each op's share of the work the backend unrolls per thread: its elements per thread (the most any of
    its tiles holds) times its weight: MATH_WEIGHT for transcendental functions, K for a dot on FMAs (K over
    the instruction's K on a matrix instruction), 1 for the rest. Ops in a loop body count once."""
    work = {}
    for op in assignment.function.walk():
        tiles = [v for v in [*op.results, *op.operands] if v in assignment.layouts]
        if not tiles:
            continue
        elements = max(assignment.layouts[v].local_size for v in tiles)
        work[op] = elements * _weight(op, assignment, target)
    return work


def _weight(op: Operation, assignment: LayoutAssignment, target: Target) -> int:
    opdef = OPS.get(op.name)
    if opdef is not None and opdef.numerics == "math":
        return MATH_WEIGHT
    if op.name == "dot":
        k = op.operands[0].type.shape[-1]
        plan = mma_plan(op, target, assignment.num_warps)
        return k if plan is None else max(1, k // plan.instruction.k)
    return 1


def _tiles_of(op: Operation, assignment: LayoutAssignment) -> list[tuple[Value, int]]:
    """(tile value, elements per thread) for each tile `op` makes: results, its regions' arguments, and the
    layouts its operands are converted to."""
    out = []
    values = list(op.results) + [a for region in op.regions for a in region.args]
    for value in values:
        if isinstance(value.type, TileType) and value in assignment.layouts:
            out.append((value, assignment.layouts[value].local_size))
    for index, operand in enumerate(op.operands):
        layout = assignment.conversions.get((op, index))
        if layout is not None:
            out.append((operand, layout.local_size))
    return out


class LiveTiles:
    """Where the registers of the live tiles of a function peak, in program order (ops numbered pre-order).

    A value is live after each op from the one that defines it (the end of it, for a loop's results) up to
    the op before its last use: an op's operands that die there and its results share registers, as an
    elementwise op or a dot accumulating in place does. A region argument lives through its whole region
    (a loop carries it round), and a use inside a region of an op that sits in the defining block counts at
    that op's end, so a value a loop body reads lives through the loop."""

    def __init__(self, fn: Function, registers: dict[Value, int]):
        self.position: dict[Operation, int] = {}
        self.last_nested: dict[Operation, int] = {}
        self._number(fn.body)
        self.ranges = self._ranges(fn, registers)
        self.registers = registers
        self.peak_registers, self.peak_position = self._peak()
        self.peak_op = next((op for op, i in self.position.items() if i == self.peak_position), None)

    def live_at(self, position: int) -> list[Value]:
        """The values live after the op at `position`, the largest first."""
        values = [v for v, (start, end) in self.ranges.items() if start <= position <= end]
        return sorted(values, key=lambda v: -self.registers[v])

    def _number(self, block: Block) -> None:
        for op in block.ops:
            self.position[op] = len(self.position)
            for region in op.regions:
                self._number(region)
            self.last_nested[op] = len(self.position) - 1

    def _ranges(self, fn: Function, registers: dict[Value, int]) -> dict[Value, tuple[int, int]]:
        """value -> (first, last) position after which it is live, both included."""
        ranges: dict[Value, tuple[int, int]] = {}
        for value in registers:
            owner = value.owner
            if isinstance(owner, Operation):
                ranges[value] = (self.last_nested[owner],) * 2      # a loop's results exist once it ends
            elif isinstance(owner, Block) and isinstance(owner.parent, Operation):
                ranges[value] = (self.position[owner.parent], self.last_nested[owner.parent])
        for op in fn.walk():
            for operand in op.operands:
                if operand in ranges:
                    start, end = ranges[operand]
                    ranges[operand] = (start, max(end, self._live_until(op, operand)))
        return ranges

    def _live_until(self, op: Operation, value: Value) -> int:
        """The last position after which `value` must still be live for its use by `op`: the op before `op`,
        or the end of the op enclosing `op` that sits in the block defining `value`."""
        home = value.owner.parent if isinstance(value.owner, Operation) else value.owner
        user = op
        while user.parent is not home and isinstance(user.parent, Block) and isinstance(user.parent.parent, Operation):
            user = user.parent.parent
        return self.position[op] - 1 if user is op else self.last_nested[user]

    def _peak(self) -> tuple[int, int]:
        """(the most registers live at once, the first position where that many are)."""
        change = [0] * (len(self.position) + 1)
        for value, (start, end) in self.ranges.items():
            change[start] += self.registers[value]
            change[end + 1] -= self.registers[value]
        best, where, total = 0, 0, 0
        for position, delta in enumerate(change[:-1]):
            total += delta
            if total > best:
                best, where = total, position
        return best, where


def _advice(factor: int, assignment: LayoutAssignment, target: Target) -> str:
    """How to split work `factor` times too big: that many times the warps where the block allows, else
    a smaller block or a loop."""
    warps = assignment.num_warps * (1 << max(0, math.ceil(math.log2(max(factor, 1)))))
    text = "Split the work: "
    if warps * assignment.warp_size <= target.max_threads_per_block:
        text += f"num_warps={warps} spreads it over {warps * assignment.warp_size} threads, or "
    return text + ("use a smaller block (fewer elements per program), or loop over pieces of the tile "
                   "(a `for` over smaller blocks)")


def _limits(target: Target) -> str:
    return (f"{target.name} holds {target.registers_per_thread} registers per thread, and more only spills, "
            f"which LLVM takes minutes to compile")


def _tile_message(tile: TileType, per_thread: int, registers: int, assignment: LayoutAssignment,
                  target: Target) -> str:
    held = f"{per_thread} elements per thread" + (f" ({registers} 32-bit registers)" if registers else "")
    return (f"this {tile} is {held} across {_warps(assignment)}, "
            f"more than one tile may take: at most {MAX_TILE_ELEMENTS} elements and {MAX_TILE_REGISTERS} "
            f"registers per thread ({_limits(target)}). ")


def _live_message(live: LiveTiles, assignment: LayoutAssignment, target: Target) -> str:
    values = live.live_at(live.peak_position)
    listed = ", ".join(f"{v.type} ({live.registers[v]})" + _where(v) for v in values[:4])
    more = f" and {len(values) - 4} more" if len(values) > 4 else ""
    return (f"here a thread holds {live.peak_registers} 32-bit registers of live tiles across "
            f"{_warps(assignment)}: {listed}{more}; at most "
            f"{MAX_LIVE_REGISTERS} may be live at once ({_limits(target)}). ")


def _work_message(work: dict[Operation, int], assignment: LayoutAssignment) -> str:
    largest = sorted(work, key=lambda op: -work[op])[:3]
    listed = ", ".join(f"{op.name} ({work[op]})" + (f" at line {op.loc.line}" if op.loc else "") for op in largest)
    total = sum(work.values())
    return (f"the kernel unrolls to about {total} instructions per thread across {_warps(assignment)} "
            f"(most: {listed}), more than the {MAX_UNROLLED_WORK} that LLVM "
            f"compiles in seconds (a transcendental function counts {MATH_WEIGHT} per element, a dot on FMAs "
            f"one per step of K). ")


def _where(value: Value) -> str:
    """` from line N` for a value an op with a source location defines, else nothing."""
    owner = value.owner
    loc = owner.loc if isinstance(owner, Operation) else None
    return f" from line {loc.line}" if loc is not None else ""


def _warps(assignment: LayoutAssignment) -> str:
    n = assignment.num_warps
    return f"{n} warp{'s' if n != 1 else ''} of {assignment.warp_size} threads"
