"""Which kernels the goldens hold, and how each is compiled to text.

A `Case` is one kernel specialization (signature, constexprs, warps); it is
compiled for every target in `TARGETS`. A case that does not compile for a
target (a warp-specialized loop on sm_80, say) is recorded as the error's
class, so a kernel that starts or stops compiling is a difference too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("sm_80", "sm_90", "sm_90a", "gfx942")
NOT_COMPILED = "<does not compile: {}>"


@dataclass(frozen=True)
class Case:
    """One kernel specialization, compiled for each of `TARGETS`."""

    name: str
    kernel: Any                     # a tessera.Kernel
    signature: str
    constexprs: dict = field(default_factory=dict)
    num_warps: int = 4
    libdevice: bool = True          # False: NVIDIA math through MUFU approximations, as where none is found


def tutorial_module(file: str):
    """Import `tutorials/<file>` (its name starts with a digit, so not by `import`)."""
    spec = importlib.util.spec_from_file_location("tutorial_" + file.replace("-", "_")[:-3], ROOT / "tutorials" / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tutorial_cases() -> list[Case]:
    add = tutorial_module("01-vector-add.py").add
    softmax = tutorial_module("02-fused-softmax.py").softmax
    matmul = tutorial_module("03-matmul.py").matmul
    cases = [
        Case("tutorial01/add", add, "*f32:16,*f32:16,*f32:16,i32:16", {"BLOCK": 1024}),
        Case("tutorial02/softmax", softmax, "*f32:16,*f32:16,i32:16,i32:16", {"BLOCK": 1024}),
        Case("tutorial02/softmax/no-libdevice", softmax, "*f32:16,*f32:16,i32:16,i32:16", {"BLOCK": 1024},
             libdevice=False),
        Case("tutorial03/matmul", matmul, "*f16:16,*f16:16,*f16:16,i32:16,i32:16,i32:16",
             {"BM": 64, "BN": 64, "BK": 32}),
    ]
    steps = tutorial_module("04-layouts-and-async.py")
    for name, kernel, dtype, _target, constexprs in steps.STEPS:      # every step, for every target
        cases.append(Case(f"tutorial04/{name}", kernel, f"*{dtype}:16,*{dtype}:16,*f32:16,i32:16,i32:16,i32:16",
                          dict(constexprs), steps.NUM_WARPS))
    return cases


GEMM_BF16 = "*bf16:16,*bf16:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,i32:16,i32:1"
GEMM_FP8 = "*f8e4m3:16,*f8e4m3:16,*f32:16,*f32:16,*f32:16,*bf16:16,i32:16,i32:16,i32:16,f32,i32:16,i32:1,{b}"
B_ROW_MAJOR, B_TRANSPOSED = "i32:16,i32:1", "i32:1,i32:16"
NO_EPILOGUE = dict(HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none")


def gemm_cases() -> list[Case]:
    from tessera.kernels_lib.gemm import CONFIGS, gemm_kernel, gemm_kernel_fast

    kernel = gemm_kernel.kernel
    cases = []
    for i, config in enumerate(CONFIGS):
        meta = dict(config.kwargs)
        cases.append(Case(f"gemm/bf16/config{i}", kernel, GEMM_BF16, {**NO_EPILOGUE, **meta}, config.num_warps))
        if not meta["PERSISTENT"]:      # (WS with PERSISTENT: test_gemm_persistent_ws.py)
            cases.append(Case(f"gemm/bf16/config{i}/ws", kernel, GEMM_BF16, {**NO_EPILOGUE, **meta, "WS": True},
                              config.num_warps))
        cases.append(Case(f"gemm/fp8/config{i}", kernel, GEMM_FP8.format(b=B_ROW_MAJOR), {**NO_EPILOGUE, **meta},
                          config.num_warps))
    first = dict(CONFIGS[0].kwargs)
    cases.append(Case("gemm/bf16-bias-gelu/config0", kernel, GEMM_BF16,
                      {**NO_EPILOGUE, **first, "HAS_BIAS": True, "ACTIVATION": "gelu"}, CONFIGS[0].num_warps))
    cases.append(Case("gemm/fp8-b-transposed-scaled-bias-silu/config0", kernel, GEMM_FP8.format(b=B_TRANSPOSED),
                      {**first, "HAS_BIAS": True, "SCALE_A": "vector", "SCALE_B": "vector", "ACTIVATION": "silu"},
                      CONFIGS[0].num_warps))
    from tessera.kernels_lib.gemm import HOPPER_CONFIGS
    hopper = dict(HOPPER_CONFIGS[0].kwargs)         # 128 x 256 on two consumer warpgroups (issue 19)
    cases.append(Case("gemm/bf16/hopper0", kernel, GEMM_BF16, {**NO_EPILOGUE, **hopper}, HOPPER_CONFIGS[0].num_warps))
    cases.append(Case("gemm/bf16/hopper0/ws", kernel, GEMM_BF16, {**NO_EPILOGUE, **hopper, "WS": True},
                      HOPPER_CONFIGS[0].num_warps))
    # what the op runs for bf16 outputs on a GPU: the same kernel with fast math (issue 19)
    cases.append(Case("gemm/bf16-bias-silu/config0/fast-math", gemm_kernel_fast.kernel, GEMM_BF16,
                      {**NO_EPILOGUE, **first, "HAS_BIAS": True, "ACTIVATION": "silu"}, CONFIGS[0].num_warps))
    return cases


def all_cases() -> list[Case]:
    return tutorial_cases() + gemm_cases()


@contextmanager
def text_only(libdevice: bool = True) -> Iterator[None]:
    """Compile without ptxas or ld.lld (and libdevice): an override naming no file makes each search find none."""
    saved = {name: os.environ.get(name) for name in ("TESSERA_PTXAS", "TESSERA_LLD", "TESSERA_LIBDEVICE",
                                                     "TESSERA_DUMP")}
    os.environ.update(TESSERA_PTXAS="/nonexistent/ptxas", TESSERA_LLD="/nonexistent/ld.lld")
    if not libdevice:
        os.environ["TESSERA_LIBDEVICE"] = "/nonexistent/libdevice.10.bc"
    os.environ.pop("TESSERA_DUMP", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclass(frozen=True)
class Generated:
    """What one case compiled to for one target."""

    text: str                   # PTX, AMDGCN assembly, or the NOT_COMPILED marker
    uses_libdevice: bool        # its math calls libdevice, whose bodies LLVM inlined into `text`


def compile_text(case: Case, target: str) -> Generated:
    """The PTX (NVIDIA) or AMDGCN assembly (AMD) of `case` for `target`, or the NOT_COMPILED marker."""
    from tessera import CompileError

    with text_only(case.libdevice):
        try:
            compiled = case.kernel.compile(signature=case.signature, target=target, num_warps=case.num_warps,
                                           **case.constexprs)
        except CompileError as exc:
            return Generated(NOT_COMPILED.format(type(exc).__name__), False)
    text = compiled.stages["ptx" if "ptx" in compiled.stages else "amdgcn"]
    return Generated(text, "@\"__nv_" in compiled.stages["llvm_ir"])     # llvmlite quotes the names


def toolchain() -> dict[str, str]:
    """What the text depends on beyond tessera: LLVM's version and the libdevice linked into math calls."""
    from llvmlite import binding

    from tessera.backends.nvptx import find_libdevice

    libdevice = find_libdevice()
    return {"llvm": ".".join(map(str, binding.llvm_version_info)),
            "libdevice_sha256": hashlib.sha256(libdevice.read_bytes()).hexdigest() if libdevice else "none"}


def generate(target: str, cases: list[Case] | None = None):
    """Compile every case for `target`: a `store.Golden` of what this tree emits now."""
    from .store import Golden

    golden = Golden(toolchain())
    for case in cases if cases is not None else all_cases():
        generated = compile_text(case, target)
        golden.kernels[case.name] = generated.text
        if generated.uses_libdevice:
            golden.libdevice_kernels.append(case.name)
    return golden
