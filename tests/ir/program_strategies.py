"""Hypothesis strategies for random well-typed IR programs, made with the Builder.

`programs()` draws a Module of one or two kernels whose bodies mix constants
of every dtype (ints at their limits, floats including inf, nan and -0.0),
elementwise chains, comparisons and selects, casts, reductions and scans
(custom regions too), loads and stores through pointer tiles, prints, and
for/if/while nests with carried values. Name hints come from a small set
with collisions and non-identifiers; ops get random source locations.
"""

from __future__ import annotations

from hypothesis import strategies as st

from tessera.ir import dtypes as dt
from tessera.ir.builder import Builder
from tessera.ir.core import Block, Location, Module, Value
from tessera.ir.ops import MATH_FUNCTIONS
from tessera.ir.types import PointerType, ScalarType, TileType, Type, scalar_dtype, with_element, with_shape

HINTS = ("", "", "x", "x", "x_1", "acc", "a.b", "1st")
SHAPES = ((), (1,), (4,), (16,), (2, 8), (4, 1, 2))
NUMERIC = tuple(d for d in dt.ALL_DTYPES if not d.is_bool)
LOCATIONS = (None, Location("k.py", 3, 4), Location('dir/"q".py', 10, 0))
I32 = ScalarType(dt.i32)
BOOL = ScalarType(dt.bool_)
MAX_DEPTH = 2


@st.composite
def programs(draw) -> Module:
    b = Builder()
    for name in draw(st.sampled_from((["k"], ["k", "k_2"]))):
        _KernelMaker(draw, b).kernel(name)
    return b.module


def constant_values(dtype: dt.DType) -> st.SearchStrategy:
    """Attribute values a constant of `dtype` may hold."""
    if dtype.is_bool:
        return st.booleans()
    if dtype.is_int:
        return st.integers(dtype.min_value, dtype.max_value)
    special = st.sampled_from([0.0, -0.0, 1.0, float("inf"), float("-inf"), float("nan")])
    return st.one_of(special, st.floats(), st.integers(-(2**70), 2**70))


def _numeric(t: Type) -> bool:
    d = scalar_dtype(t)
    return d is not None and not d.is_bool


class _KernelMaker:
    def __init__(self, draw, builder: Builder):
        self.draw = draw
        self.b = builder

    def kernel(self, name: str) -> None:
        pointees = self.draw(st.lists(st.sampled_from(NUMERIC), min_size=1, max_size=3))
        types = [PointerType(d) for d in pointees] + [I32]
        attrs = self.draw(st.sampled_from(({}, {"num_warps": 4}, {"tag": "t", "ratio": 0.5, "dims": (1, 0)})))
        self.b.loc = self.draw(st.sampled_from(LOCATIONS))
        fn = self.b.function(name, types, [self.hint() for _ in types], attrs)
        self.statements(list(fn.args), 0)
        self.create("return", [])

    # -- helpers ------------------------------------------------------------------

    def hint(self) -> str:
        return self.draw(st.sampled_from(HINTS))

    def create(self, name, operands, attrs=None, result_types=None, regions=None):
        self.b.loc = self.draw(st.sampled_from(LOCATIONS))
        return self.b.create(name, operands, attrs, result_types, regions, [self.hint() for _ in range(3)])

    def pick(self, scope: list[Value], ok) -> Value | None:
        candidates = [v for v in scope if ok(v.type)]
        return self.draw(st.sampled_from(candidates)) if candidates else None

    def region(self, scope: list[Value], arg_types: list[Type], depth: int, yield_types: list[Type]) -> Block:
        """A block with `arg_types` arguments, random statements, and a yield of `yield_types`."""
        block = Block(arg_types, [self.hint() for _ in arg_types])
        inner = scope + block.args
        with self.b.at(block):
            self.statements(inner, depth + 1)
            self.create("yield", [self.pick(inner, lambda t, want=want: t == want) for want in yield_types])
        return block

    # -- statements -----------------------------------------------------------------

    def statements(self, scope: list[Value], depth: int) -> None:
        kinds = [self.constant, self.binary, self.unary, self.compare_select, self.cast,
                 self.reduce, self.memory, self.debug]
        if depth < MAX_DEPTH:
            kinds += [self.for_loop, self.if_else, self.while_loop]
        for _ in range(self.draw(st.integers(0, 5))):
            self.draw(st.sampled_from(kinds))(scope, depth)

    def constant(self, scope, depth=0, dtype=None, shape=None, value=None) -> Value:
        dtype = dtype or self.draw(st.sampled_from(dt.ALL_DTYPES))
        shape = self.draw(st.sampled_from(SHAPES)) if shape is None else shape
        value = self.draw(constant_values(dtype)) if value is None else value
        v = self.create("constant", [], {"value": value}, [with_shape(ScalarType(dtype), shape)]).result
        scope.append(v)
        return v

    def numeric_value(self, scope) -> Value:
        return self.pick(scope, _numeric) or self.constant(scope, dtype=self.draw(st.sampled_from(NUMERIC)))

    def binary(self, scope, depth):
        x = self.numeric_value(scope)
        ops = ["add", "sub", "mul", "div", "rem", "min", "max"]
        if scalar_dtype(x.type).is_int:
            ops += ["and", "or", "xor", "shl", "shr"]
        y = self.pick(scope, lambda t: t == x.type)
        scope.append(self.create(self.draw(st.sampled_from(ops)), [x, y]).result)

    def unary(self, scope, depth):
        x = self.numeric_value(scope)
        d = scalar_dtype(x.type)
        ops = ["neg", "abs"] + (list(MATH_FUNCTIONS) if d.is_float else ["not"] if d.is_int else [])
        scope.append(self.create(self.draw(st.sampled_from(ops)), [x]).result)

    def compare_select(self, scope, depth):
        x = self.pick(scope, lambda t: scalar_dtype(t) is not None) or self.constant(scope)
        y = self.pick(scope, lambda t: t == x.type)
        pred = self.draw(st.sampled_from(["eq", "ne", "lt", "le", "gt", "ge"]))
        c = self.create("cmp", [x, y], {"pred": pred}).result
        scope += [c, self.create("select", [c, x, y]).result]

    def cast(self, scope, depth):
        x = self.pick(scope, lambda t: scalar_dtype(t) is not None) or self.constant(scope)
        src = scalar_dtype(x.type)
        if self.draw(st.booleans()):
            to, name = self.draw(st.sampled_from(dt.ALL_DTYPES)), "cast"
        else:
            to, name = self.draw(st.sampled_from([d for d in dt.ALL_DTYPES if d.bits == src.bits])), "bitcast"
        scope.append(self.create(name, [x], result_types=[with_element(x.type, ScalarType(to))]).result)

    def reduce(self, scope, depth):
        x = self.pick(scope, lambda t: isinstance(t, TileType) and _numeric(t))
        if x is None:
            x = self.constant(scope, dtype=self.draw(st.sampled_from(NUMERIC)), shape=(2, 8))
        t = x.type
        axis = self.draw(st.integers(0, len(t.shape) - 1))
        kind = self.draw(st.sampled_from(["sum", "max", "custom", "scan", "custom scan", "argmin"]))
        if kind == "argmin":
            scope.append(self.create("arg_reduce", [x], {"axis": axis, "kind": kind}).result)
            return
        regions = None
        if kind.startswith("custom"):
            combine = Block([t.element, t.element], [self.hint(), self.hint()])
            with self.b.at(combine):
                self.create("yield", [self.create("max", combine.args).result])
            regions = [combine]
        if kind.endswith("scan"):
            attrs = {"axis": axis, "kind": kind.split()[0] if regions else "sum", "reverse": self.draw(st.booleans())}
            scope.append(self.create("scan", [x], attrs, [t], regions).result)
        else:
            result = with_shape(t.element, t.shape[:axis] + t.shape[axis + 1:])
            scope.append(self.create("reduce", [x], {"axis": axis, "kind": kind}, [result], regions).result)

    def memory(self, scope, depth):
        p = self.pick(scope, lambda t: isinstance(t, PointerType))
        n = self.pick(scope, lambda t: t == I32)
        size = self.draw(st.sampled_from([1, 4, 16]))
        offsets = self.create("arange", [], {"start": 0, "end": size}).result
        pointers = self.create("splat", [p], result_types=[TileType(p.type, (size,))]).result
        addresses = self.create("addptr", [pointers, offsets]).result
        bound = self.create("splat", [n], result_types=[TileType(I32, (size,))]).result
        mask = self.create("cmp", [offsets, bound], {"pred": "lt"}).result
        loaded = self.create("load", [addresses, mask]).result
        scope += [offsets, addresses, mask, loaded]
        stored = self.pick(scope, lambda t: t == loaded.type)
        self.create("store", [addresses, stored, mask])

    def debug(self, scope, depth):
        values = self.draw(st.lists(st.sampled_from(scope), max_size=2))
        self.create("print", values, {"prefix": self.draw(st.text(max_size=6))})

    def for_loop(self, scope, depth):
        lb = self.constant(scope, dtype=dt.i32, shape=(), value=0)
        ub = self.pick(scope, lambda t: t == I32)
        step = self.constant(scope, dtype=dt.i32, shape=(), value=self.draw(st.integers(1, 4)))
        carried = self.draw(st.lists(st.sampled_from(scope), max_size=2))
        types = [v.type for v in carried]
        body = self.region(scope, [I32, *types], depth, types)
        scope += self.create("for", [lb, ub, step, *carried], result_types=types, regions=[body]).results

    def if_else(self, scope, depth):
        cond = self.pick(scope, lambda t: t == BOOL) or self.constant(scope, dtype=dt.bool_, shape=())
        types = [v.type for v in self.draw(st.lists(st.sampled_from(scope), max_size=2))]
        branches = [self.region(scope, [], depth, types) for _ in range(2)]
        scope += self.create("if", [cond], result_types=types, regions=branches).results

    def while_loop(self, scope, depth):
        counter = self.pick(scope, lambda t: t == I32)
        carried = [counter, *self.draw(st.lists(st.sampled_from(scope), max_size=1))]
        types = [v.type for v in carried]
        before = Block(types, [self.hint() for _ in types])
        inner = scope + before.args
        with self.b.at(before):
            self.statements(inner, depth + 1)
            limit = self.constant(inner, dtype=dt.i32, shape=(), value=self.draw(st.integers(-5, 5)))
            go = self.create("cmp", [before.args[0], limit], {"pred": "lt"}).result
            self.create("condition", [go, *before.args], result_types=[])
        after = self.region(scope, types, depth, types)
        scope += self.create("while", carried, result_types=types, regions=[before, after]).results
