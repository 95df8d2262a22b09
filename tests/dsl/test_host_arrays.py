"""Host arrays of every kind run on the CPU interpreter in place: strided numpy arrays (a column, a transpose),
torch CPU tensors of every dtype (bf16 and fp8 through their bits), ml_dtypes arrays, CPU __dlpack__ objects."""

import numpy as np
import pytest

import tessera


@tessera.kernel
def scale_rows(x_ptr, out_ptr, rows, cols, stride_row, stride_col, BLOCK: tessera.constexpr):
    """out[r, c] = 2 * x[r, c] for an x laid out with any strides (in elements); out contiguous."""
    r = tessera.program_id(0)
    c = tessera.arange(0, BLOCK)
    mask = c < cols
    x = tessera.load(x_ptr + r * stride_row + c * stride_col, mask=mask)
    tessera.store(out_ptr + r * cols + c, 2.0 * x.to(tessera.f32), mask=mask)


@tessera.kernel
def fill_column(x_ptr, rows, stride_row, value):
    """x[r] = value through a strided pointer: the writes land in the caller's array."""
    r = tessera.arange(0, 16)
    tessera.store(x_ptr + r * stride_row, r.to(tessera.f32) * 0 + value, mask=r < rows)


def run_scale(x, strides: tuple[int, int], shape: tuple[int, int] | None = None) -> np.ndarray:
    rows, cols = shape or x.shape
    out = np.zeros((rows, cols), np.float32)
    scale_rows[(rows,)](x, out, rows, cols, *strides, BLOCK=32)
    return out


def test_a_transposed_array_is_read_through_its_strides():
    base = np.random.default_rng(0).standard_normal((20, 12)).astype(np.float32)
    x = base.T                                      # shape (12, 20), strides (1, 12) in elements
    np.testing.assert_array_equal(run_scale(x, (1, 12)), 2 * x)


def test_a_strided_column_is_written_in_place():
    grid = np.zeros((10, 4), np.float32)
    fill_column[(1,)](grid[:, 2], 10, 4, 7.0)       # the column view, stride 4 elements
    expected = np.zeros((10, 4), np.float32)
    expected[:, 2] = 7.0
    np.testing.assert_array_equal(grid, expected)


def test_negative_strides_are_refused_with_the_fix():
    x = np.zeros((8, 8), np.float32)[::-1]
    with pytest.raises(tessera.KernelArgumentError, match=r"argument 'x_ptr': .*negative strides.*ascontiguousarray"):
        run_scale(x, (8, 1))


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16", "int8", "uint16", "uint32",
                                  "uint64"])
def test_torch_cpu_tensors_of_every_dtype(name):
    torch = pytest.importorskip("torch")
    x = (torch.rand(6, 10) * 100).to(getattr(torch, name))       # unsigned: the GPU run found uint32 refused
    np.testing.assert_array_equal(run_scale(x, (10, 1)), 2 * x.float().numpy())


def test_a_strided_torch_tensor():
    torch = pytest.importorskip("torch")
    x = torch.randn(10, 6).to(torch.bfloat16).t()
    np.testing.assert_array_equal(run_scale(x, (1, 6)), 2 * x.float().numpy())


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_ml_dtypes_arrays(name):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = (np.random.default_rng(1).standard_normal((5, 9)) * 3).astype(getattr(ml_dtypes, name))
    np.testing.assert_array_equal(run_scale(x, (9, 1)), 2 * x.astype(np.float32))


class OnlyDLPack:
    """An array exposing nothing but the DLPack protocol (as some libraries' CPU arrays do)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_a_cpu_dlpack_object():
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(run_scale(OnlyDLPack(x), (8, 1), shape=x.shape), 2 * x)
