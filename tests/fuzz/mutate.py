"""Mutated kernel sources: a seed kernel with one to three random edits of its syntax tree.

The edits are what an adversarial (or just hurried) user writes: another operator, another tessera
function, a number from the edges (0, -1, 3, 2**31, 2**63, NaN, a huge block), another dtype, a call's
arguments swapped or dropped or a keyword added, a statement deleted, duplicated or moved, an expression
wrapped (`x[:, None]`, `x.to(...)`, a reduction), a constexpr or the warp count changed. Each mutant stays
parseable Python (the tree is unparsed), so every failure is tessera's to report. `mutant(seed, rng)` is
deterministic in `rng`.
"""

from __future__ import annotations

import ast
import copy
import random

from .cases import Case
from .seeds import Seed

BINARY_OPERATORS = [ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift,
                    ast.BitAnd, ast.BitOr, ast.BitXor, ast.MatMult]
COMPARISONS = [ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq]
FUNCTION_GROUPS = [
    ["exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "erf", "sigmoid", "floor", "ceil", "abs"],
    ["maximum", "minimum", "where", "dot", "atomic_cas"],
    ["sum", "max", "min", "argmax", "argmin", "cumsum", "cumprod", "expand_dims", "trans", "permute"],
    ["load", "store", "atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor",
     "atomic_xchg"],
    ["zeros", "full", "arange", "program_id", "num_programs", "reshape", "broadcast_to", "shared"],
]
NUMBERS = [0, 1, -1, 2, 3, 7, 8, 16, 31, 32, 64, 127, 255, 256, 1000, 1024, 4096, 65536, 2 ** 20, 2 ** 31 - 1,
           2 ** 31, 2 ** 32, 2 ** 63, -2 ** 63, 0.5, -0.0, 1e-45, 3.4e38, 1e300, float("inf"), float("nan")]
DTYPES = ["bool_", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32", "f64", "f8e4m3",
          "f8e5m2", "f6e2m3", "f4e2m1", "e8m0", "i4", "u1", "u3"]
KEYWORDS = [("axis", [0, 1, -1, 2, None]), ("mask", ["offs < 3", "True", "0"]), ("other", ["0", "1.5", "-1"]),
            ("keep_dims", ["True"]), ("dtype", ["tessera.f16", "tessera.i64"]), ("reverse", ["True"]),
            ("input_precision", ["'tf32'", "'ieee'"]), ("out_dtype", ["tessera.f16"])]
SIGNATURE_TYPES = ["f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u32", "u64", "bool",
                   "f8e4m3", "u4", "i1"]
CONSTEXPR_VALUES = [0, 1, 2, 3, 5, 8, 16, 64, 100, 256, 1024, 4096, 16384, 65536, 2 ** 20, 2 ** 21]
WARPS = [1, 2, 4, 8, 16, 32, 3]


def mutant(seed: Seed, rng: random.Random, name: str, target: str) -> Case:
    """A case running `seed` with 1 to 3 random edits on `target`."""
    tree = ast.parse(seed.source)
    case = Case(name, "", _kernel_name(tree), seed.signature, dict(seed.constexprs), target,
                num_warps=4, grid=seed.grid, array_elements=seed.array_elements)
    for _ in range(rng.choice([1, 1, 2, 3])):
        edit = rng.choice(EDITS)
        edit(tree, rng, case)
    ast.fix_missing_locations(tree)
    case.source = ast.unparse(tree) + "\n"
    return case


def _kernel_name(tree: ast.Module) -> str:
    kernels = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)
               and any("kernel" in ast.unparse(d) for d in node.decorator_list)]
    return kernels[-1]


def _functions(tree: ast.Module) -> list[ast.FunctionDef]:
    return [node for node in tree.body if isinstance(node, ast.FunctionDef)]


def _nodes(tree: ast.Module, kind) -> list:
    return [node for fn in _functions(tree) for node in ast.walk(fn) if isinstance(node, kind)]


def _statement_lists(tree: ast.Module) -> list[list]:
    return [node.body for fn in _functions(tree) for node in ast.walk(fn)
            if hasattr(node, "body") and isinstance(node.body, list) and node.body]


# -- edits: each changes `tree` (or `case`) in place, or does nothing when there is nothing to edit ---------------


def swap_operator(tree, rng, case):
    nodes = _nodes(tree, (ast.BinOp, ast.Compare, ast.AugAssign))
    if nodes:
        node = rng.choice(nodes)
        if isinstance(node, ast.Compare):
            node.ops = [rng.choice(COMPARISONS)() for _ in node.ops]
        else:
            node.op = rng.choice(BINARY_OPERATORS)()


def swap_function(tree, rng, case):
    calls = [c for c in _nodes(tree, ast.Call) if isinstance(c.func, ast.Attribute)
             and isinstance(c.func.value, ast.Name) and c.func.value.id == "tessera"]
    if calls:
        call = rng.choice(calls)
        group = next((g for g in FUNCTION_GROUPS if call.func.attr in g), None)
        pool = group if group and rng.random() < 0.7 else [n for g in FUNCTION_GROUPS for n in g]
        call.func.attr = rng.choice(pool)


def change_number(tree, rng, case):
    numbers = [c for c in _nodes(tree, ast.Constant) if isinstance(c.value, (int, float))
               and not isinstance(c.value, bool)]
    if numbers:
        node = rng.choice(numbers)
        value = rng.choice(NUMBERS)
        if isinstance(value, float) and (value != value or value in (float("inf"), -float("inf"))):
            _replace(tree, node, ast.parse(f'float("{value}")', mode="eval").body)    # no literal for these
        else:
            node.value = value


def change_dtype(tree, rng, case):
    names = [a for a in _nodes(tree, ast.Attribute) if isinstance(a.value, ast.Name) and a.value.id == "tessera"
             and a.attr in DTYPES]
    if names and rng.random() < 0.6:
        rng.choice(names).attr = rng.choice(DTYPES)
    else:
        entries = case.signature.split(",")
        i = rng.randrange(len(entries))
        pointer, rest = entries[i].startswith("*"), entries[i].lstrip("*").split(":")
        rest[0] = rng.choice(SIGNATURE_TYPES)
        entries[i] = ("*" if pointer else "") + ":".join(rest)
        case.signature = ",".join(entries)


def edit_arguments(tree, rng, case):
    calls = [c for c in _nodes(tree, ast.Call) if c.args or c.keywords]
    if not calls:
        return
    call = rng.choice(calls)
    choice = rng.random()
    if choice < 0.3 and len(call.args) > 1:
        i, j = rng.sample(range(len(call.args)), 2)
        call.args[i], call.args[j] = call.args[j], call.args[i]
    elif choice < 0.55 and call.args:
        call.args.pop(rng.randrange(len(call.args)))
    elif choice < 0.75 and call.keywords:
        call.keywords.pop(rng.randrange(len(call.keywords)))
    else:       # a keyword the call has takes the new value (a repeated keyword would not parse)
        keyword, values = rng.choice(KEYWORDS)
        value = rng.choice(values)
        node = ast.parse(repr(value) if not isinstance(value, str) else value, mode="eval").body
        call.keywords = [k for k in call.keywords if k.arg != keyword] + [ast.keyword(keyword, node)]


def edit_statements(tree, rng, case):
    lists = [body for body in _statement_lists(tree) if len(body) > 1 or rng.random() < 0.2]
    if not lists:
        return
    body = rng.choice(lists)
    i = rng.randrange(len(body))
    choice = rng.random()
    if choice < 0.4 and len(body) > 1:
        body.pop(i)
    elif choice < 0.7:
        body.insert(i, copy.deepcopy(body[i]))
    elif len(body) > 1:
        j = rng.randrange(len(body))
        body[i], body[j] = body[j], body[i]


WRAPS = ["({})[:, None]", "({})[None, :]", "({}).to(tessera.{dtype})", "tessera.sum({}, axis=0)", "-({})",
         "tessera.where(({}) > 0, {}, 0)", "tessera.reshape({}, (-1,))", "tessera.trans({})", "({}) * ({})",
         "tessera.expand_dims({}, 0)", "tessera.cumsum({}, axis=0)", "({})[0]", "tessera.exp({})", "({}).T",
         "tessera.cast({}, tessera.{dtype}, bitcast=True)"]


def wrap_expression(tree, rng, case):
    names = [n for n in _nodes(tree, ast.Name) if isinstance(n.ctx, ast.Load) and n.id != "tessera"]
    if names:
        node = rng.choice(names)
        text = rng.choice(WRAPS).replace("{dtype}", rng.choice(DTYPES)).replace("{}", node.id)
        _replace(tree, node, ast.parse(text, mode="eval").body)


def change_launch(tree, rng, case):
    if case.constexprs and rng.random() < 0.7:
        key = rng.choice(sorted(case.constexprs))
        case.constexprs[key] = rng.choice(CONSTEXPR_VALUES)
    else:
        case.num_warps = rng.choice(WARPS)


def rename(tree, rng, case):
    names = [n for n in _nodes(tree, ast.Name) if isinstance(n.ctx, ast.Load) and n.id != "tessera"]
    if len(names) > 1:
        node, other = rng.sample(names, 2)
        node.id = other.id


EDITS = [swap_operator, swap_function, change_number, change_dtype, edit_arguments, edit_statements,
         wrap_expression, change_launch, rename]


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    """Put `new` where `old` is in `tree`."""
    for parent in ast.walk(tree):
        for name, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, name, new)
                return
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
                        return
