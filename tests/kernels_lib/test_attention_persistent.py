"""The persistent attention forward (`attention_fwd_persistent.py`, TESSERA_ATTENTION_PERSISTENT=1): one program per
SM walking (batch, head, query-block) tiles, heaviest first under a causal mask; on sm_90a, warp-specialized, the
producer warpgroup runs the tile loop too. The SIMT simulator with fewer programs than tiles against float64
attention, the PTX's structure (mbarriers initialized once, the producer's TMA fills inside its tile loop), ptxas
without spills, the tile order, the op's plan choice and a GPU test against SDPA."""

from __future__ import annotations

import importlib
import math
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera.backends.nvptx import find_ptxas  # noqa: E402
from tessera.kernels_lib import attention  # noqa: E402
from tessera.kernels_lib.attention import OVERLAP_ENV, PERSISTENT_ENV, WS_ENV  # noqa: E402
from tessera.kernels_lib.attention import WS_GPU_PLANS, persistent_allowed  # noqa: E402
from tessera.kernels_lib.attention_fwd import LOG2E  # noqa: E402
from tessera.kernels_lib.attention_fwd_persistent import attention_fwd_persistent_kernel  # noqa: E402
from tessera.kernels_lib.attention_fwd_persistent import tile_coordinates  # noqa: E402

from attention_reference import attention as reference, nan_padded_kv  # noqa: E402

attention_module = importlib.import_module("tessera.kernels_lib.attention")
needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")

# q, k, v, o, lse, batch, Sq, Sk, H, H_KV, qk_scale, softcap, left, right, 4 x (b, s, h, d) strides, lse's
PERSISTENT_SIGNATURE = ",".join(["*{t}:16"] * 4 + ["*f32:16", "i32"] + ["i32"] * 4 + ["f32", "f32", "i32", "i32"]
                                + ["i32:16", "i32:16", "i32:16", "i32:1"] * 4 + ["i32", "i32"])
VARIANTS = {"plain": dict(HAS_LEFT=False, HAS_RIGHT=False, SOFTCAP=False),
            "window-softcap": dict(HAS_LEFT=True, HAS_RIGHT=True, SOFTCAP=True)}


def persistent_on_the_simulator(num_warps, BM, programs, causal=True, Sq=70, Sk=50, H=4, H_kv=2, ws=True,
                                overlap=False, window=(-1, -1), seed=0):
    """The persistent forward lowered for sm_90a on the SIMT simulator with `programs` programs (fewer than the
    tiles), B = 2 sequences, head dim 32: (O, LSE, the lowered function) and the float64 reference's (O, LSE).
    K and V are the first Sk rows of 64-row tensors whose other rows are NaN, so a block read past the end
    (rather than masked) would poison O."""
    from tessera.backends.simt import run_threads
    from tessera.passes.thread_passes import lower
    B, D, BN = 2, 32, 32
    left, right = window[0], 0 if causal else window[1]
    q, k, v, k_rows, v_rows = nan_padded_kv(B, Sq, Sk, H, H_kv, D, seed)
    o, lse = torch.full_like(q, float("nan")), torch.full((B, H, Sq), float("nan"))   # every tile must write
    strides = [s for x in (q, k, v, o) for s in x.stride()]
    args = [q.numpy(), k_rows.numpy(), v_rows.numpy(), o.numpy(), lse.numpy(), B, Sq, Sk, H, H_kv,
            LOG2E / math.sqrt(D), 0.0, max(left, 0), max(right, 0), *strides, *lse.stride()[:2]]
    options = dict(D=D, BM=BM, BN=BN, HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, SOFTCAP=False, STAGES=2, WS=ws,
                   OVERLAP=overlap)
    fn = lower(attention_fwd_persistent_kernel.specialize(*args, **options).module, "sm_90a", num_warps).functions[0]
    tiles = tessera.cdiv(Sq, BM) * B * H
    assert programs < tiles
    run_threads(fn, args, (programs,))
    return o, lse, fn, *reference(q, k, v, causal, window)


@pytest.mark.parametrize("causal, Sq, Sk, overlap", [(True, 70, 50, False), (False, 70, 50, False),
                                                     (True, 40, 50, False), (True, 70, 50, True),
                                                     (True, 200, 50, False), (True, 200, 50, True)])
def test_persistent_ws_forward_on_the_simt_simulator_matches_float64_attention(causal, Sq, Sk, overlap):
    """sm_90a, warp-specialized, two consumer warpgroups (BM = 128; B * H = 8 pairs: 8 tiles, 16 with Sq = 200)
    on 3 programs, so each program runs 2-6 tiles and the ring's slots and phases carry across them; GQA 2:1;
    bottom-right causal with Sq > Sk (the first Sq - Sk rows see no key: O = 0, LSE = +inf; with Sq = 200 the
    whole first m-block, whose tiles run no key iteration between tiles that do) and Sq < Sk."""
    o, lse, fn, expected_o, expected_lse = persistent_on_the_simulator(8, 128, 3, causal, Sq, Sk, overlap=overlap)
    assert fn.attrs["num_threads"] == 8 * 32 + 128
    torch.testing.assert_close(o.double(), expected_o, rtol=2e-3, atol=2e-3)
    if causal and Sq > Sk:
        assert torch.isinf(lse[:, :, :Sq - Sk]).all()
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-4, atol=1e-4)


def test_persistent_forward_without_ws_on_the_simt_simulator_matches_float64_attention():
    """The same tile loop around the software-pipelined (not specialized) key loop, one warpgroup, 5 programs."""
    o, lse, _, expected_o, expected_lse = persistent_on_the_simulator(4, 64, 5, ws=False, window=(20, -1))
    torch.testing.assert_close(o.double(), expected_o, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-4, atol=1e-4)


@tessera.kernel
def decode_tiles_kernel(out_ptr, num_m, pairs, HEAVIEST_FIRST: tessera.constexpr):
    """Writes the persistent kernel's (m-block, pair) of tile index program_id(0) to out[2t], out[2t + 1]."""
    t = tessera.program_id(0)
    pid_m, bh = tile_coordinates(t, num_m, pairs, HEAVIEST_FIRST)
    tessera.store(out_ptr + 2 * t, pid_m)
    tessera.store(out_ptr + 2 * t + 1, bh)


def visit_order(num_m, pairs, heaviest_first):
    """The (m-block, pair) of every tile index, from the kernel's own decode run on the interpreter."""
    out = np.full(2 * num_m * pairs, -1, np.int32)
    decode_tiles_kernel[(num_m * pairs,)](out, num_m, pairs, HEAVIEST_FIRST=heaviest_first)
    return [tuple(int(x) for x in pair) for pair in out.reshape(-1, 2)]


@pytest.mark.parametrize("causal", [True, False])
def test_every_tile_once_and_causal_heaviest_first(causal, monkeypatch):
    """Run on the interpreter through the op with TESSERA_ATTENTION_PERSISTENT=1 (CPU: 4 programs, fewer than the
    tiles) O and LSE match float64 attention;
    causal: the kernel's decode (run on the interpreter) gives the m-blocks in descending order, so the first
    wave of tiles is the heaviest; not causal: the m-blocks of one (batch, head) pair are adjacent."""
    from test_attention import check, qkv
    monkeypatch.setenv(PERSISTENT_ENV, "1")
    q, k, v = qkv(2, 70, 50, 4, 2, 32, seed=3)
    out, lse = attention(q, k, v, causal=causal)
    check(out, lse, *reference(q, k, v, causal))
    order = visit_order(5, 8, causal)
    assert sorted(order) == [(m, p) for m in range(5) for p in range(8)]
    if causal:
        assert [m for m, _ in order] == sorted((m for m, _ in order), reverse=True) and order[0][0] == 4
    else:
        assert order[:5] == [(m, 0) for m in range(5)]


def test_the_op_launches_the_persistent_kernel_only_when_asked(monkeypatch):
    calls = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **options: calls.append((grid, options))

    monkeypatch.setattr(attention_module, "attention_fwd_persistent_kernel", Recorder())
    from test_attention import qkv
    q, k, v = qkv(2, 70, 50, 4, 2, 32, seed=0)
    monkeypatch.delenv(PERSISTENT_ENV, raising=False)
    attention_module._forward(q, k, v, attention_module.Problem.of(q, k, None, None, 70, 50, True, -1, -1, 0.0, None))
    assert calls == []
    monkeypatch.setenv(PERSISTENT_ENV, "1")
    attention_module._forward(q, k, v, attention_module.Problem.of(q, k, None, None, 70, 50, True, -1, -1, 0.0, None))
    (grid, options), = calls
    assert grid == (min(5 * 8, attention_module.CPU_NUM_SMS),) and options["WS"] is False
    monkeypatch.setenv(PERSISTENT_ENV, "yes")
    with pytest.raises(ValueError, match=PERSISTENT_ENV):
        attention_module._forward(q, k, v, attention_module.Problem.of(q, k, None, None, 70, 50, True, -1, -1, 0.0,
                                                                       None))


def test_which_gpu_plans_have_a_persistent_form():
    """The warp-specialized plans, in either loop order; not the plain plan (no producer to run ahead), not
    ping-pong (the lowering refuses it in a tile loop); any plan on the interpreter."""
    import dataclasses
    ws = WS_GPU_PLANS[128]
    assert persistent_allowed(ws, False) and persistent_allowed(dataclasses.replace(ws, overlap=True), False)
    assert not persistent_allowed(dataclasses.replace(ws, overlap=True, pingpong=True), False)
    assert not persistent_allowed(dataclasses.replace(ws, ws=False), False)
    assert persistent_allowed(attention_module.CPU_PLAN, True)


def compile_persistent(D, variant, overlap=False):
    plan = WS_GPU_PLANS[D]
    return attention_fwd_persistent_kernel.compile(
        target="sm_90a", strict=True, signature=PERSISTENT_SIGNATURE.format(t="bf16"), num_warps=plan.num_warps,
        D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages, WS=True, OVERLAP=overlap, **VARIANTS[variant])


def enclosing_loops(lines: list[str], k: int) -> list[str]:
    """The `for` lines of printed thread IR `lines` that enclose line k (by indentation; a region's argument
    line, `^(...)`, is indented as its op)."""
    loops, depth = [], len(lines[k]) - len(lines[k].lstrip())
    for line in reversed(lines[:k]):
        if line.lstrip().startswith("^("):
            continue
        indent = len(line) - len(line.lstrip())
        if indent < depth:
            depth = indent
            if re.search(r"(= |^\s*)for ", line):
                loops.append(line.strip())
    return loops


def tma_maps_in_ptx(compiled, lines: list[str]) -> dict[str, str]:
    """PTX register -> tensor map name ('q', 'k', ...): `mov.b64 %rdA, <param>; cvta.param.u64 %rdB, %rdA`."""
    names = {f"_param_{m['param']};": m["pointer"].removesuffix("_ptr") for m in compiled.metadata["tensor_maps"]}
    params = {}
    for line in lines:
        if (m := re.search(r"mov\.b64\s+(%rd\d+), \w+(_param_\d+;)", line)) and m.group(2) in names:
            params[m.group(1)] = names[m.group(2)]
        elif (m := re.search(r"cvta\.param\.u64\s+(%rd\d+), (%rd\d+);", line)) and m.group(2) in params:
            params[m.group(1)] = params[m.group(2)]
    return params


def assert_first_k_before_q_empty(compiled, producer: list[str], overlap: bool) -> None:
    """FlashAttention-3's producer order in the PTX of the producer branch (`producer`) and in the thread IR: the
    tile's first K TMA comes before the wait for Q's release (the last mbarrier wait before Q's TMA), and with the
    overlapped order V_hi-1's TMA after the K loop's fills."""
    maps = tma_maps_in_ptx(compiled, compiled.stages["ptx"].splitlines())
    issues = [(i, maps[m.group(1)]) for i, line in enumerate(producer)
              if (m := re.search(r"cp\.async\.bulk\.tensor\.\w+\.shared\S* \[%rd\d+\], \[(%rd\d+),", line))]
    q = next(i for i, name in issues if name == "q")
    q_empty = max(i for i, line in enumerate(producer[:q]) if "mbarrier.try_wait" in line)
    first_k = next(i for i, name in issues if name == "k")
    assert first_k < q_empty, "PTX: the tile's first K load before the wait for Q's release"
    # the thread IR, in program order: the producer's tile loop body, the K loop's ops left out
    thread_ir = compiled.stages["thread_ir"].splitlines()
    split = next(k for k, line in enumerate(thread_ir) if "setmaxnreg" in line and '"inc"' in line)
    events = [(k, line) for k, line in enumerate(thread_ir[:split])
              if len(enclosing_loops(thread_ir, k)) == 1 and ("tma_load" in line or "mbarrier_wait" in line)]
    names = [re.search(r"%(\w+)_ptr_tma", line).group(1) if "tma_load" in line else "wait" for _, line in events]
    q = names.index("q")
    q_empty = max(i for i in range(q) if names[i] == "wait")
    assert "k" in names[:q_empty], f"thread IR: the first K load before Q's release wait: {names}"
    if overlap:     # V_hi-1 last, after the K loop (whose fills are the lines between)
        loop_end = max(k for k, line in enumerate(thread_ir[:split]) if "tma_load" in line
                       and len(enclosing_loops(thread_ir, k)) == 2)
        assert names[-1] == "v" and events[-1][0] > loop_end, f"thread IR: V_hi-1 after the K loop: {names}"
        boxes = len(names) - len("".join("v" if n == "v" else "." for n in names).rstrip("v"))
        assert names[-boxes - 1] == "wait", f"thread IR: V_hi-1's load behind the wait for its release: {names}"


PERSISTENT_PLANS = [(D, variant, overlap) for D in sorted(WS_GPU_PLANS) for variant in VARIANTS
                    for overlap in (False, True)]


@needs_ptxas
@pytest.mark.parametrize("D, variant, overlap", PERSISTENT_PLANS)
def test_persistent_ws_plans_compile_without_spills_with_the_producer_running_the_tile_loop(D, variant, overlap):
    """sm_90a, 384 threads, every plan the op may launch persistent: the mbarriers are initialized once, before
    the split (no mbarrier.init inside a loop); the producer's one thread issues K's and V's TMA fills inside
    its K loop inside its own tile loop, and in its tile loop, outside the K loop, the tile's first fill, Q's
    (with the overlapped order also the peeled first K block's and the last V block's), in FlashAttention-3's
    order (`schedule/tile_operands.py`); the consumers issue no TMA load (no `ld.global` at all); ptxas spills
    nothing."""
    compiled = compile_persistent(D, variant, overlap)
    metadata, ptx = compiled.metadata, compiled.stages["ptx"]
    assert metadata["num_threads"] == 384
    assert metadata["spill_stores"] == metadata["spill_loads"] == 0, metadata["log"]
    lines = ptx.splitlines()
    dec = next(i for i, line in enumerate(lines) if "setmaxnreg.dec.sync.aligned.u32 \t40;" in line)
    inc = next(i for i, line in enumerate(lines) if "setmaxnreg.inc.sync.aligned.u32 \t232;" in line)
    inits = [i for i, line in enumerate(lines) if "mbarrier.init" in line]
    assert inits and max(inits) < dec, "every mbarrier initialized before the split"
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^(\$?\w+):", line.strip()))}
    backward = [(labels[m.group(1)], i) for i, line in enumerate(lines)
                if (m := re.search(r"\bbra(?:\.uni)?\s+(\$?\w+);", line)) and labels.get(m.group(1), i + 1) < i]
    assert all(not lo <= j <= hi for j in inits for lo, hi in backward), "no mbarrier.init inside a loop"
    tma = [i for i, line in enumerate(lines) if "cp.async.bulk.tensor.4d.shared" in line and dec < i < inc]
    assert len(tma) == (D // 64) * (7 if overlap else 5), \
        "the producer's TMA: K and V fills (a tile's first one peeled), Q (and K_lo, V_hi-1)"
    # the thread IR (structured): the producer's TMA fills sit in a `for` (the K loop) in a `for` (the tiles),
    # Q's load (and K_lo's, V_hi-1's) and the tile's first K/V fill in the tile loop only; the consumers issue none
    thread_ir = compiled.stages["thread_ir"].splitlines()
    split = next(k for k, line in enumerate(thread_ir) if "setmaxnreg" in line and '"inc"' in line)
    maps = {}                               # (role, loops around the load) -> the maps its TMA loads use
    for k, line in enumerate(thread_ir):
        if "tma_load" in line:
            where = ("producer" if k < split else "consumers", len(enclosing_loops(thread_ir, k)))
            maps.setdefault(where, set()).add(re.search(r"%(\w+)_ptr_tma", line).group(1))
    assert maps.pop(("producer", 2)) == {"k", "v"}, "K and V filled in the K loop in the tile loop"
    assert maps.pop(("producer", 1)) == {"q", "k", "v"}, "Q, the first K/V fill (K_lo, V_hi-1) once a tile"
    assert maps == {}, maps
    assert "ld.global" not in ptx
    consumers = [line for line in lines[inc:] if "cp.async.bulk.tensor.4d.shared" in line]
    assert consumers == [], "no TMA load issued by the consumers (V_hi-1 is the producer's)"
    assert_first_k_before_q_empty(compiled, lines[dec:inc], overlap)
    assert "cp.async.bulk.tensor.4d.global.shared::cta" in "\n".join(lines[inc:]), "O by TMA store"


@pytest.mark.gpu
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", sorted(WS_GPU_PLANS))
def test_persistent_forward_matches_sdpa_on_hopper(D, causal, overlap, monkeypatch):
    """On an H100 with TESSERA_ATTENTION_PERSISTENT=1 and WS=1: ~4 tiles per SM (B = 4, H = 16, 2k queries), and
    Sq < Sk bottom-right causal, against torch's SDPA in float32; FlashAttention-2's order and the overlapped one
    (whose peeled K and last V blocks the producer loads in groups of their own: `schedule/tile_operands.py`)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper GPU")
    monkeypatch.setenv(PERSISTENT_ENV, "1")
    monkeypatch.setenv(WS_ENV, "1")
    monkeypatch.setenv(OVERLAP_ENV, "1" if overlap else "0")
    for Sq, Sk in ((2048, 2048), (1000, 1536)):
        q = torch.randn(4, Sq, 16, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(4, Sk, 8, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out, _ = attention(q, k, v, causal=causal)
        qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))
        kf, vf = kf.repeat_interleave(2, dim=1), vf.repeat_interleave(2, dim=1)
        mask = None
        if causal:
            mask = torch.ones(Sq, Sk, dtype=torch.bool, device="cuda").tril(Sk - Sq)
        expected = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask).transpose(1, 2)
        torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
