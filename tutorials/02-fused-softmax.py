"""Tutorial 02: fused row-wise softmax.

softmax(x)_j = exp(x_j - max(x)) / sum_k exp(x_k - max(x)), one row per
program instance. The row is read once, and max, exp, sum and the division
all happen on the tile in registers: one pass over memory instead of the
five that separate numpy calls make.

The row is read through a tensor *view*: block loads from a view are
bounds-checked by construction, so the lanes of the block past the row's end
read the fill value (-inf, which exp turns into 0) and stores to them are
dropped. No masks to get wrong.

    python tutorials/02-fused-softmax.py
"""

import numpy as np

import tessera


@tessera.kernel
def softmax(x_ptr, out_ptr, rows, cols, BLOCK: tessera.constexpr):
    row = tessera.program_id(0)
    x = tessera.view(x_ptr, (rows, cols))
    out = tessera.view(out_ptr, (rows, cols))

    values = x.block((1, BLOCK), (row, 0)).load(fill=-float("inf"))
    shifted = values - tessera.max(values, axis=1, keep_dims=True)   # subtract the max for stability
    numerator = tessera.exp(shifted)
    result = numerator / tessera.sum(numerator, axis=1, keep_dims=True)
    out.block((1, BLOCK), (row, 0)).store(result)


def reference(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def main() -> None:
    rows, cols = 64, 781                                 # cols need not be a power of two
    block = tessera.next_power_of_2(cols)                # ... but tiles must be
    x = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    out = np.empty_like(x)

    softmax[(rows,)](x, out, rows, cols, BLOCK=block)

    np.testing.assert_allclose(out, reference(x), rtol=1e-5, atol=1e-7)
    print(f"fused softmax: {rows}x{cols} float32, one {block}-lane block per row -- matches numpy")


if __name__ == "__main__":
    main()
