"""Fast conversions of packed low-bit values to 16-bit floats: bit tricks on 32-bit words in plain LLVM IR.

`fast_half(bld, data, packed, result, count)` turns <B x i8> holding
`count` elements of `packed` (a little-endian bit stream; for 8-bit types
the bytes are the elements) into <count x half> or <count x bfloat>, or
says None when no trick fits. Both GPU backends select the IR well: a byte
shuffle of two words is one `prmt` (NVIDIA) or `v_perm_b32` (AMD), and-or
chains become `lop3` (ptxas) or `v_and_or_b32`, and the float arithmetic
runs on packed pairs (`fma.rn.f16x2`, `v_pk_fma_f16`). Output pair
(2j, 2j+1) is one 32-bit word:

* integers of 1, 2, 4 or 8 bits -> f16 / bf16: each element's bits are
  moved to the bottom of its half-word and OR-ed into the mantissa of a
  magic number (f16 1024.0 = 0x6400, bf16 128.0 = 0x4300); subtracting the
  magic leaves the value (Marlin's trick). Signed values are flipped to
  unsigned first (x XOR 2^(b-1)) and the subtraction takes 2^(b-1) more;
  u8/i8 -> bf16 goes through f32 (0x4B000000 = 2^23), since bf16's 7
  mantissa bits cannot hold 128 + 255;
* fp4 (e2m1) -> f16: the sign and the 3 exponent-mantissa bits are placed
  where f16 has them (bits 15 and 9..11), which reads 2^-14 times the
  value, and one multiply by 2^14 rescales it (exact; subnormals too);
* e5m2 -> f16 is the byte in the high half; e4m3 -> f16 / bf16 shifts its
  7 bits into place and multiplies by 2^8 / 2^120, with NaN (S.1111.111)
  selected apart;
* e8m0 -> bf16 is the byte in the exponent field (0 -> 2^-127, a
  subnormal; 0xFF -> NaN);
* fp4 and e5m2 reach bf16 from f16 by an exact fpext + fptrunc.

Every sequence is exact: it computes what `DType.decode` then `quantize`
computes (tests/backends/test_low_bit_codegen.py runs this very IR on the
host CPU over every bit pattern).
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt

from .types import F32, I8, I16, I32, BFloatType, int_constant, scalar_constant

HALF = ir.HalfType()
BF16 = BFloatType()
_WORD_BYTES = ir.VectorType(I8, 4)


def fast_half(bld: ir.IRBuilder, data, packed: dt.DType, result: dt.DType, count: int):
    """The elements as <count x half> or <count x bfloat> by a bit trick (see the module docstring), or None
    when no trick fits the pair of types."""
    if result not in (dt.f16, dt.bf16, dt.f32, dt.f64):
        return None
    want = dt.bf16 if result == dt.bf16 else dt.f16
    if packed.is_int and packed.bits in (1, 2, 4) or packed.is_int and packed.bits == 8 and want == dt.f16:
        return _WordPairs(bld, data, count).ints(packed, want)
    if packed.is_int and packed.bits == 8:
        return _WordPairs(bld, data, count).bytes_to_bf16(packed)
    if packed == dt.f4e2m1:
        return _to(bld, _WordPairs(bld, data, count).fp4_to_f16(), dt.f16, want)
    if packed == dt.f8e5m2:
        return _to(bld, _WordPairs(bld, data, count).e5m2_to_f16(), dt.f16, want)
    if packed == dt.f8e4m3:
        return _WordPairs(bld, data, count).e4m3(want)
    if packed == dt.e8m0 and result != dt.f16:      # (f16 lacks e8m0's range)
        return _e8m0_to_bf16(bld, data)
    return None


def _to(bld: ir.IRBuilder, values, have: dt.DType, want: dt.DType):
    """f16 values as bf16 (exact for the values the tricks make: fpext, then an exact fptrunc)."""
    if have == want:
        return values
    wide = bld.fpext(values, ir.VectorType(F32, values.type.count))
    return bld.fptrunc(wide, ir.VectorType(BF16, values.type.count))


class _WordPairs:
    """The bytes as 32-bit words, and output pairs made from them, one 32-bit word per pair."""

    def __init__(self, bld: ir.IRBuilder, data, count: int):
        self.bld = bld
        self.count = count
        nbytes = data.type.count
        padded = -(-nbytes // 4) * 4
        if padded != nbytes:     # zero bytes after the last one
            zeros = ir.Constant(data.type, None)
            mask = list(range(nbytes)) + [nbytes] * (padded - nbytes)
            data = bld.shuffle_vector(data, zeros, ir.Constant(ir.VectorType(I32, padded), mask))
        words = bld.bitcast(data, ir.VectorType(I32, padded // 4))
        self.words = [bld.extract_element(words, ir.Constant(I32, i)) for i in range(padded // 4)]
        self.shifted: dict[tuple[int, int], ir.Value] = {}
        self.pairs = -(-count // 2)

    def word_bytes(self, word: int, shift: int = 0):
        """Word `word` shifted right by `shift` bits (left for a negative one), as <4 x i8>."""
        key = (word, shift)
        if key not in self.shifted:
            w = self.words[word]
            if shift:
                amount = ir.Constant(I32, abs(shift))
                w = self.bld.lshr(w, amount) if shift > 0 else self.bld.shl(w, amount)
            self.shifted[key] = self.bld.bitcast(w, _WORD_BYTES)
        return self.shifted[key]

    def select_bytes(self, low, high, picks):
        """One i32 whose bytes are `picks` of low's bytes (0-3) and high's (4-7): a prmt / v_perm_b32."""
        mask = ir.Constant(ir.VectorType(I32, 4), list(picks))
        return self.bld.bitcast(self.bld.shuffle_vector(low, high, mask), I32)

    def halves(self, pair_words: list, element: ir.Type):
        """The pair words as <count x element> (a 16-bit float type)."""
        vector = ir.Constant(ir.VectorType(I32, len(pair_words)), None)
        for i, w in enumerate(pair_words):
            vector = self.bld.insert_element(vector, w, ir.Constant(I32, i))
        values = self.bld.bitcast(vector, ir.VectorType(element, 2 * len(pair_words)))
        if 2 * len(pair_words) == self.count:
            return values
        keep = ir.Constant(ir.VectorType(I32, self.count), list(range(self.count)))
        return self.bld.shuffle_vector(values, ir.Constant(values.type, None), keep)

    def splat(self, t: ir.Type, value) -> ir.Constant:
        element = scalar_constant(dt.f16 if t == HALF else dt.bf16, value)
        return ir.Constant(ir.VectorType(t, self.count), [element] * self.count)

    def ints(self, dtype: dt.DType, want: dt.DType):
        """b-bit integers (b = 1, 2, 4; or 8 to f16) -> f16 / bf16 by the magic number of `want`."""
        bld, b = self.bld, dtype.bits
        magic = 1024.0 if want == dt.f16 else 128.0
        magic_bits = 0x6400 if want == dt.f16 else 0x4300
        flip = 1 << (b - 1) if dtype.kind == "int" else 0      # x ^ 2^(b-1) = x + 2^(b-1) as unsigned b bits
        words = []
        for p in range(self.pairs):
            word, bit = divmod(2 * p * b, 32)
            q, r = divmod(bit, 8)
            if b == 8:      # two bytes, each under a 0x64 byte
                source = self.word_bytes(word)
                if flip:
                    source = bld.xor(source, ir.Constant(_WORD_BYTES, [0x80] * 4))
                magic_bytes = ir.Constant(_WORD_BYTES, [magic_bits >> 8] * 4)
                words.append(self.select_bytes(source, magic_bytes, (q, 4, q + 1, 4)))
                continue
            t = self.select_bytes(self.word_bytes(word, r), self.word_bytes(word, r + b), (q, q, 4 + q, 4 + q))
            field = bld.and_(t, ir.Constant(I32, ((1 << b) - 1) * 0x10001))
            if flip:
                field = bld.xor(field, ir.Constant(I32, flip * 0x10001))
            words.append(bld.or_(field, ir.Constant(I32, magic_bits * 0x10001)))
        element = HALF if want == dt.f16 else BF16
        return bld.fsub(self.halves(words, element), self.splat(element, magic + flip))

    def bytes_to_bf16(self, dtype: dt.DType):
        """u8 / i8 -> bf16 through f32: the byte under 0x4B (2^23 + x), minus 2^23 (+128), then an exact
        truncation of each pair to bf16."""
        bld = self.bld
        flip = 0x80 if dtype.kind == "int" else 0
        floats = []
        for e in range(2 * self.pairs):
            word, q = divmod(e, 4)
            source = self.word_bytes(word)
            if flip:
                source = bld.xor(source, ir.Constant(_WORD_BYTES, [flip] * 4))
            magic = ir.Constant(_WORD_BYTES, [0, 0, 0, 0x4B])
            floats.append(self.select_bytes(source, magic, (q, 4, 4, 7)))
        vector = ir.Constant(ir.VectorType(I32, len(floats)), None)
        for i, w in enumerate(floats):
            vector = bld.insert_element(vector, w, ir.Constant(I32, i))
        wide = bld.fsub(bld.bitcast(vector, ir.VectorType(F32, len(floats))),
                        ir.Constant(ir.VectorType(F32, len(floats)), [ir.Constant(F32, 2.0 ** 23 + flip)] * len(floats)))
        if len(floats) != self.count:
            keep = ir.Constant(ir.VectorType(I32, self.count), list(range(self.count)))
            wide = bld.shuffle_vector(wide, ir.Constant(wide.type, None), keep)
        return bld.fptrunc(wide, ir.VectorType(BF16, self.count))

    def fp4_to_f16(self):
        """e2m1 -> f16: nibble bits 0..2 (exponent, mantissa) to 9..11 and bit 3 (sign) to 15 of each half,
        i.e. 2^-14 times the value, then one multiply by 2^14."""
        bld = self.bld
        words = []
        for p in range(self.pairs):
            word, q = divmod(p, 4)      # pair p is byte p: elements 2p (low nibble) and 2p + 1 (high nibble)
            # Byte q of (w << 1) holds the low nibble at bits 1..4, byte q of (w >> 3) the high one.
            t = self.select_bytes(self.word_bytes(word, -1), self.word_bytes(word, 3), (q, q, 4 + q, 4 + q))
            magnitude = bld.and_(t, ir.Constant(I32, 0x0E000E00))
            sign = bld.and_(bld.shl(t, ir.Constant(I32, 3)), ir.Constant(I32, 0x80008000))
            words.append(bld.or_(magnitude, sign))
        return bld.fmul(self.halves(words, HALF), self.splat(HALF, 2.0 ** 14))

    def e5m2_to_f16(self):
        """e5m2 is the top byte of the f16 with the same value."""
        zeros = ir.Constant(_WORD_BYTES, None)
        words = []
        for p in range(self.pairs):
            word, q = divmod(2 * p, 4)
            words.append(self.select_bytes(self.word_bytes(word), zeros, (4, q, 4, q + 1)))
        return self.halves(words, HALF)

    def e4m3(self, want: dt.DType):
        """e4m3 -> f16 (bf16): its 7 exponent-mantissa bits moved to f16's (bf16's) mantissa top, the sign
        kept, times 2^8 (2^120); S.1111.111 is NaN."""
        bld = self.bld
        zeros = ir.Constant(_WORD_BYTES, None)
        shift, field, scale = (1, 0x3F80, 2.0 ** 8) if want == dt.f16 else (4, 0x07F0, 2.0 ** 120)
        element = HALF if want == dt.f16 else BF16
        words, bytes_high = [], []
        for p in range(self.pairs):
            word, q = divmod(2 * p, 4)
            t = self.select_bytes(self.word_bytes(word), zeros, (4, q, 4, q + 1))    # each byte << 8
            bytes_high.append(t)
            magnitude = bld.and_(bld.lshr(t, ir.Constant(I32, shift)), ir.Constant(I32, field * 0x10001))
            words.append(bld.or_(magnitude, bld.and_(t, ir.Constant(I32, 0x80008000))))
        values = bld.fmul(self.halves(words, element), self.splat(element, scale))
        shorts = bld.bitcast(self.halves(bytes_high, HALF), ir.VectorType(I16, self.count))
        nan_field = ir.Constant(ir.VectorType(I16, self.count), [0x7F00] * self.count)
        nan = bld.icmp_unsigned("==", bld.and_(shorts, nan_field), nan_field)
        return bld.select(nan, self.splat(element, float("nan")), values)


def _e8m0_to_bf16(bld: ir.IRBuilder, data):
    """e8m0 x -> bf16 2^(x - 127): x in the exponent field; 0 is the subnormal 0x0040, 0xFF NaN."""
    count = data.type.count
    t16 = ir.VectorType(I16, count)
    x = bld.zext(data, t16)
    bits = bld.shl(x, int_constant(t16, 7))
    bits = bld.select(bld.icmp_unsigned("==", x, int_constant(t16, 0)), int_constant(t16, 0x0040), bits)
    bits = bld.select(bld.icmp_unsigned("==", x, int_constant(t16, 0xFF)), int_constant(t16, 0x7FC0), bits)
    return bld.bitcast(bits, ir.VectorType(BF16, count))

