"""Tutorial 01: vector addition.

The smallest useful kernel. Each program instance handles one BLOCK-sized
slice of the vectors: it computes the offsets of its lanes, masks off the
lanes past the end, loads, adds and stores. Launching it with numpy arrays
runs it on Tessera's CPU tile interpreter, so this script needs no GPU.

    python tutorials/01-vector-add.py
"""

import numpy as np

import tessera


@tessera.kernel
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    pid = tessera.program_id(0)                      # which slice this instance owns
    offsets = pid * BLOCK + tessera.arange(0, BLOCK)  # a tile of BLOCK element indices
    mask = offsets < n                               # the last slice may run past the end
    x = tessera.load(x_ptr + offsets, mask=mask)
    y = tessera.load(y_ptr + offsets, mask=mask)
    tessera.store(out_ptr + offsets, x + y, mask=mask)


def main() -> None:
    n, block = 100_000, 1024
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    out = np.zeros_like(x)

    grid = (tessera.cdiv(n, block),)                 # enough instances to cover n
    add[grid](x, y, out, n, BLOCK=block)

    np.testing.assert_array_equal(out, x + y)
    print(f"vector add: {n} float32 elements in {grid[0]} programs of {block} lanes -- matches numpy")


if __name__ == "__main__":
    main()
