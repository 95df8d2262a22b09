"""The same f32 expression compiled exactly and with `@tessera.kernel(fast_math=True)` (tests/backends/test_fast_math.py)."""

import tessera


@tessera.kernel(fast_math=True)
def fast(x_ptr, y_ptr, out_ptr, BLOCK: tessera.constexpr):
    offsets = tessera.arange(0, BLOCK)
    x, y = tessera.load(x_ptr + offsets), tessera.load(y_ptr + offsets)
    tessera.store(out_ptr + offsets, tessera.exp2(x) / y + x * y + tessera.log(y))


@tessera.kernel
def exact(x_ptr, y_ptr, out_ptr, BLOCK: tessera.constexpr):
    offsets = tessera.arange(0, BLOCK)
    x, y = tessera.load(x_ptr + offsets), tessera.load(y_ptr + offsets)
    tessera.store(out_ptr + offsets, tessera.exp2(x) / y + x * y + tessera.log(y))
