"""The seed kernels the mutator starts from: small, valid, and together touching most of the language.

Each `Seed` is a kernel's source (a module of its own: `import tessera`, maybe a helper, the kernel), its
signature and constexprs, and how big the interpreter's arrays must be. `tests/fuzz/test_fuzz_smoke.py`
checks that every seed compiles for every target and runs in the interpreter, so a mutant's failure is the
mutation's doing.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Seed:
    name: str
    source: str
    signature: str
    constexprs: dict = field(default_factory=dict)
    array_elements: int = 4096
    grid: tuple = (2,)


HEADER = "import tessera\n\n\n"

SEEDS = [
    Seed("add", HEADER + '''\
@tessera.kernel
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    mask = offs < n
    x = tessera.load(x_ptr + offs, mask=mask)
    y = tessera.load(y_ptr + offs, mask=mask, other=0.0)
    tessera.store(out_ptr + offs, x + y, mask=mask)
''', "*f32:16,*f32:16,*f32:16,i32", {"BLOCK": 128}),
    Seed("softmax", HEADER + '''\
@tessera.kernel
def softmax(x_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    row = tessera.program_id(0)
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + row * n + offs, mask=offs < n, other=-float("inf"))
    x = x - tessera.max(x, axis=0)
    e = tessera.exp(x)
    tessera.store(out_ptr + row * n + offs, e / tessera.sum(e, axis=0), mask=offs < n)
''', "*f32:16,*f32:16,i32", {"BLOCK": 256}),
    Seed("matmul", HEADER + '''\
@tessera.kernel
def matmul(a_ptr, b_ptr, c_ptr, K, BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr):
    rm = tessera.arange(0, BM)
    rn = tessera.arange(0, BN)
    rk = tessera.arange(0, BK)
    acc = tessera.zeros((BM, BN), tessera.f32)
    for k in range(0, K, BK):
        a = tessera.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tessera.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc = tessera.dot(a, b, acc)
    tessera.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)
''', "*f16:16,*f16:16,*f32:16,i32:16", {"BM": 32, "BN": 32, "BK": 16}, grid=(1,)),
    Seed("transpose", HEADER + '''\
@tessera.kernel
def transpose(x_ptr, out_ptr, M: tessera.constexpr, N: tessera.constexpr):
    rows = tessera.arange(0, M)
    cols = tessera.arange(0, N)
    x = tessera.load(x_ptr + rows[:, None] * N + cols[None, :])
    tessera.store(out_ptr + cols[:, None] * M + rows[None, :], tessera.trans(x))
''', "*f32:16,*f32:16", {"M": 16, "N": 32}, grid=(1,)),
    Seed("reductions", HEADER + '''\
@tessera.kernel
def reductions(x_ptr, out_ptr, idx_ptr, M: tessera.constexpr, N: tessera.constexpr):
    rows = tessera.arange(0, M)
    cols = tessera.arange(0, N)
    x = tessera.load(x_ptr + rows[:, None] * N + cols[None, :])
    tessera.store(out_ptr + rows, tessera.sum(x, axis=1) + tessera.min(x, axis=1))
    tessera.store(idx_ptr + cols, tessera.argmax(x, axis=0))
    tessera.store(out_ptr + M + cols, tessera.max(x, axis=0))
''', "*f32:16,*f32:16,*i32:16", {"M": 8, "N": 64}, grid=(1,)),
    Seed("scan", HEADER + '''\
@tessera.kernel
def scan(x_ptr, out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs)
    tessera.store(out_ptr + offs, tessera.cumsum(x, axis=0) * 2)
    tessera.store(out_ptr + BLOCK + offs, tessera.cumsum(x, axis=0, reverse=True))
''', "*i32:16,*i32:16", {"BLOCK": 64}, grid=(1,)),
    Seed("casts", HEADER + '''\
@tessera.kernel
def casts(x_ptr, out_ptr, lo, hi, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs)
    y = tessera.where(x < lo, lo, tessera.minimum(x, hi))
    z = y.to(tessera.bf16).to(tessera.f32) + (y * 8.0).to(tessera.i32).to(tessera.f32)
    tessera.store(out_ptr + offs, tessera.abs(z))
''', "*f32:16,*f32:16,f32,f32", {"BLOCK": 256}),
    Seed("histogram", HEADER + '''\
@tessera.kernel
def histogram(x_ptr, bins_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs, mask=offs < n, other=0)
    tessera.atomic_add(bins_ptr + x % 8, 1, mask=offs < n)
    tessera.atomic_max(bins_ptr + 8, tessera.max(x, axis=0))
''', "*i32:16,*i32:16,i32", {"BLOCK": 128}),
    Seed("loops", HEADER + '''\
@tessera.kernel
def loops(x_ptr, out_ptr, n, steps, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs)
    acc = tessera.zeros((BLOCK,), tessera.f32)
    i = 0
    while i < steps:
        acc = acc + x * i
        i += 1
    if n > 8:
        acc = acc * 2.0
    else:
        acc = acc - 1.0
    for j in tessera.static_range(3):
        acc = acc + j
    tessera.store(out_ptr + offs, acc)
''', "*f32:16,*f32:16,i32,i32", {"BLOCK": 64}, grid=(1,)),
    Seed("views", HEADER + '''\
@tessera.kernel
def views(x_ptr, out_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    i = tessera.program_id(0)
    x = tessera.view(x_ptr, (M, N)).block((BM, BN), (i, 0)).load()
    tessera.view(out_ptr, (M, N)).block((BM, BN), (i, 0)).store(x * 3.0)
''', "*f32:16,*f32:16,i32,i32", {"BM": 16, "BN": 32}),
    Seed("integers", HEADER + '''\
@tessera.kernel
def integers(x_ptr, out_ptr, s, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs)
    y = (x << 2) ^ (x >> 1) | (x & 7)
    z = y // 3 + y % 5 - (offs % 3)
    tessera.store(out_ptr + offs // 2 * 2, z * s)
''', "*u32:16,*u32:16,u32", {"BLOCK": 128}),
    Seed("helper", HEADER + '''\
@tessera.func
def gelu(x):
    return 0.5 * x * (1.0 + tessera.tanh(0.79788456 * (x + 0.044715 * x * x * x)))


@tessera.kernel
def helper(x_ptr, out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs).to(tessera.f32)
    tessera.store(out_ptr + offs, gelu(x).to(tessera.f16))
''', "*f16:16,*f16:16", {"BLOCK": 256}),
    Seed("combine", HEADER + '''\
@tessera.func
def biggest(a, b):
    return tessera.maximum(a, b)


@tessera.kernel
def combine(x_ptr, out_ptr, M: tessera.constexpr, N: tessera.constexpr):
    rows = tessera.arange(0, M)
    cols = tessera.arange(0, N)
    x = tessera.load(x_ptr + rows[:, None] * N + cols[None, :])
    tessera.store(out_ptr + rows, tessera.reduce(x, 1, biggest))
    tessera.store(out_ptr + M + rows[:, None] * N + cols[None, :], tessera.scan(x, 1, biggest))
''', "*f32:16,*f32:16", {"M": 4, "N": 32}, grid=(1,)),
    Seed("shapes", HEADER + '''\
@tessera.kernel
def shapes(x_ptr, out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs)
    y = tessera.reshape(x, (BLOCK // 8, 8))
    z = tessera.permute(y, (1, 0))
    w = tessera.broadcast_to(tessera.expand_dims(tessera.sum(z, axis=0), 0), (8, BLOCK // 8))
    tessera.store(out_ptr + tessera.arange(0, 8)[:, None] * (BLOCK // 8) + tessera.arange(0, BLOCK // 8)[None, :],
                  w + z)
''', "*f32:16,*f32:16", {"BLOCK": 64}, grid=(1,)),
    Seed("math", HEADER + '''\
@tessera.kernel
def math(x_ptr, out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    x = tessera.abs(tessera.load(x_ptr + offs)) + 0.5
    y = tessera.sqrt(x) + tessera.log(x) * tessera.rsqrt(x) - tessera.sigmoid(x) + tessera.erf(x)
    y = y + tessera.floor(x) * tessera.ceil(x) + tessera.exp2(x) - tessera.log2(x) + tessera.sin(x) * tessera.cos(x)
    tessera.store(out_ptr + offs, y)
''', "*f32:16,*f32:16", {"BLOCK": 128}),
    Seed("shared", HEADER + '''\
@tessera.kernel
def shared(x_ptr, out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    buf = tessera.shared((BLOCK,), tessera.f32)
    tessera.async_copy(buf, x_ptr + offs)
    tessera.async_commit()
    tessera.async_wait(0)
    tessera.barrier()
    tessera.store(out_ptr + offs, buf.load() + 1.0)
''', "*f32:16,*f32:16", {"BLOCK": 128}, grid=(1,)),
]
