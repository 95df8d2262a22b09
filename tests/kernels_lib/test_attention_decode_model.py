"""The decode bandwidth model (tessera/kernels_lib/attention_decode_model.py): it reproduces the H100 run it was
fitted to, the split count it picks keeps HBM's latency covered, and the predictions quoted in attention_decode.py
are the model's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tessera.kernels_lib import attention_decode_model as model

BENCH = dict(H=32, H_kv=8, D=128)                  # bench/attention.py's DECODE (pages of 64, bf16)
RUN9_TILE = model.Tile(rows=16, keys=64, stages=3, warps=4, conflicts=8)    # 4 warps repeating, 8-way reads
RUN9 = {4096: (32, 28.2), 16384: (33, 89.1)}        # context: (splits it launched, us measured in a graph)


def shipped_tile(unified=False) -> model.Tile:
    """The head-dim-128 plan's tile for one 16-row query group (GQA 4:1, one new token), as the op launches it."""
    torch = pytest.importorskip("torch")  # noqa: F841  (attention_decode imports torch)
    from tessera.kernels_lib.attention_decode import gpu_decode_plan
    plan = gpu_decode_plan(128, unified, "nvidia")
    return model.Tile(16, min(64, plan.keys), plan.stages, plan.num_warps(16))


@pytest.mark.parametrize("context", sorted(RUN9))
def test_the_model_reproduces_run_9(context):
    splits, measured = RUN9[context]
    got = model.modelled(model.Decode(1, context=context, **BENCH), RUN9_TILE, splits).total
    assert got == pytest.approx(measured, rel=0.05)


def test_conflict_free_reads_leave_the_run_9_plan_hbm_bound_at_long_context():
    """Without the 8-way conflicts the shared-memory stream is no longer the slowest (the swizzle's gain)."""
    cost = model.modelled(model.Decode(1, context=16384, **BENCH), RUN9_TILE._replace(conflicts=1), 33)
    assert cost.sm < cost.hbm < model.modelled(model.Decode(1, context=16384, **BENCH), RUN9_TILE, 33).sm


def test_one_warp_per_query_group_does_a_quarter_of_the_shared_memory_reads():
    """The shipped plan's warp walks keys no other warp of its program walks: per byte of K and V an SM writes
    and reads its ring once each, where 4 warps repeating the tile read it 4 times; and it issues fewer
    instructions per byte (SASS-fitted `step_instructions`: about 64 a KB against 102), though each step is
    smaller (16 keys: the one-warp tiles of more keys spill), so more programs share an SM."""
    tile, d = shipped_tile(), model.Decode(1, context=16384, **BENCH)
    assert tile.warps == 1
    assert model.SMEM_GBPS / (1 + tile.warps) > 2 * model.SMEM_GBPS / (1 + RUN9_TILE._replace(conflicts=1).warps)

    def per_kb(t):
        return t.warps * model.step_instructions(d, t) * 1024 / (2 * t.keys * BENCH["D"] * 2)
    assert per_kb(tile) < 0.7 * per_kb(RUN9_TILE)


@pytest.mark.parametrize("B, context", [(1, 4096), (1, 16384), (1, 65536), (8, 16384), (32, 16384)])
def test_the_chosen_split_count_covers_hbm_latency(B, context):
    """Little's law: the SMs given programs keep at least HBM_GBPS x LATENCY_US in flight between them, and the
    chosen count is within 2% of the best the model finds."""
    d, tile = model.Decode(B, context=context, **BENCH), shipped_tile()
    splits, in_launch = model.plan_for(d, tile)
    assert 1 <= splits <= model.MAX_SPLITS
    programs = B * BENCH["H_kv"] * splits
    per_sm = -(-programs // model.NUM_SMS)
    block = 2 * tile.keys * BENCH["D"] * 2
    in_flight = min(programs, model.NUM_SMS) * min(per_sm, 8) * (tile.stages - 1) * block
    assert in_flight >= 0.8 * model.HBM_GBPS * model.LATENCY_US * 1e3
    best = min(model.modelled(d, tile, s, in_launch=m).total for s in range(1, model.MAX_SPLITS + 1)
               for m in (True, False))
    assert model.modelled(d, tile, splits, in_launch=in_launch).total <= 1.02 * best


def test_the_predictions_quoted_in_attention_decode_are_the_models():
    """attention_decode.py's comment quotes the model at bench/attention.py's shapes; a change to the plan or
    the model must update it."""
    text = Path(__file__).resolve().parents[2].joinpath("tessera/kernels_lib/attention_decode.py").read_text()
    quoted = re.search(r"context 4096 ([\d.]+) us \((\d+)% of HBM\), 16384 ([\d.]+) us \((\d+)%\), 65536 ([\d.]+) us"
                       r"\s*#?\s*\((\d+)%\)", text)
    assert quoted, "the modelled figures are missing from attention_decode.py"
    tile = shipped_tile()
    for (us, share), context in zip(((1, 2), (3, 4), (5, 6)), (4096, 16384, 65536)):
        d = model.Decode(1, context=context, **BENCH)
        splits, in_launch = model.plan_for(d, tile)
        cost = model.modelled(d, tile, splits, in_launch=in_launch)
        assert float(quoted.group(us)) == pytest.approx(cost.total, abs=0.6), context
        assert int(quoted.group(share)) == pytest.approx(100 * cost.hbm_share, abs=1), context


@pytest.mark.parametrize("warps, keys", [(1, 16), (4, 64)])
def test_the_loop_instructions_are_the_models(warps, keys):
    """The model's per-step instruction count (`step_instructions`) against the sm_90a SASS of the decode loop
    (16 packed rows, head dim 128, no masks): the shipped one-warp tile and run 9's four-warp one."""
    from tessera.backends.nvptx import find_ptxas
    from tessera.backends.nvptx.sass import disassemble, find_cuobjdump, loop_containing
    if find_ptxas() is None or find_cuobjdump() is None:
        pytest.skip("needs ptxas and cuobjdump")
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_attention_compile import DECODE_SIGNATURE
    from tessera.kernels_lib.attention_split_kv import attention_decode_kernel
    compiled = attention_decode_kernel.compile(
        target="sm_90a", strict=True, signature=DECODE_SIGNATURE, num_warps=warps, D=128, BM=16, BN=keys,
        STAGES=2, SPLIT=True, HAS_LEFT=False, HAS_RIGHT=False, SOFTCAP=False, UNIFIED=False, FALLBACK=True)
    loop = loop_containing(disassemble(compiled.binary), "HMMA")
    tile = model.Tile(16, keys, 2, warps)
    assert len(loop) == pytest.approx(model.step_instructions(model.Decode(1, context=4096, **BENCH), tile), rel=0.15)
    assert sum(i.opcode.startswith("HMMA") for i in loop) == 2 * keys * 128 // (8 * 16)


RUN8 = Path(__file__).resolve().parents[2] / "bench/results/2026-11-26-h100-run8/results.jsonl"


def test_a_launchs_cost_is_run_8s_and_the_fixed_costs_keep_run_9s_sum():
    """LAUNCH_US is what one more small kernel cost in a CUDA graph in run 8 (8 launches against 1 of the same
    work, twice); the split kernel's fixed cost and the old combine kernel's (a launch and two dependent round
    trips) add up to the 5.3 us run 9's two rows were fitted with."""
    import json
    rows = [json.loads(line) for line in RUN8.read_text().splitlines() if '"horizontal"' in line]
    per_launch = [(r["unfused_graph_ms"] - r["fused_graph_ms"]) * 1e3 / 7 for r in rows]
    assert len(per_launch) == 2 and all(abs(x - model.LAUNCH_US) < 0.1 for x in per_launch), per_launch
    assert model.FIXED_US + model.LAUNCH_US + 2 * model.ROUND_TRIP_US == pytest.approx(5.3)


def test_the_merge_in_the_launch_trades_the_launch_for_one_programs_round_trips():
    """In the launch: the counter's atomic, then a round trip per step of splits (the max's loads go with the
    first), all by one program; the combine kernel: a launch, then one step (all splits of a row at once). With
    5 splits (B = 8 at 16384) one step holds them all and the launch's merge is the faster; with ~37 (B = 1)
    one warp takes 5 steps of 8 and the combine kernel is."""
    tile = shipped_tile()
    assert tile.warps == 1 and model.merge_chunk(4, 128, 16, 1, 37, tile.merge_registers) == 8
    wide = model.Decode(8, context=16384, **BENCH)
    assert model.merge_us(wide, tile, 5, True) == pytest.approx(2 * model.ROUND_TRIP_US)
    assert model.merge_us(wide, tile, 5, False) == pytest.approx(model.LAUNCH_US + model.ROUND_TRIP_US)
    assert model.plan_for(wide, tile) == (5, True)
    narrow = model.Decode(1, context=16384, **BENCH)
    assert model.merge_us(narrow, tile, 37, True) == pytest.approx(6 * model.ROUND_TRIP_US)
    splits, in_launch = model.plan_for(narrow, tile)
    assert not in_launch and splits == 37
    assert model.plan_for(narrow, tile, in_launch=True)[1] is True       # asked for, it plans that merge
    assert model.merge_us(narrow, tile, 1, True) == model.merge_us(narrow, tile, 1, False) == 0.0


def test_the_op_merges_with_the_models_steps():
    """The op's step of splits (what the kernels compile with) is the model's."""
    pytest.importorskip("torch")
    from tessera.kernels_lib.attention_decode import (COMBINE_REGISTERS, COMBINE_WARPS, DecodeShape,
                                                      gpu_decode_plan, merge_chunk)
    plan = gpu_decode_plan(128, False, "nvidia")
    shape = DecodeShape(1, 1, 32, 8, 128, 64, 256)
    assert merge_chunk(shape, 16, plan.num_warps(16), 37, plan.merge_registers) == 8
    assert merge_chunk(shape, 1, COMBINE_WARPS, 37, COMBINE_REGISTERS) == 64
