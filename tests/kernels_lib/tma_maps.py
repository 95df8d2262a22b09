"""Which TMA tensor maps a compiled kernel needs, read from its PTX: helpers of the tests that check the maps a
launcher builds (`test_gemm_tma_on_gpu.py`, `tests/aot/test_c_launcher*.py`).

A kernel's hidden tensor-map parameters (`metadata["tensor_maps"]`, one recipe each) must be exactly the maps
its TMA instructions use: one per operand a K loop fills by `tma_load`, plus the output's when the epilogue
stores its block by `tma_store` (`passes/schedule/tma_store.py`). The PTX says which instruction uses which
parameter: the map's generic address is taken with

    mov.b64 %rdA, <entry>_param_<i>;   cvta.param.u64 %rdB, %rdA;

and `%rdB` is the tensor operand of `cp.async.bulk.tensor.<r>d.shared::cluster.global...` (a load) or of
`cp.async.bulk.tensor.<r>d.global.shared::cta...` (a store)."""

from __future__ import annotations

import re

_ADDRESS = re.compile(r"\bmov\.b64\s+(%rd\d+),\s*(\w+)_param_(\d+);")
_GENERIC = re.compile(r"\bcvta\.param\.u64\s+(%rd\d+),\s*(%rd\d+);")
_LOAD = re.compile(r"\bcp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global\S*\s+\[[^\]]*\],\s*\[([^,\]]+),")
_STORE = re.compile(r"\bcp\.async\.bulk\.tensor\.\dd\.global\.shared::cta\S*\s+\[([^,\]]+),")


def tensor_map_uses(ptx: str) -> dict[int, set[str]]:
    """Parameter index -> {"load", "store"}: how the kernel's TMA instructions use each tensor-map parameter.
    An instruction whose map operand is not traced back to a parameter fails the calling test (the PTX took a
    form this reader does not know), rather than being skipped."""
    param_of = {reg: int(index) for reg, _, index in _ADDRESS.findall(ptx)}
    param_of.update({generic: param_of[reg] for generic, reg in _GENERIC.findall(ptx) if reg in param_of})
    uses: dict[int, set[str]] = {}
    for use, pattern in (("load", _LOAD), ("store", _STORE)):
        for operand in pattern.findall(ptx):
            operand = operand.strip()
            if operand not in param_of:
                raise AssertionError(f"a TMA {use} reads its tensor map from {operand}, which is not traced to a "
                                     f"kernel parameter (mov.b64 + cvta.param.u64); update tests/kernels_lib/tma_maps.py")
            uses.setdefault(param_of[operand], set()).add(use)
    return uses


def maps_by_use(ptx: str, recipes: list[dict]) -> dict[str, list[str]]:
    """{"load": [pointer names], "store": [pointer names]} of the maps in `recipes` (metadata / manifest
    `tensor_maps`, each with "param" and "pointer"), in parameter order; every recipe must be used by some TMA
    instruction and every map a TMA instruction uses must have a recipe, else the calling test fails."""
    uses = tensor_map_uses(ptx)
    params = {r["param"]: r["pointer"] for r in recipes}
    assert set(uses) == set(params), f"TMA instructions use map parameters {sorted(uses)}; recipes: {sorted(params)}"
    return {use: [params[p] for p in sorted(params) if use in uses[p]] for use in ("load", "store")}


def launcher_map_uses(launcher) -> dict[str, list[str]]:
    """`maps_by_use` of the maps a runtime `Launcher` builds (its recipes), by how its kernel's PTX uses them."""
    maps = launcher.tensor_maps
    recipes = [] if maps is None else [{"param": r.param, "pointer": maps.names[r.pointer]} for r in maps.recipes]
    assert launcher.binary.ptx, "the launcher keeps its kernel's PTX"
    return maps_by_use(launcher.binary.ptx, recipes)
