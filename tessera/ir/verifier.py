"""The verifier: is a module well-formed IR? Run after every pass in tests.

It checks, for every function:

* every op obeys its definition in `ops.py`: operand count, attributes,
  regions and type rule (`builder.check_type_rule`);
* every tile dimension is a power of two (hardware tiles are; the frontend
  pads and masks);
* SSA scoping: an operand is a block argument of an enclosing region or the
  result of an earlier op of an enclosing block; nothing defined inside a
  region is visible outside it;
* terminators: every region ends with the one its parent expects (`yield`;
  `condition` for a while's first region; `return` for the function body),
  and terminators appear nowhere else.

The first problem found raises `VerifyError` naming the function, the op
(as `print_op` prints it), its source location when known, and why.
"""

from __future__ import annotations

from .builder import check_type_rule
from .core import Block, Function, Module, Operation, Value, enclosing_function
from .errors import TypeRuleError, VerifyError
from .ops import OPS
from .printer import print_op, print_value
from .types import TensorMapType, TileType, Type

# What each region of a region-holding op is called in messages.
_REGION_NAMES = {
    "for": ("body",),
    "if": ("then region", "else region"),
    "while": ("condition region", "body"),
    "reduce": ("combine region",),
    "scan": ("combine region",),
}


def verify_module(module: Module) -> None:
    """Raise VerifyError at the first malformed function of `module`."""
    seen = set()
    for fn in module.functions:
        if fn.name in seen:
            raise VerifyError(f"function @{fn.name} is defined twice in the module")
        seen.add(fn.name)
        verify_function(fn)


def verify_function(fn: Function) -> None:
    """Raise VerifyError naming the op and why if `fn` is malformed."""
    _FunctionVerifier(fn).verify()


def tile_shape_problem(t: Type) -> str | None:
    """Why `t` is not a valid tile type (a dimension that is not a power of two), or None."""
    if not isinstance(t, TileType):
        return None
    for d in t.shape:
        if d < 1 or d & (d - 1):
            fix = f"pad it to {1 << (d - 1).bit_length()} and mask the extra lanes" if d > 0 else "drop it"
            return f"{t} has dimension {d}, which is not a power of two: {fix}"
    return None


def parameter_only_problem(t: Type) -> str | None:
    """Why a value of type `t` that is not a kernel parameter is malformed (a tensor map), or None."""
    if isinstance(t, TensorMapType):
        return "a tensormap is passed by value as a kernel parameter; no op or region may define one"
    return None


class _FunctionVerifier:
    def __init__(self, fn: Function):
        self.fn = fn

    def verify(self) -> None:
        fn = self.fn
        for arg in fn.args:
            problem = tile_shape_problem(arg.type)
            if problem:
                self.fail_function(f"argument {print_value(arg)}: {problem}")
        if not fn.body.ops:
            self.fail_function("the function body is empty; it must end with `return`")
        self.block(fn.body, set(), "return", f"the body of @{fn.name}")

    def block(self, block: Block, visible: set[Value], terminator: str, what: str) -> None:
        """Check `block`'s ops in order; `visible` holds the values of enclosing scopes."""
        visible = visible | set(block.args)
        for i, op in enumerate(block.ops):
            self.op(op, visible, i == len(block.ops) - 1, terminator, what)
            visible.update(op.results)

    def op(self, op: Operation, visible: set[Value], is_last: bool, terminator: str, what: str) -> None:
        for value in op.operands:
            if value not in visible:
                self.fail(op, self.why_not_visible(value, op))
        opdef = OPS.get(op.name)
        if opdef is None:
            self.fail(op, f"unknown op '{op.name}'")
        if opdef.terminator and not is_last:
            self.fail(op, f"`{op.name}` is a terminator but ops follow it; it must be the last op of its region")
        if is_last and op.name != terminator:
            ending = f"`{op.name}` cannot end" if opdef.terminator else "missing terminator: nothing ends"
            self.fail(op, f"{ending} {what}; it must end with `{terminator}`")
        for j, region in enumerate(op.regions):
            self.region(op, j, region, visible)
        try:
            check_type_rule(op)
        except TypeRuleError as e:
            self.fail(op, str(e))
        for result in op.results:
            problem = tile_shape_problem(result.type) or parameter_only_problem(result.type)
            if problem:
                self.fail(op, f"result {print_value(result)}: {problem}")

    def region(self, op: Operation, index: int, region: Block, visible: set[Value]) -> None:
        names = _REGION_NAMES.get(op.name, ())
        what = f"the {names[index]} of `{op.name}`" if index < len(names) else f"region {index} of `{op.name}`"
        terminator = "condition" if (op.name, index) == ("while", 0) else "yield"
        for arg in region.args:
            problem = tile_shape_problem(arg.type) or parameter_only_problem(arg.type)
            if problem:
                self.fail(op, f"argument {print_value(arg)} of {what}: {problem}")
        if not region.ops:
            self.fail(op, f"{what} is empty; it must end with `{terminator}`")
        self.block(region, visible, terminator, what)

    def why_not_visible(self, value: Value, user: Operation) -> str:
        name = print_value(value)
        defining_block = value.owner if isinstance(value.owner, Block) else getattr(value.owner, "parent", None)
        enclosing, item = [], user.parent
        while isinstance(item, Block):
            enclosing.append(item)
            item = item.parent.parent if isinstance(item.parent, Operation) else None
        if any(block is defining_block for block in enclosing):
            return f"{name} is used before it is defined"
        if enclosing_function(defining_block) is self.fn:
            return f"{name} is used outside the region that defines it (values defined in a region are local to it)"
        return f"{name} is not defined in @{self.fn.name}"

    def fail(self, op: Operation, why: str) -> None:
        where = f" at {op.loc}" if op.loc is not None else ""
        raise VerifyError(f"@{self.fn.name}: `{print_op(op)}`{where}: {why}")

    def fail_function(self, why: str) -> None:
        where = f" at {self.fn.loc}" if self.fn.loc is not None else ""
        raise VerifyError(f"@{self.fn.name}{where}: {why}")


