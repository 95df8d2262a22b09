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
