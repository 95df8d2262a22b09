"""tessera::attention_decode (tessera/kernels_lib/attention_decode.py): attention of new queries over a paged KV
cache, split along the keys and combined, with the online softmax or FlashDecoding++'s unified max (and its
fallback), on the CPU interpreter against float64 attention over the gathered cache."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tessera.kernels_lib import attention_decode  # noqa: E402

from attention_reference import attention as reference  # noqa: E402
from test_attention import check  # noqa: E402


def paged_case(seqlens, Sq=1, H=4, H_kv=2, D=16, page=16, dtype=torch.float16, seed=0):
    """q, k_cache, v_cache, block_table (pages of each sequence, shuffled over the cache), cache_seqlens."""
    g = torch.Generator().manual_seed(seed)
    per_sequence = max(-(-s // page) for s in seqlens) + 1
    pages = len(seqlens) * per_sequence + 2
    k_cache = torch.randn(pages, page, H_kv, D, generator=g).to(dtype)
    v_cache = torch.randn(pages, page, H_kv, D, generator=g).to(dtype)
    table = torch.randperm(pages, generator=g)[:len(seqlens) * per_sequence].reshape(len(seqlens), -1).int()
    q = torch.randn(len(seqlens), Sq, H, D, generator=g).to(dtype)
    return q, k_cache, v_cache, table, torch.tensor(seqlens, dtype=torch.int32)


def expected(q, k_cache, v_cache, table, seqlens, causal=True, window=(-1, -1), softcap=0.0):
    """(O, LSE) of each sequence against its own pages, gathered."""
    outs, lses = [], []
    for b, length in enumerate(seqlens.tolist()):
        k = k_cache[table[b].long()].flatten(0, 1)[:length][None]
        v = v_cache[table[b].long()].flatten(0, 1)[:length][None]
        out, lse = reference(q[b:b + 1], k, v, causal, window, softcap)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


CASES = {   # seqlens, case options, op options
    "one-token-gqa-split-in-3": ([37, 1, 70], {}, {"num_splits": 3}),
    "empty-sequence-one-split": ([0, 45], {"Sq": 2, "H_kv": 1, "page": 32}, {"num_splits": 1}),
    "more-splits-than-blocks": ([5, 40], {"Sq": 3, "H": 2}, {"num_splits": 8}),
    "24-packed-rows-in-two-programs": ([50], {"Sq": 3, "H": 16, "H_kv": 2}, {"num_splits": 2}),
    "not-causal-splits-chosen": ([33, 64], {"H": 4, "H_kv": 4, "page": 32}, {"causal": False}),
    "sliding-window": ([60, 20], {"Sq": 2}, {"window": 9, "num_splits": 2}),
    "softcap": ([41], {"H": 8, "H_kv": 1}, {"softcap": 4.0, "num_splits": 2}),
    "bfloat16": ([30, 17], {"dtype": torch.bfloat16, "D": 32}, {"num_splits": 2}),
    "pages-of-64-partly-filled": ([1, 65, 130], {"page": 64, "H": 2, "H_kv": 1}, {"num_splits": 2}),
    "pages-of-128-gqa-8": ([129, 300], {"page": 128, "H": 8, "H_kv": 1}, {"num_splits": 3}),
    "pages-of-256-mqa-16": ([257, 90], {"page": 256, "H": 16, "H_kv": 1}, {"num_splits": 4}),
    "unified-max-gqa-split-in-3": ([37, 1, 70], {}, {"num_splits": 3, "unified_max": 2.0}),
    "unified-max-lengths-0-and-1": ([0, 1, 16], {"Sq": 1, "H": 8, "H_kv": 2}, {"num_splits": 2, "unified_max": 1.0}),
    "unified-max-window": ([60, 20], {"Sq": 2}, {"window": 9, "num_splits": 2, "unified_max": 2.0}),
    "unified-max-is-the-softcap": ([41], {"H": 8, "H_kv": 1}, {"softcap": 4.0, "unified_max": 4.0}),
    "unified-max-bfloat16": ([30, 17], {"dtype": torch.bfloat16, "D": 32}, {"unified_max": 0.0}),
    "unified-max-24-packed-rows-not-causal": ([50, 3], {"Sq": 3, "H": 16, "H_kv": 2}, {"causal": False,
                                                                                       "unified_max": 1.0}),
    "unified-max-far-too-low-falls-back": ([37, 50], {"H": 4}, {"num_splits": 2, "unified_max": -30.0}),
    "unified-max-far-too-high-falls-back": ([37, 5], {"Sq": 2}, {"num_splits": 2, "unified_max": 40.0}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_float64_attention_over_the_gathered_cache(name):
    seqlens, case, options = CASES[name]
    tensors = paged_case(seqlens, **case, seed=len(name))
    out, lse = attention_decode(*tensors, **options)
    window = options.get("window", -1)
    assert out.shape == tensors[0].shape and lse.shape == (len(seqlens), tensors[0].shape[2], tensors[0].shape[1])
    check(out, lse, *expected(*tensors, options.get("causal", True), (window, window), options.get("softcap", 0.0)))


GPU_PLAN_CASES = {  # seqlens, case options, op options: every shipped tile's shapes, on the interpreter
    "pages-of-16-gqa-4": ([37, 70], {"page": 16, "H": 8, "H_kv": 2}, {"num_splits": 3}),
    "pages-of-64-gqa-4-not-a-block-multiple": ([150, 70], {"page": 64, "H": 8, "H_kv": 2}, {"num_splits": 2}),
    "pages-of-256-gqa-16-two-tokens-two-groups": ([300, 5], {"page": 256, "Sq": 2, "H": 16, "H_kv": 1}, {}),
    "pages-of-32-one-split": ([45], {"page": 32, "H": 4, "H_kv": 4}, {"num_splits": 1}),
}


@pytest.mark.parametrize("softmax", ["online", "unified"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", list(GPU_PLAN_CASES))
def test_every_gpu_plan_tile_matches_float64_attention_on_the_interpreter(monkeypatch, name, D, softmax):
    """The tiles the GPU plans launch (their rows, keys per step and stages; one warp or four is the same
    program to the interpreter) split the keys and combine them right: page sizes 16 to 256, GQA 1:1 to
    16:1, lengths that are no multiple of the block, one split or several (chosen, or by the model's rule)."""
    import importlib
    module = importlib.import_module("tessera.kernels_lib.attention_decode")
    plans = module.UNIFIED_DECODE_PLANS if softmax == "unified" else module.DECODE_PLANS
    monkeypatch.setattr(module, "decode_plan", lambda shape, q, unified: plans[D])
    seqlens, case, options = GPU_PLAN_CASES[name]
    tensors = paged_case(seqlens, **case, D=D, seed=len(name) + D)
    if softmax == "unified":
        options = {**options, "unified_max": 2.0}
    out, lse = attention_decode(*tensors, **options)
    check(out, lse, *expected(*tensors))


def run_unified(tensors, unified_max, fallback, splits=2):
    """attention_decode's kernels with the unified max, the fallback on or off."""
    from tessera.kernels_lib.attention_decode import (CPU_DECODE_PLAN, Softmax, _check_decode, launch)
    q = tensors[0]
    shape = _check_decode(*tensors)
    o, lse = torch.empty_like(q), torch.empty(shape.B, shape.H, shape.Sq)
    softmax = Softmax.of(shape, q.dtype, True, -1, -1, 0.0, None, unified_max)
    launch(*tensors, o, lse, shape, CPU_DECODE_PLAN, softmax, splits, fallback=fallback)
    return o, lse


def test_a_unified_max_in_range_needs_no_fallback():
    """The asynchronous softmax alone (no recomputation) is exact where every row's max is near the estimate."""
    tensors = paged_case([37, 70], H=4, H_kv=2)
    check(*run_unified(tensors, 2.0, fallback=False), *expected(*tensors))


@pytest.mark.parametrize("unified_max", [-30.0, 40.0])
def test_a_unified_max_out_of_range_is_wrong_without_the_fallback_and_right_with_it(unified_max):
    """-30: exp(s - phi) overflows float16; 40: every term underflows. The fallback recomputes those splits."""
    tensors = paged_case([37, 70], H=4, H_kv=2)
    reference_out, reference_lse = expected(*tensors)
    out, _ = run_unified(tensors, unified_max, fallback=False)
    assert not torch.allclose(out.double(), reference_out, atol=1e-2)
    check(*run_unified(tensors, unified_max, fallback=True), reference_out, reference_lse)


def test_opcheck():
    tensors = paged_case([20, 7], Sq=2)
    torch.library.opcheck(torch.ops.tessera.attention_decode.default, tensors, {"num_splits": 2})
    torch.library.opcheck(torch.ops.tessera.attention_decode.default, tensors, {"unified_max": 1.5})


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(8, 1, 32, 128, dtype=torch.bfloat16)
        cache = torch.empty(1000, 64, 8, 128, dtype=torch.bfloat16)
        out, lse = attention_decode(q, cache, cache, torch.empty(8, 100, dtype=torch.int32),
                                    torch.empty(8, dtype=torch.int32))
        assert out.shape == q.shape and lse.shape == (8, 32, 1) and lse.dtype == torch.float32


@pytest.mark.parametrize("change,message", [
    (lambda t: (t[0], t[1][:, :12], t[2][:, :12], t[3], t[4]), "page size"),
    (lambda t: (t[0], t[1], t[2], t[3].long(), t[4]), "block_table"),
    (lambda t: (t[0], t[1], t[2], t[3], t[4][:1]), "cache_seqlens"),
    (lambda t: (t[0][:, :, :3], t[1], t[2], t[3], t[4]), "multiple"),
    (lambda t: (t[0].float(), t[1], t[2], t[3], t[4]), "float16"),
    (lambda t: (t[0], t[1], t[2], t[3], t[4] + 100), "must lie in 0"),
])
def test_errors(change, message):
    with pytest.raises(ValueError, match=message):
        attention_decode(*change(paged_case([10, 3])))


def test_a_unified_max_must_be_finite():
    with pytest.raises(ValueError, match="finite"):
        attention_decode(*paged_case([10, 3]), unified_max=float("inf"))


@pytest.fixture
def fake_h100(monkeypatch):
    """A faked H100 SXM as torch.device("cuda", 0) (its properties: name, capability, SMs), the decode op's
    planning asks it for its SM count and its row in `gpus.py`; the row is forgotten after the test."""
    from types import SimpleNamespace
    from tessera.kernels_lib import gpus
    h100 = SimpleNamespace(multi_processor_count=132, name="NVIDIA H100 80GB HBM3", major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: h100)
    gpus.forget_devices()
    yield torch.device("cuda", 0)
    gpus.forget_devices()


@pytest.mark.parametrize("B, context, page", [(1, 16384, 64), (64, 4096, 16), (1, 40, 16)])
def test_the_gpu_split_count_is_the_models(monkeypatch, fake_h100, B, context, page):
    """On a GPU (`num_splits=0`) the op asks the decode model for its plan's tile on this device's SMs, with its
    constants (`gpus.py`: an H100 SXM's here, by its name): within 1 .. the key blocks, and one split where the
    batch alone fills the SMs."""
    import importlib
    module = importlib.import_module("tessera.kernels_lib.attention_decode")
    from tessera.kernels_lib import attention_decode_model as model, gpus
    shape = module.DecodeShape(B, 1, 32, 8, 128, page, context // page)
    plan = module.gpu_decode_plan(128, False, "nvidia")
    monkeypatch.delenv("TESSERA_DECODE_SEPARATE_COMBINE", raising=False)
    splits, in_launch = module._num_splits(shape, plan, True, 0, fake_h100)
    assert gpus.of(fake_h100) is gpus.H100_SXM
    rows, keys = shape.tile(plan)
    assert (splits, in_launch) == model.plan_for(model.Decode(B, 32, 8, 128, context),
                                                 model.Tile(rows, keys, plan.stages, 1))
    for value, merge in (("1", False), ("0", True)):           # the variable settles the merge
        monkeypatch.setenv("TESSERA_DECODE_SEPARATE_COMBINE", value)
        assert module._num_splits(shape, plan, True, 0, fake_h100)[1] is merge
    assert 1 <= splits <= -(-context // keys)
    if B == 64:
        assert splits == 1


def test_a_tile_that_spills_with_the_merge_merges_in_the_combine_kernel(monkeypatch, fake_h100):
    """The unified max's head-dim-128 tile (4 warps) has no registers for the merge in its launch: asked for it
    ($TESSERA_DECODE_SEPARATE_COMBINE=0), the op still plans two launches; the online one's 16-row tile merges
    in its launch."""
    import importlib
    module = importlib.import_module("tessera.kernels_lib.attention_decode")
    monkeypatch.setenv("TESSERA_DECODE_SEPARATE_COMBINE", "0")
    shape = module.DecodeShape(1, 1, 32, 8, 128, 64, 256)
    for unified, merges in ((True, False), (False, True)):
        plan = module.gpu_decode_plan(128, unified, "nvidia")
        assert module._num_splits(shape, plan, True, 0, fake_h100)[1] is merges
        assert module._num_splits(shape, plan, True, 8, fake_h100) == (8, merges)
