"""LDS cycles of reading an MN-major MFMA B fragment on gfx950: 2 transpose reads against 8 ds_read_u16.

    python3 bench/amd_lds_transpose_banks.py

The fragment of v_mfma_f32_32x32x16 / 16x16x32 (8 consecutive k a lane) read from a row-major [K, N] bf16 slot
with a row pitch of P elements, as `mfma_operands.lds_transpose_read` reads it (ds_read_b64_tr_b16: lane 16h + s
addresses row s // 4, columns 4 (s % 4) .. + 3 of its group's 4 x 16 tile) and as the element-wise path did (one
ds_read_u16 a register). The model is `smem_layouts.bank_conflicts`'s: 64 banks of 4 bytes, the wave's lanes in
order, 256 bytes a phase (32 lanes of 8-byte reads, 64 of 2-byte ones), cycles = phases x the worst number of
distinct words in one bank. The hardware's exact phase grouping for 8-byte LDS reads is not modelled.
"""
import collections
def degree(accesses, nbytes, banks=64):
    per_phase = banks * 4 // max(nbytes, 4) if nbytes > 4 else 64
    total = 0
    for p in range(0, 64, per_phase):
        words = set()
        for addr in accesses[p:p + per_phase]:
            for w in range(max(1, nbytes // 4)):
                words.add(addr // 4 + w)
        c = collections.Counter(w % banks for w in words)
        total += max(c.values())
    return total


for m in (32, 16):
    kl = 8
    for P in (32, 64, 128, 136):
        tr = u16 = 0
        for r in range(2):
            addrs = []
            for l in range(64):
                h, s = l // 16, l % 16
                lanes_n = m                               # lanes per k-group
                n0 = (16 * h) % m
                g = (16 * h) // m
                k0 = kl * g + 4 * r
                row, col = k0 + s // 4, n0 + 4 * (s % 4)
                addrs.append(2 * (row * P + col))
            tr += degree(addrs, 8)
        for i in range(8):
            addrs = [2 * ((kl * (l // m) + i) * P + l % m) for l in range(64)]
            u16 += degree(addrs, 2)
        print(f"mfma {m}x{m}: pitch {P}: tr reads 2, cycles {tr}; ds_read_u16 8, cycles {u16}")
