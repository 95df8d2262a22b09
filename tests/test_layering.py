"""Dependencies point one way: each package of tessera imports only the packages below it.

ir imports nothing else of tessera; passes and backends build on ir (the SIMT
simulator on the tile interpreter, each GPU backend on the LLVM core);
runtime loads what backends produce; dsl ties them together; kernels_lib
uses only the public API (`import tessera`, and `import tessera.torch` for its ops). Every import statement of every
module is read with `ast`, so one added upward import fails here, naming
the file.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tessera"

# package -> the packages it may import besides itself ("tessera": the public API in tessera/__init__.py)
ALLOWED = {
    "version": set(),
    "ir": set(),
    "backends": set(),                  # backends/__init__.py: a docstring only
    "passes": {"ir"},
    "backends.interp": {"ir"},
    "backends.simt": {"ir", "backends.interp"},
    "backends.llvm": {"ir"},
    "backends.nvptx": {"ir", "backends.llvm"},
    "backends.amdgpu": {"ir", "backends.llvm"},
    "runtime": {"ir", "version"},
    "dsl": {"ir", "passes", "backends.interp", "backends.llvm", "backends.nvptx", "backends.amdgpu", "runtime",
            "version"},
    "kernels_lib": {"tessera", "torch"},  # the public API: `import tessera` and `import tessera.torch`
    "torch": {"tessera", "dsl"},          # tessera/torch.py: kernels as PyTorch ops (skips launches when faking)
    "aot": {"ir", "runtime", "version"},  # C launchers from compile manifests
}
TOP_LEVEL = {"tessera", "cli", "testing"}      # tessera/__init__.py, cli.py, testing.py: above everything


def layer(module: str) -> str:
    """'tessera.backends.simt.ops' -> 'backends.simt', 'tessera.ir.ops' -> 'ir'; 'tessera' and the names
    `tessera/__init__.py` defines ('tessera.kernel') -> 'tessera'."""
    parts = module.split(".")[1:]
    if not parts or not ((PACKAGE / parts[0]).is_dir() or (PACKAGE / f"{parts[0]}.py").is_file()):
        return "tessera"
    return ".".join(parts[:2]) if parts[0] == "backends" and len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_nodes(tree: ast.AST):
    """Every node of `tree` except those under `if TYPE_CHECKING:` (imports for annotations only)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in [child, *runtime_nodes(child)])
            continue
        yield node
        yield from runtime_nodes(node)


def imported_modules(path: Path, runtime_only: bool = False) -> set[str]:
    """Absolute names of the tessera modules (or names inside them) that `path` imports."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = set()
    tree = ast.parse(path.read_text())
    for node in (runtime_nodes(tree) if runtime_only else ast.walk(tree)):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[:len(package) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out |= {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in out if m == "tessera" or m.startswith("tessera.")}


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_package_has_a_rule():
    layers = {layer(module_name(p)) for p in MODULES} - TOP_LEVEL
    assert sorted(layers - set(ALLOWED)) == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    own = layer(module_name(path))
    if own in TOP_LEVEL:
        return
    wrong = {m: layer(m) for m in imported_modules(path) if layer(m) != own and layer(m) not in ALLOWED[own]}
    assert not wrong, f"{path.relative_to(PACKAGE)} ({own}) imports {wrong}, above it or beside it"


def test_per_op_lowering_does_not_run_the_schedule():
    """passes/schedule builds on passes/lowering (and registers into its table); the reverse is only for types."""
    lowering = PACKAGE / "passes" / "lowering"
    for path in sorted(lowering.rglob("*.py")):
        upward = {m for m in imported_modules(path, runtime_only=True) if m.startswith("tessera.passes.schedule")}
        assert not upward, f"{path.relative_to(PACKAGE)} imports {sorted(upward)}"


@pytest.mark.parametrize("init", sorted(PACKAGE.rglob("__init__.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_package_says_what_it_does_and_what_it_may_import(init):
    """The opening paragraph of each package's docstring: its job and its imports, in a sentence or two."""
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc, f"{init.relative_to(PACKAGE)} has no docstring"
    opening = doc.split("\n\n")[0]
    assert "import" in opening and opening.count(". ") <= 2, opening
