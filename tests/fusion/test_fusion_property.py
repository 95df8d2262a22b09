"""For random chains of 2 to 8 elementwise kernels and library GEMMs, what `tessera.fusion()` runs computes exactly
what the launches one by one compute (every tensor the caller keeps), however much of the chain it fused."""

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import given, settings, strategies as st  # noqa: E402

import tessera  # noqa: E402

import fusion_kernels as k  # noqa: E402

M, N = 6, 16
n = M * N
WEIGHT = torch.randn(N, N, generator=torch.Generator().manual_seed(0)) / 4
STEP = st.one_of(
    st.tuples(st.just("scale"), st.sampled_from([0.5, -2.0])),
    st.tuples(st.just("unary"), st.sampled_from(["relu", "tanh", "square", "sigmoid"])),
    st.tuples(st.just("add input"), st.none()),
    st.tuples(st.just("add earlier"), st.integers(0, 7)),
    st.tuples(st.just("gemm"), st.none()),
    st.tuples(st.just("bias gelu"), st.none()),
)
CHAIN = st.lists(st.tuples(STEP, st.sampled_from([32, 64]), st.booleans()), min_size=2, max_size=8)


def run(chain, inputs):
    """Launch the chain on inputs[0]; every value it makes, and whether the caller keeps each."""
    from tessera.kernels_lib import gemm
    values, kept = [inputs[0]], [True]
    for ((kind, arg), block, keep), extra in zip(chain, inputs[1:]):
        cur, grid = values[-1], (tessera.cdiv(n, block),)
        out = torch.empty(M, N)
        if kind == "scale":
            k.scale[grid](cur, out, n, arg, BLOCK=block)
        elif kind == "unary":
            k.unary[grid](cur, out, n, OP=arg, BLOCK=block)
        elif kind == "add input":
            k.add[grid](cur, extra, out, n, BLOCK=block)
        elif kind == "add earlier":
            k.add[grid](cur, values[arg % len(values)], out, n, BLOCK=block)
        elif kind == "gemm":
            out = gemm(cur, WEIGHT)
        else:
            k.bias_gelu[grid](cur, extra[0].contiguous(), out, n, N, BLOCK=block)
        values.append(out)
        kept.append(keep)
    return values, kept


@settings(max_examples=10, deadline=None)
@given(CHAIN)
def test_fused_chains_compute_what_the_launches_one_by_one_compute(chain):
    g = torch.Generator().manual_seed(len(chain))
    inputs = [torch.randn(M, N, generator=g) for _ in range(len(chain) + 1)]
    expected, _ = run(chain, inputs)
    with tessera.fusion() as f:
        values, kept = run(chain, inputs)
        values = [v if keep else None for v, keep in zip(values[:-1], kept[:-1])] + [values[-1]]
    assert len(f.ran) <= len(chain)
    for i, (got, want) in enumerate(zip(values, expected)):
        if got is not None:
            assert torch.equal(got, want), f"value {i} differs after {f.report()}"
