"""Fragment-order weights (`quant.pack(layout="fragment")`, `kernels_lib/quant_fragment.py`).

Specification:

* the permutation is a bijection: unpermuting the stored codes gives W's
  codes back, for every width, and a fragment-order weight dequantizes to
  the plain one's weight (pack, quantize, from_gptq, from_awq, with_layout);
* the kernel's re-reading of a stored (threads, L) tile (reshape -> permute ->
  reshape) is, as a layout, exactly the compiler's mma.sync B operand
  layout for the decode dot, so the dot takes the loaded registers as they
  are;
* on the interpreter the fragment-order decode kernel computes bit for bit
  what the plain one computes with the same tiles (W4A16, groups 32 and
  128, symmetric and asymmetric, act order), and the SIMT simulator agrees
  with the interpreter on sm_80;
* lowered for sm_80 / sm_90a, each thread's codes come in with 128-bit
  loads, and nothing between those loads and the mma goes through shared
  memory or shuffles; ptxas reports no spills;
* bad shapes name the fix.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tessera
from tessera.ir.target import get_target
from tessera.kernels_lib import quant
from tessera.kernels_lib.quant_fragment import DECODE_TILING, FragmentTiling
from tessera.kernels_lib.quant_gemm import Plan, fragment_plan, plan, quant_gemm, quant_gemm_kernel, quant_gemm_op
from tessera.passes.mma import mma_plan
from tessera.passes.thread_passes import lower

from test_quant_gemm import simulated_matches_interpreted  # noqa: E402

N, K = 128, 256
T = DECODE_TILING


def _codes(bits, seed=0, n=N, k=K):
    return torch.randint(0, 2 ** bits, (n, k), generator=torch.Generator().manual_seed(seed))


# -- the permutation --------------------------------------------------------------------------------


@pytest.mark.parametrize("tiling", [T, FragmentTiling(BN=32, BK=64, num_warps=2), FragmentTiling(128, 32, 4)])
def test_unpermute_undoes_permute(tiling):
    codes = _codes(8, n=2 * tiling.BN, k=3 * tiling.BK).numpy()
    stored = tiling.to_fragment_order(codes)
    assert stored.shape == (2, 3, tiling.threads, tiling.locals)
    assert np.array_equal(tiling.from_fragment_order(stored), codes)
    assert not np.array_equal(stored.reshape(codes.shape), codes)       # it does move codes


def test_thread_rows_hold_their_mma_b_fragments():
    """Row t of a stored block is thread t's B registers in order: k = 2 tid + (i & 1) (+8 for b2, b3) of
    column n = groupID of its warp's n8 fragment (PTX ISA, mma.m16n8k16 fragments), RK-major."""
    codes = np.arange(T.BN * T.BK).reshape(T.BN, T.BK)      # code = n * BK + k
    row = T.to_fragment_order(codes)[0, 0]
    lane, warp = 4 * 3 + 1, 2                               # groupID 3, tid 1
    t = warp * 32 + lane
    first = row[t, :4]                                      # k step 0, the warp's first n8 fragment
    n = warp * 8 + 3
    assert list(first) == [n * T.BK + k for k in (2, 3, 10, 11)]


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_pack_fragment_round_trips(bits):
    codes = _codes(bits)
    scales = torch.rand(N, K // 64).half()
    plain = quant.pack(codes, scales, bits=bits, group_size=64)
    frag = quant.pack(codes, scales, bits=bits, group_size=64, layout="fragment")
    assert frag.layout == "fragment" and frag.qweight.shape == plain.qweight.shape
    assert not torch.equal(frag.qweight, plain.qweight)
    assert torch.equal(frag.codes(), codes) and torch.equal(frag.dequantize(), plain.dequantize())
    assert torch.equal(frag.with_layout("plain").qweight, plain.qweight)


def test_act_order_weights_keep_their_permutation():
    g_idx = torch.randperm(K, generator=torch.Generator().manual_seed(1)) % (K // 128)
    plain = quant.pack(_codes(4), torch.rand(N, 2).half(), bits=4, group_size=128, g_idx=g_idx)
    frag = plain.with_layout("fragment")
    assert torch.equal(frag.perm, plain.perm) and torch.equal(frag.dequantize(), plain.dequantize())


def test_importers_produce_the_fragment_layout():
    from tests.kernels_lib.test_quant_gemm import _pack_int32
    group, q = 64, torch.randint(0, 16, (K, N))
    zeros, scales = torch.randint(1, 16, (K // group, N)), (torch.rand(K // group, N) * 0.1).half()
    gptq = [quant.from_gptq(_pack_int32(q, 4, 0), _pack_int32(zeros - 1, 4, 1), scales, group_size=group,
                            layout=layout) for layout in ("plain", "fragment")]
    awq = [quant.from_awq(_pack_int32(q, 4, 1, quant.AWQ_ORDER), _pack_int32(zeros, 4, 1, quant.AWQ_ORDER), scales,
                          group_size=group, layout=layout) for layout in ("plain", "fragment")]
    for plain, frag in (gptq, awq):
        assert frag.layout == "fragment" and torch.equal(frag.dequantize(), plain.dequantize())


@pytest.mark.parametrize("kwargs, message", [
    (dict(codes=_codes(4, n=96), scales=torch.ones(96, 4)), r"N \(96\) must be a multiple of 64"),
    (dict(codes=_codes(4, k=192), scales=torch.ones(N, 3)), r"K \(192\) of 128"),
    (dict(format="mxfp4"), "'fragment' for integer codes only"),
])
def test_shapes_the_fragment_order_cannot_hold_name_the_fix(kwargs, message):
    args = dict(codes=_codes(4), scales=torch.ones(N, K // 64), bits=4, group_size=64, layout="fragment") | kwargs
    with pytest.raises(ValueError, match=message):
        quant.pack(**args)


# -- the compiler sees no data movement ---------------------------------------------------------------


def test_the_reread_tile_is_the_compilers_b_operand_layout():
    """load_layout -> reshape(digits) -> permute(order) -> reshape((BN, BK)) -> .T, as layout assignment
    derives it, is the B layout the mma plan asks of the decode dot (16 x BK @ BK x BN, 4 warps)."""
    reread = T.load_layout.reshape(T.digits).permute(list(T.order)).reshape((T.BN, T.BK)).permute((1, 0))
    assert reread == T.b_layout
    args = _kernel_args(quant.quantize(torch.randn(N, K), bits=4, group_size=128).with_layout("fragment"), 3)
    module = quant_gemm_kernel.specialize(*args, **_constexprs(128, fragment=True)).module
    dot = next(op for op in module.functions[0].walk() if op.name == "dot")
    for target in ("sm_80", "sm_90a"):
        assert mma_plan(dot, get_target(target), T.num_warps).b == T.b_layout


def _weight_slice_ops(fn):
    """The thread ops that the unpacked weight codes flow through on their way to the mma (the mma excluded)."""
    start = [op for op in fn.walk() if op.name == "unpack_bits" and op.attrs["packed"] == "u4"]
    users = {}
    for op in fn.walk():
        for v in op.operands:
            users.setdefault(v, []).append(op)
    seen, todo = [], list(start)
    while todo:
        op = todo.pop()
        if op in seen or op.name == "mma":
            continue
        seen.append(op)
        todo += [u for r in op.results for u in users.get(r, [])]
    return seen


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("group", [32, 128])
def test_weights_reach_the_mma_from_128_bit_loads_in_registers(target, group):
    w = quant.quantize(torch.randn(N, K), bits=4, group_size=group, symmetric=False).with_layout("fragment")
    fn = lower(quant_gemm_kernel.specialize(*_kernel_args(w, 3), **_constexprs(group, fragment=True)).module,
               target).functions[0]
    slice_ops = _weight_slice_ops(fn)
    assert slice_ops, "the codes are not unpacked in registers"
    moves = [op.name for op in slice_ops if op.name in ("store", "shuffle", "shared_alloc", "smem_store")]
    assert not moves, f"the weights move on their way to the mma: {moves}"
    loads = [op for op in fn.walk() if op.name == "load" and op.results[0].type.element.dtype == tessera.u8]
    assert loads and all(op.attrs.get("vector") == 16 for op in loads)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("M", [1, 256])
def test_the_fragment_kernel_compiles_to_wide_loads_without_spills(target, M):
    p = fragment_plan(plan(M, 4096, 4096, 128, 132), M, 4096)
    out = "f32" if p.split_k > 1 else "f16"
    compiled = quant_gemm_kernel.compile(
        signature=f"*f16:16,*u4:16,*f16:16,*f16:16,*{out}:16,i32,i32:16,i32:16", target=target, G=128, ZEROS=True,
        HALF=8.0, BM=p.BM, BN=p.BN, BK=p.BK, SPLIT_K=p.split_k, STAGES=p.stages, num_warps=p.num_warps,
        **T.constexprs(128))
    assert compiled.metadata.get("spill_stores", 0) == 0
    if M == 1:
        ptx = compiled.stages["ptx"]
        assert len(re.findall(r"ld\.global(\.nc)?\.v4\.b32", ptx)) >= 2          # 32 bytes of codes a thread
        assert "shfl" not in ptx
        # no shared memory but x's A operand (st.shared + ldmatrix) and the split-K sum's exchange
        assert len(re.findall(r"ld\.shared", ptx)) <= 2


# -- the same products ---------------------------------------------------------------------------------


def _kernel_args(w, M, seed=0):
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).half()
    if w.perm is not None:
        x = x[:, w.perm]
    z = w.zeros if w.zeros is not None else w.scales
    codes = tessera.reinterpret(w.qweight.numpy(), getattr(tessera, f"u{w.bits}"))
    return [x.numpy(), codes, w.scales.numpy(), z.numpy(), np.zeros((M, N), np.float32), M, N, K]


def _constexprs(group, fragment, zeros=True, bits=4):
    extra = T.constexprs(group) if fragment else {}
    return dict(G=group, ZEROS=zeros, HALF=float(2 ** (bits - 1)), BM=16, BN=T.BN, BK=T.BK, SPLIT_K=2, STAGES=1,
                **extra)


def _weights(group, symmetric, act_order, bits=4):
    if act_order:
        g_idx = torch.randperm(K, generator=torch.Generator().manual_seed(2)) % (K // group)
        scales = (torch.rand(N, K // group, generator=torch.Generator().manual_seed(3)) * 0.1).half()
        zeros = None if symmetric else torch.randint(0, 16, (N, K // group)).half()
        return quant.pack(_codes(4), scales, zeros, bits=4, group_size=group, g_idx=g_idx)
    return quant.quantize(torch.randn(N, K, generator=torch.Generator().manual_seed(4)), bits=bits, group_size=group,
                          symmetric=symmetric)


@pytest.mark.parametrize("group, symmetric, act_order, bits", [
    (32, True, False, 4), (32, False, False, 4), (128, True, False, 4), (128, False, False, 4), (32, False, True, 4),
    (128, True, True, 4), (128, True, False, 8), (32, False, False, 3), (64, False, False, 2)])
def test_fragment_order_computes_the_plain_product_bit_for_bit(group, symmetric, act_order, bits):
    plain = _weights(group, symmetric, act_order, bits)
    frag = plain.with_layout("fragment")
    grid = (1, N // T.BN, 2)
    outs = []
    for w, fragment in ((plain, False), (frag, True)):
        args = _kernel_args(w, 5)
        quant_gemm_kernel[grid](*args, **_constexprs(group, fragment, zeros=w.zeros is not None, bits=bits))
        outs.append(args[4])
    assert np.array_equal(outs[0], outs[1])
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(0)).half()
    expected = x.float() @ plain.dequantize().t()
    assert (torch.from_numpy(outs[1]) - expected).abs().max() <= 2e-3 * expected.abs().max()
    assert not np.array_equal(plain.qweight.numpy(), frag.qweight.numpy())
    # the op takes the layout from the weight
    y = quant_gemm(x, frag)
    assert (y.float() - expected).abs().max() <= 2e-3 * expected.abs().max()


def test_the_op_takes_fragment_weights_above_the_decode_sizes():
    """M > 16 runs 64-row tiles over the same stored blocks (bfloat16 x here)."""
    w = quant.quantize(torch.randn(N, K), bits=4, group_size=64, symmetric=False, layout="fragment")
    x = torch.randn(40, K).bfloat16()
    expected = x.float() @ w.dequantize().t()
    assert (quant_gemm(x, w).float() - expected).abs().max() <= 1e-2 * expected.abs().max()


def test_the_fragment_constexprs_are_derived_once_per_group_size(monkeypatch):
    """The op asks for them on every call; deriving the scale layout is ~100 µs of layout algebra, so a call
    after the first derives nothing and passes the very same layout objects (the launch key then compares
    them by identity)."""
    tiling = FragmentTiling()
    first = tiling.constexprs(64)
    derived = []
    real = FragmentTiling.scale_layout
    monkeypatch.setattr(FragmentTiling, "scale_layout", lambda self, g: derived.append(g) or real(self, g))
    again = tiling.constexprs(64)
    assert derived == [] and again is first
    assert all(again[name] is first[name] for name in first)
    assert dict(tiling.constexprs(32))["SCALE_LAYOUT"] == real(tiling, 32) and derived == [32]
    with pytest.raises(TypeError):
        again["FRAGMENT"] = False               # shared between calls: read-only


def test_the_simt_simulator_agrees_on_sm_80():
    n = T.BN
    w = quant.quantize(torch.randn(n, K), bits=4, group_size=32, symmetric=False).with_layout("fragment")
    x = torch.randn(3, K, dtype=torch.float16)
    args = [x.numpy(), tessera.reinterpret(w.qweight.numpy(), tessera.u4), w.scales.numpy(), w.zeros.numpy(),
            np.zeros((3, n), np.float32), 3, n, K]
    constexprs = _constexprs(32, fragment=True)
    fn = lower(quant_gemm_kernel.specialize(*args, **constexprs).module, "sm_80").functions[0]
    simulated_matches_interpreted(fn, args, (1, 1, 2), constexprs, w)


def test_opcheck_with_a_fragment_order_weight():
    w = quant.quantize(torch.randn(N, K), bits=4, group_size=64, symmetric=False, layout="fragment")
    x = torch.randn(2, K).half()
    torch.library.opcheck(quant_gemm_op, (x, w.qweight, w.scales, w.zeros, w.perm, None, w.bits, w.group_size,
                                          w.format, w.global_scale, None, w.layout))


def test_fragment_plans_keep_the_stored_tiles():
    assert fragment_plan(Plan(16, 16, 32, 2, 1, 4), 1, K) == Plan(16, T.BN, T.BK, 2, 1, T.num_warps)
    assert fragment_plan(Plan(128, 128, 64, 1, 3, 8), 4096, 4096) == Plan(64, T.BN, T.BK, 1, 3, 4)
    assert fragment_plan(Plan(16, 64, 128, 3, 1, 4), 1, 512) == Plan(16, 64, 128, 2, 1, 4)  # 3 ∤ 4 steps
    assert fragment_plan(Plan(16, 64, 128, 4, 1, 4), 1, 4096, warp_size=64).num_warps == 2


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_fragment_order_weights_still_compile_for_amd(target):
    """AMD has no mma.sync: the same loads (128 threads: two 64-lane waves) feed MFMA through a conversion."""
    p = fragment_plan(plan(1, 4096, 4096, 128, 304), 1, 4096, warp_size=64)
    compiled = quant_gemm_kernel.compile(
        signature="*f16:16,*u4:16,*f16:16,*f16:16,*f32:16,i32,i32:16,i32:16", target=target, G=128, ZEROS=True,
        HALF=8.0, BM=p.BM, BN=p.BN, BK=p.BK, SPLIT_K=p.split_k, STAGES=p.stages, num_warps=p.num_warps,
        **T.constexprs(128))
    assert compiled.metadata.get("vgpr_spill_count", 0) == 0


def test_devices_prefer_their_layout():
    assert quant.preferred_layout("cpu") == "plain"
    w = quant.quantize(torch.randn(N, K), bits=4, group_size=128, layout="fragment")
    assert w.to("cpu").layout == "plain" and torch.equal(w.to("cpu").dequantize(), w.dequantize())
    assert T.fits(N, K, 32) and T.fits(N, K, 256) and not T.fits(96, K, 32) and not T.fits(N, K, 48)


def test_moe_stacks_refuse_the_fragment_order():
    from tessera.kernels_lib.moe.quantized import stack_int4
    w = quant.quantize(torch.randn(N, K), bits=4, group_size=128, layout="fragment")
    with pytest.raises(ValueError, match=r"with_layout\('plain'\)"):
        stack_int4([w, w])
    assert stack_int4([w.with_layout("plain")] * 2).qweight.shape[0] == 2


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16, 256])
def test_on_the_gpu_the_fragment_order_matches_the_plain_one(M):
    w = quant.quantize(torch.randn(512, 1024), bits=4, group_size=128, symmetric=False)
    frag = w.to("cuda")
    assert frag.layout == "fragment"
    x = torch.randn(M, 1024, device="cuda", dtype=torch.float16)
    expected = x.float() @ w.dequantize().cuda().t()
    y = quant_gemm(x, frag)
    assert (y.float() - expected).abs().max().item() <= 2e-3 * expected.abs().max().item()


def test_the_op_names_the_fix_for_a_weight_the_fragment_order_cannot_hold():
    w = quant.quantize(torch.randn(96, K), bits=4, group_size=128)          # plain: 96 rows are fine
    args = (torch.randn(2, K).half(), w.qweight, w.scales, None, None, None, 4, 128, "int", 1.0, None, "fragment")
    with pytest.raises(ValueError, match=r"quant_gemm \(a fragment-order weight\): N \(96\) must be a multiple"):
        quant_gemm_op(*args)
    with pytest.raises(ValueError, match="'fragment' .* serves integer weights"):
        quant_gemm_op(*args[:8], "mxfp4", *args[9:])
