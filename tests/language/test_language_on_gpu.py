"""On a machine with an NVIDIA GPU: the language features of tests/language/ run on the device and agree with
their numpy references (and so with the CPU interpreter, which the other files check against the same
references). Joined to tier 1 of the GPU session by the `gpu` mark."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.testing import assert_same_bits

import philox_reference as ref
from test_random import OFFSETS, distributions, draw_words, dropout, dropout_args, high_product_reference, \
    high_products

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def on_device(args: list) -> list:
    return [torch.from_numpy(a.copy()).cuda() if isinstance(a, np.ndarray) else a for a in args]


def back(value) -> np.ndarray:
    torch.cuda.synchronize()
    return value.cpu().numpy()


@pytest.mark.parametrize("offsets", sorted(OFFSETS))
def test_randint4x_on_the_gpu_is_philox(offsets):
    values = OFFSETS[offsets]
    out, device_offsets, seed = on_device([np.zeros(4 * values.size, np.uint32), values, 0x123456789])
    draw_words[(1,)](out, device_offsets, seed, BLOCK=values.size)
    assert back(out).reshape(4, -1).tolist() == [w.tolist() for w in ref.randint4x(0x123456789, values)]


def test_dropout_on_the_gpu_keeps_the_same_lanes_as_the_reference():
    x, out, n, p, seed = on_device(dropout_args())
    dropout[(4,)](x, out, n, p, seed, BLOCK=256)
    uniform = ref.uniform(ref.randint4x(seed, np.arange(n, dtype=np.int32))[0])
    expected = np.where(uniform > np.float32(p), back(x) / np.float32(1 - p), np.float32(0)).astype(np.float32)
    assert back(out).tobytes() == expected.tobytes()


def test_uniforms_on_the_gpu_are_bit_for_bit_and_normals_close():
    (out,) = on_device([np.zeros(4 * 1024, np.float32)])
    distributions[(1,)](out, 99, BLOCK=1024)
    rand, randn, rand_word3, _ = back(out).reshape(4, 1024)
    words = ref.randint4x(99, np.arange(1024, dtype=np.int32))
    assert rand.tobytes() == ref.uniform(words[0]).tobytes()
    assert rand_word3.tobytes() == ref.uniform(words[2]).tobytes()
    np.testing.assert_allclose(randn, ref.normal(ref.uniform(words[0]), ref.uniform(words[1])), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
def test_umulhi_on_the_gpu(dtype):
    rng = np.random.default_rng(5)
    info = np.iinfo(dtype)
    a, b = (rng.integers(info.min, info.max, 128, dtype=dtype, endpoint=True) for _ in range(2))
    da, db, out = on_device([a, b, np.zeros_like(a)])
    high_products[(1,)](da, db, out, BLOCK=128)
    assert back(out).tobytes() == high_product_reference(a, b).tobytes()


def test_padding_blocks_leave_early_on_the_gpu():
    from test_early_return import scale_real_blocks

    x, out = on_device([np.arange(256, dtype=np.float32), np.full(256, -1, np.float32)])
    scale_real_blocks[(8,)](x, out, 3, BLOCK=32)
    result = back(out)
    assert result[:96].tolist() == (2 * np.arange(96, dtype=np.float32)).tolist() and (result[96:] == -1).all()


@pytest.mark.parametrize("where", [None, 5])
def test_a_return_inside_nested_loops_on_the_gpu(where):
    from test_early_return import first_negative

    x = np.arange(1, 13, dtype=np.float32)
    if where is not None:
        x[where] = -x[where]
    dx, out = on_device([x, np.zeros(1, np.int32)])
    first_negative[(1,)](dx, out, 4, COLS=3)
    assert back(out)[0] == (-1 if where is None else where)


@pytest.mark.parametrize("hint", ["multiple_of", "assume"])
def test_a_gemm_sized_by_memory_pipelines_on_the_gpu_once_its_alignment_is_stated(hint):
    from test_hints import BLOCKS, gemm_args, sized_by_memory

    a, b, c, sizes = gemm_args()
    da, db, dc, dsizes = on_device([a, b, c, sizes])
    sized_by_memory[(1,)](da, db, dc, dsizes, HINT=hint, **BLOCKS)
    np.testing.assert_allclose(back(dc), a.astype(np.float32) @ b.astype(np.float32), rtol=1e-3, atol=1e-3)


def test_a_grouped_gemm_over_separate_allocations_on_the_gpu():
    import tessera
    from test_pointer_values import SHAPES, grouped_gemm, grouped_problem

    a, b, c = grouped_problem()
    da, db, dc = (on_device(x) for x in (a, b, c))
    sizes = on_device([np.array(SHAPES, np.int32).reshape(-1)])[0]
    tiles = max(-(-m // 16) * -(-n // 16) for m, n, k in SHAPES)
    grouped_gemm[(tiles, len(SHAPES))](*[tessera.addresses(x) for x in (da, db, dc)], sizes, BM=16, BN=16, BK=16)
    for ai, bi, ci in zip(a, b, dc):
        np.testing.assert_allclose(back(ci), ai.astype(np.float32) @ bi.astype(np.float32), rtol=1e-3, atol=1e-3)


def test_tile_algorithms_on_the_gpu_match_the_interpreter():
    from test_tile_algorithms import K, N, R, algorithms, inputs

    expected = inputs()
    algorithms[(1,)](*expected, R=R, N=N, K=K)
    got = on_device(inputs())
    algorithms[(1,)](*got, R=R, N=N, K=K)
    # bit for bit, but a NaN matches any NaN: `joined` holds 10 * NaN + -NaN, which the GPU computes as its
    # canonical NaN 0x7FFFFFFF and numpy as 0x7FC00000 (GPU run 7)
    for index, (want, have) in enumerate(zip(expected, got)):
        assert_same_bits(back(have), want, name=f"argument {index}")


def test_inline_ptx_on_the_gpu():
    from test_inline_asm import args, asm_kernel

    x, swapped, sums = on_device(args())
    asm_kernel[(1,)](x, swapped, sums, VENDOR="nvidia", BLOCK=128)
    host = back(x)
    assert back(swapped).tolist() == host.byteswap().tolist()
    assert back(sums).tolist() == (2 * host.astype(np.int8)).astype(np.int8).tolist()


RUN_CHECKED = """
import sys
sys.path.insert(0, {here!r})
import torch
from test_device_print import checked
x = torch.arange(16, dtype=torch.float32, device="cuda") - float(sys.argv[1])
checked[(1,)](x, 16, BLOCK=16)
torch.cuda.synchronize()
"""


def test_print_and_a_failed_assert_on_the_gpu(tmp_path):
    """In child processes: a trap leaves the CUDA context unusable, and vprintf writes to the process' stdout."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "run_checked.py"
    script.write_text(RUN_CHECKED.format(here=str(Path(__file__).parent)))
    env = {**os.environ, "TESSERA_DEBUG": "1"}
    ok = subprocess.run([sys.executable, str(script), "0"], env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "pid (0, 0, 0) thread 0 x is" in ok.stdout
    failed = subprocess.run([sys.executable, str(script), "3"], env=env, capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0
    assert "device assertion failed" in failed.stdout and "x must be non-negative" in failed.stdout


@pytest.mark.parametrize("n", [64, 4096])
def test_a_release_store_hands_rows_to_programs_polling_with_acquire_loads_on_the_gpu(n):
    """tests/language/test_ordered_memory.py on the device: st.release.gpu after a barrier publishes every warp's
    part of the row; ld.acquire.gpu with nanosleep backoff waits for it (both programs are resident)."""
    from cooperative_kernels import gather_when_all_ready, polite_handoff
    flag, data, out = on_device([np.zeros(1, np.int32), np.zeros(n, np.int32), np.zeros(n, np.int32)])
    polite_handoff[(2,)](flag, data, out, N=n)
    assert back(out).tolist() == (np.arange(n) * 3 + 1).tolist()
    flags, data, out = on_device([np.zeros(8, np.int32), np.zeros(8 * n, np.int32), np.zeros(n, np.int32)])
    gather_when_all_ready[(8,)](flags, data, out, N=n)
    assert back(out).tolist() == sum(np.arange(n) + p for p in range(1, 8)).tolist()
