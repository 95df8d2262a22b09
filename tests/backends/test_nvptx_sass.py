"""`sass.unset_descriptor_words`: a wgmma whose A or B descriptor's high word (SBO, swizzle) is not built from
the kernel's descriptor fields is found in SASS text. The cases are cut from ptxas 13.0's SASS of the attention
forward (BM = 128, two consumer warpgroups) before and after the fix in `passes/lowering/wgmma_dot.py`."""

from tessera.backends.nvptx.sass import _LINE, SassInstruction, descriptor_immediates, unset_descriptor_words

HIGH = {0x40000040}     # 128B swizzle, SBO 1024 bytes: MatrixDescriptor(0, 16, 1024, 128).encode() >> 32


def sass(text: str) -> list[SassInstruction]:
    return [SassInstruction(int(m.group(1), 16), m.group(2)) for m in _LINE.finditer(text)]


# ptxas 13.0 on `mul.wide.s32 %rd74, %r4, 512` (%r4 the shuffled warpgroup index) added to the descriptor:
# the low word reaches UR16, the high word (UR17) is never written
DROPPED = sass("""
        /*1330*/                   IMAD.WIDE R24, R27, 0x200, R24 ;
        /*1380*/                   R2UR UR16, R24 ;
        /*1490*/                   UIADD3 UR16, UR16, 0x10000, URZ ;
        /*1580*/                   UIADD3.64 UR20, UR16, 0x2, URZ ;
        /*1930*/                   UIADD3 UR18, UP0, UR8, UR6, URZ ;
        /*1940*/                   UIADD3.X UR31, UR9, 0x40000040, URZ, UP0, !UPT ;
        /*1980*/                   UMOV UR19, UR31 ;
        /*1990*/                   UMOV UR23, UR31 ;
        /*19a0*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR16], RZ, !UPT ;
        /*19c0*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR20], R24 ;
""")

# the head-dim-128 kernel: the high word's register holds a shared address computed for something else
STALE = sass("""
        /*1d00*/                   R2UR UR5, R7 ;
        /*1d70*/                   IMAD.WIDE R24, R89, 0x200, R24 ;
        /*1dc0*/                   R2UR UR6, R24 ;
        /*1df0*/                   UIADD3 UR5, UP1, UR5, 0x10000, URZ ;
        /*1ed0*/                   UIADD3 UR4, UR6, 0x10000, URZ ;
        /*2720*/                   UIADD3.X UR7, UR9, 0x40000040, URZ, UP0, !UPT ;
        /*2770*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR4], RZ, !UPT ;
""")

# after the fix: the start field in 32 bits, the high word a constant
BUILT = sass("""
        /*1700*/                   UMOV UR8, UR14 ;
        /*1710*/                   UMOV UR9, 0x40000040 ;
        /*1720*/                   UIADD3.64 UR12, UR8, 0x2, URZ ;
        /*1730*/                   UMOV UR10, UR22 ;
        /*1740*/                   UIADD3.X UR11, UR24, 0x40000040, URZ, UP0, !UPT ;
        /*1750*/                   UMOV UR14, UR10 ;
        /*1760*/                   UMOV UR15, UR11 ;
        /*17f0*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ;
        /*1800*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR12], R24, gsb0 ;
        /*2cb0*/                   HGMMA.64x64x16.F32.BF16 R56, R36, gdesc[UR8].tnspB, R56 ;
""")


def test_a_high_word_never_written_is_reported():
    bad = unset_descriptor_words(DROPPED, HIGH)
    assert len(bad) == 2 and "A descriptor high word UR17 never written" in bad[0]
    assert "UR21" in bad[1]         # the next slice's descriptor is the first's plus 2: the same garbage above


def test_a_high_word_built_from_other_values_is_reported():
    bad = unset_descriptor_words(STALE, HIGH)
    assert len(bad) == 1 and "UR5 built from" in bad[0] and "0x40000040" not in bad[0]


def test_a_high_word_built_from_the_fields_passes_through_moves_and_64_bit_adds():
    assert unset_descriptor_words(BUILT, HIGH) == []
    assert 0x40000040 in descriptor_immediates(BUILT, 8, "UR13")     # UIADD3.64 UR12 <- UR8:UR9 <- UMOV
    assert unset_descriptor_words(BUILT, {0x40000020}), "another tile's fields do not count"


def test_a_negative_immediate_is_the_same_32_bit_word():
    """ptxas writes 0x80000020 (64B swizzle, SBO 512) as -0x7fffffe0 where it adds it with a carry."""
    code = sass("""
        /*09b0*/                   USHF.R.S32.HI UR8, URZ, 0x1f, UR7 ;
        /*09c0*/                   UIADD3 UR16, UP0, UR7, UR23, URZ ;
        /*09d0*/                   UIADD3 UR18, UP1, UR7, UR22, URZ ;
        /*09e0*/                   UIADD3.X UR17, UR8, -0x7fffffe0, URZ, UP0, !UPT ;
        /*09f0*/                   UIADD3.X UR19, UR8, 0x40000040, URZ, UP1, !UPT ;
        /*0a00*/                   HGMMA.64x64x16.F32 R24, gdesc[UR16].tnspB, R24 ;
""")
    assert unset_descriptor_words(code, {0x80000020, 0x40000040}) == []
    assert "B descriptor high word UR19" in unset_descriptor_words(code, {0x80000020})[0]
