"""The fused GEMM (`gemm(..., epilogue=fn)`, kernels_lib/gemm_fused.py) runs the plain GEMM's plan plus the
epilogue (issue 18: on an H100 it ran 3x slower than the plain GEMM, because its epilogue spilled at the plain
GEMM's 128 x 128 tile and the tuner, offered only the common configs, fell back to 128 x 64 and 64 x 64 tiles).

Specification:

* the fused kernel tunes over the plain GEMM's configs with its prune and model, so for every shape it
  predicts the plain GEMM's config, and `gemm.pin_config` pins both; only with a prologue (which transforms
  each block in registers before the dot) are tiles over 128 x 128 pruned, since they do not compile, and
  the largest tile left compiles for sm_90a; with an epilogue, the untimed model (which compiles nothing)
  stays within 128 x 128, the largest tile bench/fusion.py's GELU + dropout epilogue compiles at (the 128 x 256
  tiles, persistent warp-specialized included, exceed the compiler's unroll limit: tuning, which compiles
  every config, drops them), and the largest tile it may pick compiles for sm_90a without spills;
* on sm_90a, with bench/fusion.py's bias + GELU + residual + dropout epilogue, the fused kernel at the plain
  GEMM's 128 x 128 config keeps the plain K loop (the same SASS opcodes: HGMMAs, TMA loads, mbarrier waits),
  spills nothing and needs at most 128 registers (two programs per SM, as the plain GEMM), and stores C with
  TMA (one store per epilogue slice, no thread st.global);
* the epilogue runs on EPILOGUE_COLUMNS-wide column slices of the accumulator (`column_slices`): on the tile
  interpreter and on the SIMT simulator of the sm_90a lowering (wgmma accumulator, sliced in registers, TMA
  stores), a sliced epilogue with row/column indices, operand blocks and a second output computes what numpy
  does.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tessera
from tessera.backends.interp import run_function
from tessera.backends.nvptx.sass import disassemble
from tessera.backends.simt import run_threads
from tessera.kernels_lib import gemm_configs, gemm_fused
from tessera.kernels_lib.gemm import CONFIGS, gemm_kernel, gemm_kernel_fast, pin_config
from tessera.kernels_lib.gemm_fused import gemm_fused_kernel, gemm_fused_kernel_fast
from tessera.kernels_lib.gemm_fusion import fast_math_allows
from tessera.passes.thread_passes import lower

import fusion_hooks as hooks
from hopper_gemm import compile_gemm, needs_ptxas, needs_sass, sass_k_loop

BENCH_SHAPES = [(4096, 4096, 4096), (8192, 4096, 1024), (8192, 8192, 8192), (512, 1024, 256)]


@pytest.mark.parametrize("fused", [gemm_fused_kernel, gemm_fused_kernel_fast])
def test_the_fused_kernel_tunes_over_the_plain_gemms_configs_with_its_prune_and_model(fused):
    plain = gemm_kernel.tuner
    assert fused.tuner.configs == plain.configs == gemm_configs.ALL
    assert plain.prune is gemm_configs.prune_for_device and fused.tuner.prune is gemm_fused.prune_fused
    assert plain.model is gemm_configs.predicted and fused.tuner.model is gemm_fused.predicted_fused
    no_prologue = {"M": 64, "N": 64, "K": 64, "PROLOGUE_A": None, "PROLOGUE_B": None}
    assert gemm_fused.prune_fused(gemm_configs.ALL, no_prologue) == plain.prune(gemm_configs.ALL, no_prologue)


@pytest.mark.parametrize("hook", ["PROLOGUE_A", "PROLOGUE_B"])
def test_with_a_prologue_the_fused_kernel_never_picks_a_tile_too_big_to_compile(hook):
    hopper = gemm_configs.configs_for("sm_90")
    named = {"M": 8192, "N": 8192, "K": 8192, "PROLOGUE_A": None, "PROLOGUE_B": None, hook: hooks.dequantize_int8}
    kept = gemm_fused.prune_fused(hopper, named)
    assert max(c.kwargs["BM"] * c.kwargs["BN"] for c in hopper) > gemm_fused.MAX_PROLOGUE_TILE    # something to drop
    assert kept and all(c.kwargs["BM"] * c.kwargs["BN"] <= gemm_fused.MAX_PROLOGUE_TILE for c in kept)
    assert gemm_configs.predicted(kept, named) in kept


def test_the_largest_tile_a_prologue_keeps_compiles_for_sm_90a():
    needs_ptxas()
    from test_gemm_fusion import DEQUANT_AND_DROPOUT, compile_fused, fused_signature
    named = {"M": 8192, "N": 8192, "K": 8192, "PROLOGUE_A": None, "PROLOGUE_B": hooks.dequantize_int8}
    kept = gemm_fused.prune_fused(gemm_configs.configs_for("sm_90"), named)
    largest = max(kept, key=lambda c: (c.kwargs["BM"] * c.kwargs["BN"], c.kwargs["BK"]))
    signature = fused_signature("f16", b_dtype="i8").replace("f32,f32,i32,i32", "i32,f32,i32,i32")
    compiled = compile_fused("sm_90a", largest, DEQUANT_AND_DROPOUT, signature)
    assert compiled.metadata["spill_stores"] == 0


# shapes where the plain GEMM's model picks 128 x 256 (one wave of 132 tiles, or fewer padded waves)
WIDE_TILE_SHAPES = [(16896, 256, 4096), (8448, 8192, 1024), (4096, 33792, 512)]


@pytest.mark.parametrize("M, N, K", WIDE_TILE_SHAPES)
def test_with_an_epilogue_the_untimed_model_stays_within_128x128(M, N, K):
    hopper = gemm_configs.configs_for("sm_90")
    plain = {"M": M, "N": N, "K": K}
    assert gemm_configs.predicted(hopper, plain).kwargs["BN"] == 256          # something to stay away from
    named = {**plain, "EPILOGUE": hooks.bias_gelu_tanh_residual_dropout, "PROLOGUE_A": None, "PROLOGUE_B": None}
    chosen = gemm_fused.predicted_fused(gemm_fused.prune_fused(hopper, named), named)
    assert chosen.kwargs["BM"] * chosen.kwargs["BN"] <= gemm_fused.MAX_MODEL_EPILOGUE_TILE
    assert gemm_fused.predicted_fused(hopper, plain) == gemm_configs.predicted(hopper, plain)   # no hook: same


def test_the_bench_epilogue_fits_the_largest_tile_the_model_may_pick_and_not_128x256():
    """What `MAX_MODEL_EPILOGUE_TILE` rests on: bench/fusion.py's epilogue (tanh GELU, residual, Philox dropout)
    compiles for sm_90a without spills at the model's largest tile, and the compiler refuses the 128 x 256
    persistent warp-specialized tile (its unroll limit), which timed tuning therefore drops."""
    needs_ptxas()
    hopper = gemm_configs.configs_for("sm_90")
    allowed = [c for c in hopper if c.kwargs["BM"] * c.kwargs["BN"] <= gemm_fused.MAX_MODEL_EPILOGUE_TILE]
    largest = max(allowed, key=lambda c: (c.kwargs["BM"] * c.kwargs["BN"], c.kwargs["BK"], c.kwargs["STAGES"]))
    compiled = compile_bench_fused(largest)
    assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0
    wide = next(c for c in hopper if gemm_configs.is_persistent_specialized(c) and not gemm_configs.is_clustered(c))
    assert wide.kwargs["BM"] * wide.kwargs["BN"] > gemm_fused.MAX_MODEL_EPILOGUE_TILE
    with pytest.raises(tessera.CompileError, match="unrolls to about"):
        compile_bench_fused(wide)


@pytest.mark.parametrize("M, N, K", BENCH_SHAPES)
def test_for_each_shape_the_fused_kernel_predicts_the_plain_gemms_config(M, N, K):
    named = {"M": M, "N": N, "K": K}
    hopper = gemm_configs.configs_for("sm_90")
    assert gemm_fused_kernel.tuner.predict(named, "cpu") == gemm_kernel.tuner.predict(named, "cpu")
    assert gemm_configs.predicted(hopper, named) in gemm_fused_kernel.tuner.configs


def test_pin_config_pins_the_fused_kernel_too():
    try:
        pin_config(CONFIGS[0])
        kernels = (gemm_kernel, gemm_kernel_fast, gemm_fused_kernel, gemm_fused_kernel_fast)
        assert all(k.tuner.pinned == CONFIGS[0] for k in kernels)
    finally:
        pin_config(None)
    assert gemm_fused_kernel.tuner.pinned is None and gemm_fused_kernel_fast.tuner.pinned is None


def test_bfloat16_and_float16_outputs_run_the_fast_math_kernel():
    torch = pytest.importorskip("torch")
    bf16, f16, f32 = (torch.empty(2, 2, dtype=d) for d in (torch.bfloat16, torch.float16, torch.float32))
    assert fast_math_allows(bf16, ()) and fast_math_allows(f16, (bf16,))
    assert not fast_math_allows(f32, ()) and not fast_math_allows(bf16, (f32,))   # a float32 output stays exact
    assert gemm_fused_kernel_fast.kernel.fast_math and not gemm_fused_kernel.kernel.fast_math


# -- the machine code on sm_90a --------------------------------------------------------------------------------

def bench_signature():
    """gemm_fused_kernel's parameters as bench/fusion.py launches it: bf16 a, b, c; bias and residual in the
    first two tensor slots (the others c); scalars seed (int), p (float), n_cols (int), 0."""
    params = ["*bf16:16"] * 3 + ["i32:16"] * 3 + ["i32:16", "i32:1"] * 3
    params += ["*bf16:16"] * 6 + ["i32:16", "i32:1"] * 6 + ["i32:16", "f32", "i32:16", "i32:16"]
    params += ["*bf16:16"] * 2 + ["i32:16", "i32:1"] * 2 + ["*bf16:16"]
    return ",".join(params)


BENCH_EPILOGUE = dict(EPILOGUE=hooks.bias_gelu_tanh_residual_dropout, EP_ORDER=(0, 1, 6, 7, 8, 10, 11),
                      PROLOGUE_A=None, PA_ORDER=(), PROLOGUE_B=None, PB_ORDER=(),
                      SPECS=(("epilogue", False, True), ("epilogue", True, True), None, None, None, None),
                      N_OUT=0, GATHER_A=False)


def compile_bench_fused(config, kernel=gemm_fused_kernel_fast, **changes):
    """What bench/fusion.py runs (bf16 out: the fast-math kernel) with `config`."""
    return kernel.kernel.compile(signature=bench_signature(), target="sm_90a", num_warps=config.num_warps,
                                            **BENCH_EPILOGUE, **config.kwargs, **changes)


MAIN_LOOP_OPCODES = ("HGMMA", "UTMALDG", "SYNCS", "WARPGROUP", "BAR", "WARPSYNC")


def k_loop(compiled) -> tuple[list[str], int]:
    """The K loop's tensor-core, TMA and synchronization instructions in order (with their modifiers: HGMMA's
    shape), and its length; the scalar bookkeeping around them may differ by a register move."""
    loop = sass_k_loop(compiled)
    return [i.opcode for i in loop if i.opcode.startswith(MAIN_LOOP_OPCODES)], len(loop)


def test_the_bench_epilogue_keeps_the_plain_k_loop_without_spills_on_sm_90a():
    needs_sass()
    config = CONFIGS[0]                     # bench/gemm.py --pin 0: 128 x 128, 8 warps, 3 stages
    fused, plain = compile_bench_fused(config), compile_gemm(config)
    assert fused.metadata["spill_stores"] == fused.metadata["spill_loads"] == 0
    assert fused.metadata["registers"] <= 128, fused.metadata["registers"]     # two programs per SM
    (fused_ops, fused_length), (plain_ops, plain_length) = k_loop(fused), k_loop(plain)
    assert fused_ops == plain_ops and abs(fused_length - plain_length) <= 4, (fused_ops, plain_ops)
    fused_ptx, plain_ptx = fused.stages["ptx"], plain.stages["ptx"]
    for pattern in (r"wgmma\.mma_async", r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global",
                    r"wgmma\.wait_group\.sync\.aligned\s+1;"):
        assert len(re.findall(pattern, fused_ptx)) == len(re.findall(pattern, plain_ptx)) > 0, pattern
    assert "st.global" not in fused_ptx and "mma.sync" not in fused_ptx and "cp.async.cg" not in fused_ptx
    slices = config.kwargs["BN"] // gemm_fused.EPILOGUE_COLUMNS
    sass = [i.opcode for i in disassemble(fused.cubin)]
    assert sum(op.startswith("UTMASTG") for op in sass) == slices
    # fast math: the epilogue's division by (1 - p) has no IEEE slow path per element (FCHK, a call, a branch)
    assert not any(op.startswith(("FCHK", "CALL")) for op in sass)
    exact = [i.opcode for i in disassemble(compile_bench_fused(config, gemm_fused_kernel).cubin)]
    assert sum(op.startswith("FCHK") for op in exact) == 64               # one per accumulator element


def test_the_whole_tile_at_once_is_what_spilled():
    """The measurement behind EPILOGUE_COLUMNS: the same epilogue over the whole 128 x 128 tile spills."""
    needs_ptxas()
    whole = compile_bench_fused(CONFIGS[0], EPI_BN=CONFIGS[0].kwargs["BN"])
    assert whole.metadata["spill_stores"] > 0


# -- the slices compute what numpy does ------------------------------------------------------------------------

SEED, P = 1234, 0.25


def fused_args(M, N, K, seed=0):
    """Arguments of gemm_fused_kernel for `residual_dropout_and_pre`: f16 a, b; f32 c and the second output;
    bias (N,) and residual (M, N) in the first two tensor slots."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    bias = rng.standard_normal(N).astype(np.float32)
    residual = rng.standard_normal((M, N)).astype(np.float32)
    c, pre = np.full((M, N), np.nan, np.float32), np.full((M, N), np.nan, np.float32)
    tensors = [bias, residual] + [c] * 4
    strides = [0, 1, N, 1] + [0, 0] * 4
    return [a, b, c, M, N, K, K, 1, N, 1, N, 1, *tensors, *strides, SEED, P, N, 0, pre, c, N, 1, N, 1, c]


PRE = 34                    # fused_args' index of the second output (y0)
SLICED = dict(EPILOGUE=hooks.residual_dropout_and_pre, EP_ORDER=(0, 1, 6, 7, 8, 10, 11), PROLOGUE_A=None,
              PA_ORDER=(), PROLOGUE_B=None, PB_ORDER=(),
              SPECS=(("epilogue", False, True), ("epilogue", True, True), None, None, None, None), N_OUT=1,
              GATHER_A=False)
SMALL = tessera.Config({"BM": 64, "BN": 64, "BK": 32, "GROUP_M": 2, "PERSISTENT": False, "STAGES": 2}, num_warps=4)


def check_against_numpy(args, out, pre):
    a, b, bias, residual = args[0], args[1], args[12], args[13]
    expected_pre = a.astype(np.float32) @ b.astype(np.float32) + bias + residual
    np.testing.assert_allclose(pre, expected_pre, rtol=1e-4, atol=1e-3)
    kept = out != 0
    assert 0.6 < kept.mean() < 0.9
    np.testing.assert_allclose(out[kept], (expected_pre / (1 - P))[kept], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("M, N, persistent", [(96, 128, False), (64, 80, False), (160, 128, True)])
def test_a_sliced_epilogue_computes_what_numpy_does_on_the_interpreter_and_the_simt_simulator(M, N, persistent):
    K = 64
    config = {**SMALL.kwargs, "PERSISTENT": persistent}
    constexprs = {**SLICED, **config}
    assert SMALL.kwargs["BN"] // gemm_fused.EPILOGUE_COLUMNS == 4          # four slices per tile
    tiles = -(-M // 64) * -(-N // 64)
    grid = (2,) if persistent else (tiles,)                 # persistent: each program takes several tiles
    interpreted = fused_args(M, N, K)
    module = gemm_fused_kernel.kernel.specialize(*interpreted, **constexprs).module
    run_function(module.functions[0], interpreted, grid)
    check_against_numpy(interpreted, interpreted[2], interpreted[PRE])
    simulated = fused_args(M, N, K)
    fn = lower(module, "sm_90a", SMALL.num_warps).functions[0]
    names = [op.name for op in fn.walk()]
    assert "wgmma" in names and names.count("tma_store") == 2 * 4        # C and the second output, per slice
    run_threads(fn, simulated, grid)
    np.testing.assert_allclose(simulated[2], interpreted[2], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(simulated[PRE], interpreted[PRE], rtol=1e-5, atol=1e-4)
