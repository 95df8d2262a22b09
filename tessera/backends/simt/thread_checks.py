"""Is a function thread IR? No tiles, no views, no tile-only ops.

Thread IR is what `lower_to_threads` produces: every value is per thread
(scalars, pointers, `regs<N x T>`), and the ops are the thread-level ones
plus the tile ops that also make sense per thread (elementwise, memory,
control flow; see `tessera.ir.thread_ops`). `verify_thread_ir` rejects what
only a tile-level program can hold, naming the op and what to do. It does
not repeat the general verifier (`tessera.ir.verifier`).
"""

from __future__ import annotations

from typing import Callable

from tessera.ir.core import Block, Function, Module, Value
from tessera.ir.errors import VerifyError
from tessera.ir.printer import print_op, print_value
from tessera.ir.hint_ops import HINT_OPS
from tessera.ir.shared_ops import SHARED_TILE_OPS
from tessera.ir.types import SharedType, TileType, ViewType

# Tile ops that have no per-thread meaning: they describe a whole tile's lanes.
TILE_ONLY_OPS = frozenset({
    "arange", "broadcast", "expand_dims", "reshape", "permute", "reduce", "arg_reduce", "scan", "dot",
    "make_view", "view_load", "view_store", "convert_layout",
}) | SHARED_TILE_OPS | HINT_OPS

_LOWER = "lower the kernel with tessera.passes.lower_to_threads first"


def verify_thread_ir(item: Function | Module) -> None:
    """Raise VerifyError at the first tile-level type or op in `item`."""
    functions = item.functions if isinstance(item, Module) else [item]
    for fn in functions:
        for arg in fn.args:
            _check_value(fn, arg, lambda: f"argument {print_value(arg)}")
        _check_block(fn, fn.body)


def _check_block(fn: Function, block: Block) -> None:
    for op in block.ops:
        def where() -> str:
            return f"{print_op(op)}" + (f" at {op.loc}" if op.loc else "")

        if op.name in TILE_ONLY_OPS:
            raise VerifyError(f"@{fn.name}: {where()}: '{op.name}' is a tile-level op, not thread IR; {_LOWER}")
        for value in op.results:
            _check_value(fn, value, lambda: f"result {print_value(value)} of {where()}")
        for region in op.regions:
            for arg in region.args:
                _check_value(fn, arg, lambda: f"region argument {print_value(arg)} of {where()}")
            _check_block(fn, region)


def _check_value(fn: Function, value: Value, where: Callable[[], str]) -> None:
    if isinstance(value.type, (TileType, ViewType, SharedType)):
        kind = {TileType: "tile", ViewType: "tensor view", SharedType: "shared buffer"}[type(value.type)]
        raise VerifyError(f"@{fn.name}: {where()} has type {value.type}, a {kind}; thread IR holds only "
                          f"scalars, pointers and regs<N x T>; {_LOWER}")
