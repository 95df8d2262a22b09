"""Kernels shared by the GPU benchmarks (the tutorials' kernels, kept importable by name)."""

import tessera


@tessera.kernel
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    mask = offs < n
    tessera.store(out_ptr + offs, tessera.load(x_ptr + offs, mask=mask) + tessera.load(y_ptr + offs, mask=mask),
                  mask=mask)
