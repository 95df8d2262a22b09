"""Kernels whose programs wait for each other, shared by the tile interpreter's and the SIMT simulator's tests of
cooperative scheduling (tests/interp/test_cooperative.py, tests/simt/test_simt_cooperative.py)."""

import tessera


@tessera.kernel
def handoff(flag, data, out):
    """Program 0 waits for program 1, which runs after it in grid order."""
    if tessera.program_id(0) == 0:
        while tessera.atomic_add(flag, 0) < 1:
            pass
        tessera.store(out, tessera.load(data) + 1)
    else:
        tessera.store(data, 41)
        tessera.atomic_add(flag, 1)


@tessera.kernel
def backward_chain(flags, out):
    """Program p waits for program p + 1 (the last one starts the chain): every program waits on a later one."""
    p = tessera.program_id(0)
    n = tessera.num_programs(0)
    if p + 1 < n:
        while tessera.load(flags + p + 1) == 0:
            pass
    tessera.store(out + p, tessera.atomic_add(flags + n, 1))   # the order the programs finished in
    tessera.atomic_xchg(flags + p, 1)


@tessera.kernel
def ticket_prefix_sum(queue, done, out, n):
    """A persistent kernel: programs take tickets from a counter; item t waits only on item t - 1 (a smaller
    ticket) and writes out[t] = out[t - 1] + t, so out is the running sum 0 + 1 + ... + t."""
    t = tessera.atomic_add(queue, 1)
    while t < n:
        if t > 0:
            while tessera.atomic_add(done + t - 1, 0) == 0:
                pass
            tessera.store(out + t, tessera.load(out + t - 1) + t)
        else:
            tessera.store(out + t, 0)
        tessera.atomic_xchg(done + t, 1)
        t = tessera.atomic_add(queue, 1)


@tessera.kernel
def wait_forever(flag):
    while tessera.atomic_add(flag, 0) == 0:
        pass


@tessera.kernel
def polite_handoff(flag, data, out, N: tessera.constexpr):
    """`handoff` with the ordered accesses: program 1 writes a row of data and publishes it with a release store;
    program 0 polls with acquire loads, backing off with nanosleep (doubling to 1 us), then reads the row."""
    offs = tessera.arange(0, N)
    if tessera.program_id(0) == 0:
        pause = 32
        while tessera.load(flag, sem="acquire") < 1:
            tessera.nanosleep(pause)
            pause = tessera.minimum(pause * 2, 1024)
        tessera.store(out + offs, tessera.load(data + offs) + 1)
    else:
        tessera.store(data + offs, offs * 3)
        tessera.store(flag, 1, sem="release")


@tessera.kernel
def gather_when_all_ready(flags, data, out, N: tessera.constexpr):
    """Every program p > 0 writes its row of data and release-stores flags[p]; program 0 waits until a tile of
    acquire loads sees every flag set, then sums the rows (a tile of flags, not one counter)."""
    p = tessera.program_id(0)
    n = tessera.num_programs(0)
    offs = tessera.arange(0, N)
    lanes = tessera.arange(0, 8)
    if p == 0:
        while tessera.sum(tessera.load(flags + lanes, mask=(lanes > 0) & (lanes < n), other=1, sem="acquire")) < 8:
            tessera.nanosleep(100)
        total = offs * 0
        for q in range(1, n):
            total += tessera.load(data + q * N + offs)
        tessera.store(out + offs, total)
    else:
        tessera.store(data + p * N + offs, offs + p)
        tessera.store(flags + p + lanes * 0, 1, mask=lanes == 0, sem="release")   # a tile: one lane stores
