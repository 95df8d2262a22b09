"""A hypothesis generator of random, well-typed tile kernels with a numpy twin.

Each generated program is a list of statements over 1-D tiles of one dtype
(f32 or i32): assignments of random expression trees, a `for` accumulation,
an `if`/`else` on a scalar argument, a `while` loop, and a loop that
`break`s on a traced condition. Every node renders twice: as kernel source
(`src`) and as a numpy evaluation (`eval`) with the same dtype semantics, so
a test can compile the source with Tessera, run it in the interpreter, and
compare against numpy.
"""

from __future__ import annotations

import importlib.util
import itertools
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

BLOCK = 16
NUMPY = {"f32": np.float32, "i32": np.int32}


# --- expressions ------------------------------------------------------------

class Expr:
    def src(self) -> str: ...
    def eval(self, env: dict, dtype: str) -> np.ndarray: ...


@dataclass
class Var(Expr):
    name: str

    def src(self):
        return self.name

    def eval(self, env, dtype):
        return env[self.name]


@dataclass
class Const(Expr):
    value: float | int

    def src(self):
        return repr(self.value)

    def eval(self, env, dtype):
        return NUMPY[dtype](self.value)


@dataclass
class Binary(Expr):
    op: str
    a: Expr
    b: Expr

    def src(self):
        return f"({self.a.src()} {self.op} {self.b.src()})"

    def eval(self, env, dtype):
        a, b = self.a.eval(env, dtype), self.b.eval(env, dtype)
        with np.errstate(over="ignore"):
            result = {"+": np.add, "-": np.subtract, "*": np.multiply,
                      "&": np.bitwise_and, "|": np.bitwise_or, "^": np.bitwise_xor}[self.op](a, b)
        return result.astype(NUMPY[dtype])


@dataclass
class Call(Expr):
    fn: str
    args: tuple[Expr, ...]

    # fmax/fmin: a NaN operand yields the other, as tessera.maximum/minimum do.
    NUMPY_FUNCTIONS = {"maximum": np.fmax, "minimum": np.fmin, "abs": np.abs, "tanh": np.tanh}

    def src(self):
        return f"tessera.{self.fn}({', '.join(a.src() for a in self.args)})"

    def eval(self, env, dtype):
        args = [np.asarray(a.eval(env, dtype)) for a in self.args]
        with np.errstate(over="ignore"):
            return self.NUMPY_FUNCTIONS[self.fn](*args).astype(NUMPY[dtype])


@dataclass
class Where(Expr):
    pred: str
    a: Expr
    b: Expr
    then: Expr
    otherwise: Expr

    def src(self):
        return (f"tessera.where({self.a.src()} {self.pred} {self.b.src()}, "
                f"{self.then.src()}, {self.otherwise.src()})")

    def eval(self, env, dtype):
        cond = {"<": np.less, ">": np.greater, "==": np.equal}[self.pred](self.a.eval(env, dtype), self.b.eval(env, dtype))
        return np.where(cond, self.then.eval(env, dtype), self.otherwise.eval(env, dtype)).astype(NUMPY[dtype])


@dataclass
class Reduce(Expr):
    """A full reduction to a scalar, broadcast back when combined with tiles."""

    fn: str
    arg: Expr

    def src(self):
        return f"tessera.{self.fn}({self.arg.src()}, axis=0)"

    def eval(self, env, dtype):
        value = np.asarray(self.arg.eval(env, dtype))
        value = np.broadcast_to(value, (BLOCK,))
        with np.errstate(over="ignore"):
            reduced = {"sum": np.sum, "max": np.max, "min": np.min}[self.fn](value)
        return NUMPY[dtype](reduced)


def expressions(dtype: str, names: list[str], depth: int = 3) -> st.SearchStrategy[Expr]:
    """Random expression trees over the tile variables `names`; the root always involves a tile.

    (A tree of constants alone would be a Python scalar: assigning it where a
    tile is expected is a type change the compiler rightly rejects.)
    """
    constants = (st.integers(-5, 5) if dtype == "i32" else
                 st.sampled_from([0.5, -1.25, 2.0, 0.0, 3.5]))
    leaves = st.one_of(st.sampled_from(names).map(Var), constants.map(Const))
    ops = ["+", "-", "*"] + (["&", "|", "^"] if dtype == "i32" else [])
    unary = ["abs"] + (["tanh"] if dtype == "f32" else [])

    def extend(children):
        return st.one_of(
            st.builds(Binary, st.sampled_from(ops), children, children),
            st.builds(lambda f, a, b: Call(f, (a, b)), st.sampled_from(["maximum", "minimum"]), children, children),
            st.builds(lambda f, a: Call(f, (a,)), st.sampled_from(unary), children),
            st.builds(Where, st.sampled_from(["<", ">", "=="]), children, children, children, children),
        )

    tree = st.recursive(leaves, extend, max_leaves=6)
    tile = st.builds(Binary, st.sampled_from(ops), st.sampled_from(names).map(Var), tree)
    # A reduction on top of a tile expression keeps the value a tile: e + sum(e').
    reduced = st.builds(lambda e, f, r: Binary("+", e, Reduce(f, r)), tile, st.sampled_from(["sum", "max"]), tile)
    return st.one_of(tile, reduced) if depth > 0 else tile


# --- statements ---------------------------------------------------------------

class Stmt:
    def src(self) -> list[str]: ...
    def run(self, env: dict, dtype: str, n: int) -> None: ...


@dataclass
class Assign(Stmt):
    target: str
    value: Expr

    def src(self):
        return [f"{self.target} = {self.value.src()}"]

    def run(self, env, dtype, n):
        env[self.target] = np.broadcast_to(self.value.eval(env, dtype), (BLOCK,)).astype(NUMPY[dtype])


@dataclass
class ForAccumulate(Stmt):
    """`for i in range(count): target = target + body` (body may use i)."""

    target: str
    count: int
    body: Expr

    def src(self):
        return [f"for i in range({self.count}):",
                f"    {self.target} = {self.target} + {self.body.src()} + i"]

    def run(self, env, dtype, n):
        for i in range(self.count):
            env["i"] = NUMPY[dtype](i)
            with np.errstate(over="ignore"):
                env[self.target] = (env[self.target] + self.body.eval(env, dtype) + NUMPY[dtype](i)).astype(NUMPY[dtype])
        env.pop("i", None)


@dataclass
class IfElse(Stmt):
    """`if n > threshold: target = a else: target = b` on the scalar argument n."""

    target: str
    threshold: int
    then: Expr
    otherwise: Expr

    def src(self):
        return [f"if n > {self.threshold}:", f"    {self.target} = {self.then.src()}",
                "else:", f"    {self.target} = {self.otherwise.src()}"]

    def run(self, env, dtype, n):
        chosen = self.then if n > self.threshold else self.otherwise
        env[self.target] = np.broadcast_to(chosen.eval(env, dtype), (BLOCK,)).astype(NUMPY[dtype])


@dataclass
class WhileLoop(Stmt):
    target: str
    count: int
    body: Expr

    def src(self):
        return ["j = 0", f"while j < {self.count}:",
                f"    {self.target} = {self.target} - {self.body.src()}", "    j += 1"]

    def run(self, env, dtype, n):
        for _ in range(self.count):
            with np.errstate(over="ignore"):
                env[self.target] = (env[self.target] - self.body.eval(env, dtype)).astype(NUMPY[dtype])


@dataclass
class BreakLoop(Stmt):
    """A loop left early on a traced condition: exercises break lowering."""

    target: str
    count: int
    stop_at: int
    body: Expr

    def src(self):
        return [f"for i in range({self.count}):", f"    if i == {self.stop_at}:", "        break",
                f"    {self.target} = {self.target} * 2 + {self.body.src()}"]

    def run(self, env, dtype, n):
        for i in range(min(self.count, self.stop_at)):
            env["i"] = NUMPY[dtype](i)
            with np.errstate(over="ignore"):
                env[self.target] = (env[self.target] * NUMPY[dtype](2) + self.body.eval(env, dtype)).astype(NUMPY[dtype])
        env.pop("i", None)


@dataclass
class Program:
    dtype: str
    statements: list[Stmt]
    result: str

    def source(self, name: str) -> str:
        body = [line for s in self.statements for line in s.src()]
        body_text = textwrap.indent("\n".join(body), " " * 4)
        return (f"import tessera\n\n\n@tessera.kernel\n"
                f"def {name}(x_ptr, y_ptr, out_ptr, n, BLOCK: tessera.constexpr):\n"
                f"    offs = tessera.arange(0, BLOCK)\n"
                f"    mask = offs < n\n"
                f"    x = tessera.load(x_ptr + offs, mask=mask, other=0)\n"
                f"    y = tessera.load(y_ptr + offs, mask=mask, other=0)\n"
                f"{body_text}\n"
                f"    tessera.store(out_ptr + offs, {self.result}, mask=mask)\n")

    def reference(self, x: np.ndarray, y: np.ndarray, n: int) -> np.ndarray:
        """Evaluate in numpy over the whole block (masked-off lanes loaded as 0)."""
        pad = lambda a: np.concatenate([a[:n], np.zeros(BLOCK - n, a.dtype)])
        env = {"x": pad(x), "y": pad(y)}
        for s in self.statements:
            s.run(env, self.dtype, n)
        return np.broadcast_to(env[self.result], (BLOCK,))[:n]


@st.composite
def programs(draw) -> Program:
    dtype = draw(st.sampled_from(["f32", "i32"]))
    names = ["x", "y"]
    statements: list[Stmt] = []
    for k in range(draw(st.integers(1, 4))):
        target = f"v{k}"
        statements.append(Assign(target, draw(expressions(dtype, names))))
        names.append(target)
        kind = draw(st.sampled_from(["none", "for", "if", "while", "break"]))
        expr = expressions(dtype, names, depth=0)
        if kind == "for":
            statements.append(ForAccumulate(target, draw(st.integers(0, 3)), draw(expr)))
        elif kind == "if":
            statements.append(IfElse(target, draw(st.integers(0, BLOCK)), draw(expr), draw(expr)))
        elif kind == "while":
            statements.append(WhileLoop(target, draw(st.integers(0, 3)), draw(expr)))
        elif kind == "break":
            statements.append(BreakLoop(target, draw(st.integers(1, 4)), draw(st.integers(0, 4)), draw(expr)))
    return Program(dtype, statements, result=names[-1])


# --- loading generated source as a real module --------------------------------

_workdir = Path(tempfile.mkdtemp(prefix="tessera_generated_"))
_counter = itertools.count()


def load_kernel(source: str, name: str):
    """Write `source` to a fresh file and import it, so kernels have real source lines."""
    path = _workdir / f"generated_{next(_counter)}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)
