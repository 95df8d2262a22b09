"""Specification of tessera.ir.layouts: register layouts as values.

The product is checked against its definition written here with numpy
(coord = coord_a * b.shape + coord_b, thread and local outer-major); the
named hardware layouts against tables transcribed from the PTX ISA fragment
descriptions; the rest as laws over random chains of local/spatial factors.
"""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.ir.layouts import (
    LayoutError, RegisterLayout, column_local, column_spatial, ldmatrix, local, mma_m16n8k16_a,
    mma_m16n8k16_b, mma_m16n8k16_c, parse_layout, replicated, spatial,
)  # fmt: skip

FAST = settings(max_examples=60, deadline=None)
FACTORS = {
    "local": local, "spatial": spatial, "column_local": column_local,
    "column_spatial": column_spatial,
}  # fmt: skip


@st.composite
def chains(draw, ranks=(1, 2, 3), sizes=(1, 2, 4), max_factors=4) -> RegisterLayout:
    """A random product of primitives with power-of-two sizes (at most 4096 (thread, local) pairs)."""
    rank = draw(st.sampled_from(ranks))
    layout = local(*[1] * rank)
    for _ in range(draw(st.integers(1, max_factors))):
        kind = draw(st.sampled_from([*FACTORS, "replicated"]))
        if kind == "replicated":
            factor = replicated(draw(st.sampled_from((2, 4))))
        else:
            factor = FACTORS[kind](*draw(st.tuples(*[st.sampled_from(sizes)] * rank)))
        candidate = layout * factor
        if candidate.num_threads * candidate.local_size <= 4096:
            layout = candidate
    return layout


def same_rank_pairs(n: int = 2):
    return st.sampled_from((1, 2, 3)).flatmap(lambda r: st.tuples(*[chains(ranks=(r,), max_factors=2)] * n))


def reference_product_table(a: RegisterLayout, b: RegisterLayout) -> np.ndarray:
    """(threads, locals, rank) coordinates of a * b from the definition."""
    t = np.arange(a.num_threads * b.num_threads)[:, None]
    i = np.arange(a.local_size * b.local_size)[None, :]
    ca = a.map(t // b.num_threads, i // b.local_size)
    cb = b.map(t % b.num_threads, i % b.local_size)
    coords = [x * n + y for x, y, n in zip(ca, cb, b.shape)]
    return np.stack(np.broadcast_arrays(*coords), axis=-1)


# -- primitives and product --------------------------------------------------------


def test_primitives_index_threads_and_registers_row_or_column_major():
    assert [local(2, 3).map(0, i) for i in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [column_local(2, 3).map(0, i) for i in range(6)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert [spatial(2, 3).map(t, 0) for t in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [column_spatial(2, 3).map(t, 0) for t in range(6)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert (local(2, 3).num_threads, local(2, 3).local_size) == (1, 6)
    assert (spatial(2, 3).num_threads, spatial(2, 3).local_size) == (6, 1)


def test_product_is_outer_major():
    layout = spatial(2, 1) * local(1, 2)  # thread picks the row, register the column
    assert layout.shape == (2, 2)
    assert [[layout.map(t, i) for i in range(2)] for t in range(2)] == [[(0, 0), (0, 1)], [(1, 0), (1, 1)]]
    layout = local(2).spatial(4)  # register picks a block of 4, the thread the element in it
    assert [layout.map(t, 1) for t in range(4)] == [(4,), (5,), (6,), (7,)]


@FAST
@given(same_rank_pairs())
def test_product_follows_its_definition(pair):
    a, b = pair
    p = a * b
    assert p.shape == tuple(x * y for x, y in zip(a.shape, b.shape))
    assert (p.num_threads, p.local_size) == (a.num_threads * b.num_threads, a.local_size * b.local_size)
    assert p.replication == a.replication * b.replication
    assert np.array_equal(p.table(), reference_product_table(a, b))


@FAST
@given(same_rank_pairs(3))
def test_product_is_associative(triple):
    a, b, c = triple
    assert (a * b) * c == a * (b * c)


def test_rank0_replication_broadcasts_in_products():
    layout = spatial(4, 8).replicated(2)
    assert layout.shape == (4, 8) and layout.num_threads == 64 and layout.replication == 2
    assert layout.inverse((1, 2)) == [(20, 0), (21, 0)]
    with pytest.raises(LayoutError, match="different ranks"):
        _ = local(2) * local(2, 2)


# -- coverage, map and inverse ---------------------------------------------------------


@FAST
@given(chains())
def test_every_layout_covers_its_tile_exactly_replication_times(layout):
    table = layout.table().reshape(-1, layout.rank)
    assert layout.num_threads * layout.local_size == np.prod(layout.shape) * layout.replication
    assert np.all((table >= 0) & (table < np.array(layout.shape)))
    counts = Counter(map(tuple, table))
    assert len(counts) == np.prod(layout.shape) and set(counts.values()) == {layout.replication}
    per_thread = layout.table()
    for t in range(layout.num_threads):  # no thread holds an element twice
        assert len(set(map(tuple, per_thread[t]))) == layout.local_size
    assert layout.is_bijective == (layout.replication == 1)


@FAST
@given(chains(), st.data())
def test_map_and_inverse_round_trip(layout, data):
    t = data.draw(st.integers(0, layout.num_threads - 1))
    i = data.draw(st.integers(0, layout.local_size - 1))
    coord = layout.map(t, i)
    holders = layout.inverse(coord)
    assert (t, i) in holders and len(holders) == layout.replication
    assert all(layout.map(*h) == coord for h in holders)
    assert holders == sorted(holders)


def test_map_is_vectorized_and_checks_its_range():
    layout = mma_m16n8k16_c()
    rows, cols = layout.map(np.arange(32)[:, None], np.arange(4)[None, :])
    assert rows.shape == cols.shape == (32, 4)
    assert (rows[5, 3], cols[5, 3]) == layout.map(5, 3)
    with pytest.raises(LayoutError, match="thread must be in"):
        layout.map(32, 0)
    with pytest.raises(LayoutError, match="outside the tile"):
        layout.inverse((16, 0))


# -- equality is equality of maps -------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.sampled_from((1, 2)).flatmap(lambda r: st.tuples(*[chains(ranks=(r,), sizes=(1, 2), max_factors=3)] * 2)))
def test_equal_exactly_when_the_maps_are_equal(pair):
    a, b = pair
    same_map = (
        (a.shape, a.num_threads, a.local_size) == (b.shape, b.num_threads, b.local_size)
        and np.array_equal(a.table(), b.table())
    )  # fmt: skip
    assert (a == b) == same_map
    if same_map:
        assert hash(a) == hash(b) and str(a) == str(b)


def test_different_spellings_of_one_layout_are_equal():
    assert local(2).local(4) == local(8)
    assert spatial(2, 1).spatial(1, 4) == spatial(2, 4)
    assert spatial(1, 4).local(2, 1) == local(2, 1).spatial(1, 4)
    assert spatial(2, 2).spatial(2, 1) != spatial(4, 2)
    assert column_spatial(8, 1) == spatial(8, 1)
    assert replicated(2).replicated(2) == replicated(4)


# -- text form ---------------------------------------------------------------------


@FAST
@given(chains())
def test_print_parse_round_trip(layout):
    text = str(layout)
    assert parse_layout(text) == layout
    assert str(parse_layout(text)) == text
    assert not text.startswith("layout(")  # a product always prints as a chain
    assert eval(repr(layout), {"parse_layout": parse_layout}) == layout


def test_text_form_examples():
    assert str(local(2, 1).spatial(8, 4).local(1, 2)) == "local(2,1).spatial(8,4).local(1,2)"
    assert str(spatial(4, 8).reduce(1)) == "spatial(4,1).replicated(8)"
    assert str(replicated(4)) == "replicated(4)" and str(local()) == "local()"
    assert str(local(4).reduce(0)) == "local(1)"
    assert parse_layout(" local(2, 1) . spatial(8,4) ") == local(2, 1).spatial(8, 4)


def test_layouts_without_a_chain_print_in_general_form():
    # dim 0 = modes x0 x1, dim 1 = y0 y1; threads (x1, y0), registers (y1, x0):
    # each list starts with a minor mode, so no product of primitives spells it
    layout = RegisterLayout((4, 4), ((2, 2), (2, 2)), (1, 2), (3, 0))
    text = str(layout)
    assert text == "layout(shape=[4,4],modes=[[2,2],[2,2]],spatial=[1,2],local=[3,0])"
    assert parse_layout(text) == layout and str(parse_layout(text)) == text


@pytest.mark.parametrize(
    "text, message",
    [
        ("local(2,1", "expected"),
        ("local(2,1).", "expected name"),
        ("tiled(2)", "unknown layout factor"),
        ("local(2).spatial(2,2)", "different ranks"),
        ("local(0)", "positive"),
        ("local(2)#", "unexpected character at column 9"),
        ("layout(shape=[4],modes=[[2]],spatial=[0],local=[])", "do not multiply"),
        ("layout(shape=[4],modes=[[2,2]],spatial=[0],local=[0])", "once"),
    ],
)
def test_bad_text_is_a_layout_error(text, message):
    with pytest.raises(LayoutError, match=message):
        parse_layout(text)


# -- divide, reduce, permute --------------------------------------------------------------


@FAST
@given(same_rank_pairs())
def test_divide_recovers_the_left_factor(pair):
    a, b = pair
    assert (a * b).divide(b) == a
    assert (a * b) / b == a


def test_divide_examples():
    c = mma_m16n8k16_c()
    assert c / local(1, 2) == local(2, 1).spatial(8, 4)
    assert c / spatial(8, 4).local(1, 2) == local(2, 1)
    assert local(8) / local(2) == local(4)
    assert spatial(4, 1).replicated(8) / replicated(2) == spatial(4, 1).replicated(4)
    with pytest.raises(LayoutError, match="not a product"):
        c / spatial(8, 4)  # the minor digits are registers, not threads
    with pytest.raises(LayoutError, match="not a product"):
        spatial(2, 2).spatial(2, 1) / spatial(2, 2)
    with pytest.raises(LayoutError, match="does not divide"):
        local(6) / local(4)


@FAST
@given(chains(), st.data())
def test_reduce_keeps_each_thread_on_the_outputs_of_its_inputs(layout, data):
    dims = data.draw(st.sets(st.integers(0, layout.rank - 1), min_size=1))
    reduced = layout.reduce(sorted(dims))
    assert reduced.shape == tuple(1 if d in dims else n for d, n in enumerate(layout.shape))
    assert reduced.num_threads == layout.num_threads
    table, out = layout.table().copy(), reduced.table()
    table[..., sorted(dims)] = 0
    for t in range(layout.num_threads):
        assert set(map(tuple, table[t])) == set(map(tuple, out[t]))
    dropped = layout.reduce(sorted(dims), keepdims=False)
    assert dropped.shape == tuple(n for d, n in enumerate(layout.shape) if d not in dims)
    assert dropped.num_threads == layout.num_threads and dropped.local_size == reduced.local_size


def test_reduce_examples():
    c = mma_m16n8k16_c()  # row sums of the accumulator: the 4 lanes of a row quad share them
    assert c.reduce(1) == local(2, 1).spatial(8, 1).replicated(4)
    assert c.reduce(0, keepdims=False) == replicated(8).spatial(4).local(2)  # column sums
    assert spatial(32).reduce(0, keepdims=False) == replicated(32)


@FAST
@given(chains(ranks=(2, 3)), st.data())
def test_permute_transposes_the_coordinates(layout, data):
    order = data.draw(st.permutations(range(layout.rank)))
    permuted = layout.permute(order)
    assert np.array_equal(permuted.table(), layout.table()[..., list(order)])


def _row_major_index(layout: RegisterLayout) -> np.ndarray:
    """The row-major index, in the layout's tile, of the element each (thread, local) holds."""
    return np.ravel_multi_index(tuple(np.moveaxis(layout.table(), -1, 0)), layout.shape)


@FAST
@given(chains(ranks=(1, 2, 3)), st.data())
def test_reshape_keeps_every_register_on_its_element(layout, data):
    """A reshape regroups the same elements (row-major order kept): each (thread, local) holds the element
    of the same row-major index, and reshaping back gives the layout back."""
    numel = int(np.prod(layout.shape))
    sizes = [1 << data.draw(st.integers(0, numel.bit_length() - 1)) for _ in range(data.draw(st.integers(1, 3)))]
    shape = tuple(sizes) + (numel // int(np.prod(sizes)),) if numel % int(np.prod(sizes)) == 0 else (numel,)
    reshaped = layout.reshape(shape)
    assert reshaped.shape == shape
    assert np.array_equal(_row_major_index(reshaped), _row_major_index(layout))
    assert reshaped.reshape(layout.shape) == layout


def test_reshape_splits_a_mode_where_a_dim_ends_inside_it():
    # 16 contiguous elements per thread along K = 128: groups of 32 keep (lanes 2, registers 16) inside a group
    assert spatial(16, 8).local(1, 16).reshape((16, 4, 32)) == spatial(16, 4, 2).local(1, 1, 16)
    assert local(1, 6).reshape((2, 3)) == local(2, 3)
    with pytest.raises(LayoutError, match="a mode of size 3 does not split at 2"):
        local(3, 4).reshape((2, 6))
    with pytest.raises(LayoutError, match="a different number of elements"):
        local(2, 2).reshape((8,))


def test_transposed_mma_b_operand_is_row_major_in_n():
    assert mma_m16n8k16_b().permute((1, 0)) == local(1, 2).spatial(8, 4).local(1, 2)


# -- local contiguity ---------------------------------------------------------------------


def brute_contiguity(layout: RegisterLayout, dim: int) -> int:
    table = layout.table()
    step = np.zeros(layout.rank, np.int64)
    step[dim] = 1
    best = 1
    for v in range(2, layout.local_size + 1):
        if layout.local_size % v:
            continue
        blocks = table.reshape(layout.num_threads, -1, v, layout.rank)
        if np.array_equal(blocks, blocks[:, :, :1] + np.arange(v)[:, None] * step):
            best = v
    return best


@FAST
@given(chains(), st.data())
def test_local_contiguity_matches_brute_force(layout, data):
    dim = data.draw(st.integers(0, layout.rank - 1))
    assert layout.local_contiguity(dim) == brute_contiguity(layout, dim)


def test_local_contiguity_examples():
    assert mma_m16n8k16_c().local_contiguity() == 2
    assert mma_m16n8k16_b().local_contiguity() == 1 and mma_m16n8k16_b().local_contiguity(0) == 2
    assert spatial(16, 8).local(1, 8).local_contiguity() == 8
    assert local(4, 8).local_contiguity(-1) == 8 and local(4, 8).local_contiguity(0) == 1


# -- named hardware layouts against the PTX ISA tables -----------------------------------
# PTX ISA 9.7.14.5.8 (mma.m16n8k16, .f16/.bf16): groupID = lane >> 2, tid = lane % 4.


def ptx_mma_a(lane, i):  # Figure 79: a0..a7 of the 16x16 (m, k) tile
    row = lane // 4 + (0 if i in (0, 1, 4, 5) else 8)
    col = (lane % 4) * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def ptx_mma_b(lane, i):  # Figure 81: b0..b3 of the 16x8 (k, n) tile
    return (lane % 4) * 2 + (i & 1) + (8 if i >= 2 else 0), lane // 4


def ptx_mma_c(lane, i):  # Figure 83: c0..c3 of the 16x8 (m, n) tile
    return lane // 4 + (8 if i >= 2 else 0), (lane % 4) * 2 + (i & 1)


@pytest.mark.parametrize(
    "layout, table, shape, regs",
    [
        (mma_m16n8k16_a(), ptx_mma_a, (16, 16), 8),
        (mma_m16n8k16_b(), ptx_mma_b, (16, 8), 4),
        (mma_m16n8k16_c(), ptx_mma_c, (16, 8), 4),
    ],
    ids=["A", "B", "C"],
)
def test_mma_fragments_match_the_ptx_isa(layout, table, shape, regs):
    assert (layout.shape, layout.num_threads, layout.local_size) == (shape, 32, regs)
    assert layout.is_bijective
    for lane in range(32):
        for i in range(regs):
            assert layout.map(lane, i) == table(lane, i), (lane, i)


@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_matches_the_ptx_isa(num, trans):
    # PTX ISA 9.7.14.5.15: register j holds matrix j (rows 8j.. of the stack);
    # lane l holds row l // 4, elements 2*(l % 4) + {0, 1} -- transposed with .trans.
    layout = ldmatrix(num, trans)
    assert (layout.shape, layout.num_threads, layout.local_size) == ((8 * num, 8), 32, 2 * num)
    for lane in range(32):
        for j in range(num):
            for e in range(2):
                r, c = lane // 4, (lane % 4) * 2 + e
                if trans:
                    r, c = c, r
                assert layout.map(lane, 2 * j + e) == (8 * j + r, c)


def test_ldmatrix_x4_of_a_16x16_tile_is_the_mma_a_fragment():
    # Lanes 8j..8j+7 point at the rows of quadrant j = (col block, row block):
    # the four 8x8 matrices land in registers exactly as mma's A operand wants.
    a = mma_m16n8k16_a()
    stacked = ldmatrix(4)
    for lane in range(32):
        for i in range(8):
            j = i // 2
            r, c = stacked.map(lane, i)
            assert a.map(lane, i) == (8 * (j % 2) + r % 8, 8 * (j // 2) + c)
