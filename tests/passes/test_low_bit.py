"""The low-bit unpacking pass (`passes/low_bit.py`): sub-byte loads and stores become byte accesses.

Specification:

* a `vector = k` load whose groups are whole bytes reads each group's bytes
  in aligned accesses of up to 16 bytes, and `unpack_bits` makes the
  registers; casts that are all the load's uses fuse into the unpack;
* other loads read each element's byte (and the next one where a 3-, 5-,
  6- or 7-bit element straddles two) and shift the element out;
* a vector store of whole bytes packs them (`pack_bits`) and stores bytes;
  other stores clear, then set the element's bits with atomic and/or on its
  bytes (other threads may own the rest of a byte);
* a masked load keeps its `other` where zero bytes decode to another value;
* a load a loop carries to the next iteration's casts (issued a step ahead)
  is carried as its packed bytes and unpacked, fused with the cast, in the body;
* atomics on packed elements are errors that name the fix;
* for every sub-byte type (i1..i7, u1..u7, fp4, fp6) a kernel that loads a
  tile, stores it as f32 and stores it back packed computes on the SIMT
  simulator, before and after the pass, what the tile interpreter computes:
  on aligned tiles (packed path) and ragged ones (element path).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.backends.interp import run_function
from tessera.backends.interp.storage import Memory
from tessera.backends.simt import run_threads
from tessera.ir import dtypes as dt
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.target import get_target
from tessera.ir.verifier import verify_module
from tessera.passes.errors import LoweringError
from tessera.passes.layout_assignment import assign_layouts, pinned_layouts
from tessera.passes.low_bit import unpack_low_bit
from tessera.passes.lower_to_threads import lower_to_threads
from tessera.passes.lowering.vector_facts import VectorFacts
from tessera.passes.shared_memory import allocate_shared_memory
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "backends"))
from low_bit_programs import roundtrip  # noqa: E402  (loads a packed tile, stores it as f32 and packed)

SUB_BYTE = [d for d in dt.ALL_DTYPES if d.is_subbyte]

# Thread t holds elements 8t .. 8t+7 of a packed tensor (what a blocked layout of 8 per thread gives).
PROLOGUE = """\
func @k(%w: ptr<DTYPE>, %out: ptr<f16>) attributes {num_threads = 32, warp_size = 32} {
  %tid = thread_id : i32
  %c8 = constant {value = 8} : i32
  %first = mul %tid, %c8 : i32
  %starts = splat %first : regs<8xi32>
  %c0 = constant {value = 0} : i32
  %c1 = constant {value = 1} : i32
  %c2 = constant {value = 2} : i32
  %c3 = constant {value = 3} : i32
  %c4 = constant {value = 4} : i32
  %c5 = constant {value = 5} : i32
  %c6 = constant {value = 6} : i32
  %c7 = constant {value = 7} : i32
  %lanes = pack %c0, %c1, %c2, %c3, %c4, %c5, %c6, %c7 : regs<8xi32>
  %offsets = add %starts, %lanes : regs<8xi32>
  %ws = splat %w : regs<8xptr<DTYPE>>
  %wp = addptr %ws, %offsets : regs<8xptr<DTYPE>>
"""
STORE_F16 = """\
  %os = splat %out : regs<8xptr<f16>>
  %op = addptr %os, %offsets : regs<8xptr<f16>>
  store %op, %x {vector = 8}
  return
}
"""


def rewritten(body: str, dtype: str = "u4") -> str:
    module = parse_module((PROLOGUE + body).replace("DTYPE", dtype))
    unpack_low_bit(module)
    verify_module(module)
    text = print_module(module)
    prologue = PROLOGUE.replace("DTYPE", dtype)
    assert text.startswith(prologue)
    return text[len(prologue):]


def test_a_vector_load_of_whole_bytes_becomes_one_byte_load_and_an_unpack_that_absorbs_the_cast():
    after = rewritten("""\
  %q = load %wp {vector = 8} : regs<8xu4>
  %x = cast %q : regs<8xf16>
""" + STORE_F16)
    assert after == """\
  %0 = byte_address %wp : regs<8xptr<u8>>
  %1 = extract %0 {index = 0} : ptr<u8>
  %2 = splat %1 : regs<4xptr<u8>>
  %3 = constant {value = 0} : i32
  %4 = constant {value = 1} : i32
  %5 = constant {value = 2} : i32
  %6 = constant {value = 3} : i32
  %7 = pack %3, %4, %5, %6 : regs<4xi32>
  %8 = addptr %2, %7 : regs<4xptr<u8>>
  %9 = load %8 {vector = 4} : regs<4xu8>
  %q = unpack_bits %9 {packed = "u4"} : regs<8xf16>
""" + STORE_F16.replace("%x", "%q")


CARRIED = """\
  %first_codes = load %wp {vector = 8} : regs<8xDTYPE>
  %zero = constant {value = 0.0} : regs<8xf16>
  %c256 = constant {value = 256} : i32
  %sum, %last = for %c0, %c2, %c1, %zero, %first_codes : regs<8xf16>, regs<8xDTYPE> {
  ^(%i: i32, %acc: regs<8xf16>, %codes: regs<8xDTYPE>):
    %next = add %i, %c1 : i32
    %skip = mul %next, %c256 : i32
    %step = splat %skip : regs<8xi32>
    %ahead_ptrs = addptr %wp, %step : regs<8xptr<DTYPE>>
    %ahead = load %ahead_ptrs {vector = 8} : regs<8xDTYPE>
    %values = cast %codes : regs<8xf16>
    %acc_next = add %acc, %values : regs<8xf16>
    yield %acc_next, %ahead
  }
  %x = cast %sum : regs<8xf16>
"""


def test_codes_loaded_a_step_ahead_are_carried_packed_and_unpacked_where_they_are_cast():
    """A u4 load whose registers a loop carries to the next iteration's cast (a K step's codes loaded one
    step ahead): the loop carries the packed bytes and the body unpacks them straight into f16 (the fused
    conversion), not u4 registers converted one by one; the SIMT simulator computes the same before and
    after."""
    text = rewritten(CARRIED + STORE_F16)
    assert "%codes: regs<4xu8>):" in text and "for %c0, %c2, %c1, %zero, %9 : regs<8xf16>, regs<4xu8> {" in text
    assert '= unpack_bits %codes {packed = "u4"} : regs<8xf16>' in text
    assert "cast %codes" not in text and "regs<8xu4>" not in text
    patterns = np.random.default_rng(7).integers(0, 16, 3 * 256)
    results = []
    for rewrite in (False, True):
        module = parse_module((PROLOGUE + CARRIED + STORE_F16).replace("DTYPE", "u4"))
        if rewrite:
            unpack_low_bit(module)
        out = np.zeros(256, np.float16)
        run_threads(module.functions[0], [Memory(dt.pack(patterns, dt.u4), dt.u4, numel=3 * 256), out], (1,))
        results.append(out)
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[1], (patterns[:256] + patterns[256:512]).astype(np.float16))


def test_groups_load_their_own_bytes_under_their_own_mask():
    after = rewritten("""\
  %n = constant {value = 100} : regs<8xi32>
  %inside = cmp %offsets, %n {pred = "lt"} : regs<8xbool>
  %q = load %wp, %inside {vector = 4} : regs<8xu4>
  %y = cast %q : regs<8xi8>
  %z = add %y, %y : regs<8xi8>
  %x = cast %z : regs<8xf16>
""" + STORE_F16)
    assert """\
  %1 = extract %0 {index = 0} : ptr<u8>
  %2 = extract %0 {index = 4} : ptr<u8>
  %3 = pack %1, %1, %2, %2 : regs<4xptr<u8>>
""" in after
    assert """\
  %8 = extract %inside {index = 0} : bool
  %9 = extract %inside {index = 4} : bool
  %10 = pack %8, %8, %9, %9 : regs<4xbool>
  %11 = load %7, %10 {vector = 2} : regs<4xu8>
  %q = unpack_bits %11 {packed = "u4"} : regs<8xi8>
""" in after


def test_a_load_whose_uses_are_not_all_one_cast_unpacks_to_its_own_type():
    after = rewritten("""\
  %q = load %wp {vector = 8} : regs<8xi3>
  %s = add %q, %q : regs<8xi3>
  %x = cast %s : regs<8xf16>
""" + STORE_F16, "i3")
    assert "%q = unpack_bits %8 {packed = \"i3\"} : regs<8xi3>" in after
    assert "%8 = load %7 : regs<3xu8>" in after        # 24 bits: three bytes, one at a time (3 is no power of 2)


def test_an_unaligned_load_shifts_each_element_out_of_its_bytes():
    after = rewritten("""\
  %q = load %wp : regs<8xi3>
  %x = cast %q : regs<8xf16>
""" + STORE_F16, "i3")
    assert after == """\
  %0 = byte_address %wp : regs<8xptr<u8>>
  %1 = load %0 : regs<8xu8>
  %2 = bit_offset %wp : regs<8xi32>
  %3 = constant {value = 3} : regs<8xi32>
  %4 = add %2, %3 : regs<8xi32>
  %5 = constant {value = 8} : regs<8xi32>
  %6 = cmp %4, %5 {pred = "gt"} : regs<8xbool>
  %7 = constant {value = 1} : regs<8xi32>
  %8 = addptr %0, %7 : regs<8xptr<u8>>
  %9 = load %8, %6 : regs<8xu8>
  %10 = cast %9 : regs<8xu16>
  %11 = constant {value = 8} : regs<8xu16>
  %12 = shl %10, %11 : regs<8xu16>
  %13 = cast %1 : regs<8xu16>
  %14 = or %13, %12 : regs<8xu16>
  %15 = cast %2 : regs<8xu16>
  %16 = shr %14, %15 : regs<8xu16>
  %q = cast %16 : regs<8xi3>
  %x = cast %q : regs<8xf16>
""" + STORE_F16


def test_a_vector_store_of_whole_bytes_packs_them():
    after = rewritten("""\
  %v = constant {value = 2} : regs<8xu2>
  store %wp, %v {vector = 8}
  %x = constant {value = 0.0} : regs<8xf16>
""" + STORE_F16, "u2")
    assert "%7 = pack_bits %v : regs<2xu8>\n  store %6, %7 {vector = 2}\n" in after


def test_an_unaligned_store_clears_and_sets_its_bits_atomically():
    after = rewritten("""\
  %v = constant {value = -1} : regs<8xi3>
  store %wp, %v
  %x = constant {value = 0.0} : regs<8xf16>
""" + STORE_F16, "i3")
    assert after == """\
  %v = constant {value = -1} : regs<8xi3>
  %0 = byte_address %wp : regs<8xptr<u8>>
  %1 = bit_offset %wp : regs<8xi32>
  %2 = cast %1 : regs<8xu16>
  %3 = cast %v : regs<8xu3>
  %4 = cast %3 : regs<8xu16>
  %5 = shl %4, %2 : regs<8xu16>
  %6 = constant {value = 7} : regs<8xu16>
  %7 = shl %6, %2 : regs<8xu16>
  %8 = cast %7 : regs<8xu8>
  %9 = cast %5 : regs<8xu8>
  %10 = not %8 : regs<8xu8>
  %11 = atomic_rmw %0, %10 {kind = "and"} : regs<8xu8>
  %12 = atomic_rmw %0, %9 {kind = "or"} : regs<8xu8>
  %13 = constant {value = 8} : regs<8xu16>
  %14 = shr %7, %13 : regs<8xu16>
  %15 = cast %14 : regs<8xu8>
  %16 = constant {value = 0} : regs<8xu8>
  %17 = cmp %15, %16 {pred = "ne"} : regs<8xbool>
  %18 = constant {value = 1} : regs<8xi32>
  %19 = addptr %0, %18 : regs<8xptr<u8>>
  %20 = shr %5, %13 : regs<8xu16>
  %21 = cast %20 : regs<8xu8>
  %22 = not %15 : regs<8xu8>
  %23 = atomic_rmw %19, %22, %17 {kind = "and"} : regs<8xu8>
  %24 = atomic_rmw %19, %21, %17 {kind = "or"} : regs<8xu8>
  %x = constant {value = 0.0} : regs<8xf16>
""" + STORE_F16


def test_a_masked_load_keeps_an_other_that_zero_bytes_do_not_decode_to():
    after = rewritten("""\
  %n = constant {value = 100} : regs<8xi32>
  %inside = cmp %offsets, %n {pred = "lt"} : regs<8xbool>
  %fill = constant {value = 3} : regs<8xu4>
  %q = load %wp, %inside, %fill {vector = 8} : regs<8xu4>
  %x = cast %q : regs<8xf16>
""" + STORE_F16)
    assert '%q = unpack_bits %11 {packed = "u4"} : regs<8xf16>\n' \
           '  %12 = constant {value = 3.0} : regs<8xf16>\n  %13 = select %inside, %q, %12 : regs<8xf16>\n' in after
    zero_fill = rewritten("""\
  %n = constant {value = 100} : regs<8xi32>
  %inside = cmp %offsets, %n {pred = "lt"} : regs<8xbool>
  %fill = constant {value = 0} : regs<8xu4>
  %q = load %wp, %inside, %fill {vector = 8} : regs<8xu4>
  %x = cast %q : regs<8xf16>
""" + STORE_F16)
    assert "select" not in zero_fill


def test_atomics_on_packed_elements_are_errors_that_name_the_fix():
    module = parse_module((PROLOGUE + """\
  %v = constant {value = 1} : regs<8xu4>
  %old = atomic_rmw %wp, %v {kind = "add"} : regs<8xu4>
  return
}
""").replace("DTYPE", "u4"))
    with pytest.raises(LoweringError, match=r"atomics on packed u4 elements are not supported; keep the values in a "
                                            r"type of 8 bits or more \(e.g. u8\)"):
        unpack_low_bit(module)


@pytest.mark.parametrize("text, message", [
    ("%x = unpack_bits %b {packed = \"u4\"} : regs<5xf16>", "2 bytes hold 4 u4 elements, not 5"),
    ("%x = unpack_bits %b {packed = \"u16\"} : regs<1xu16>", "unpacks types of 1 to 8 bits, got u16"),
    ("%x = byte_address %p : ptr<u8>", r"takes a global pointer \(or registers of them\) to a sub-byte type"),
    ("%x = pack_bits %b : regs<2xu8>\n  %y = pack_bits %q : regs<1xu8>", "3 u3 elements are 9 bits"),
])
def test_the_low_bit_ops_check_their_types(text, message):
    module = f"""\
func @k(%p: ptr<u8>, %w: ptr<u4>) {{
  %b = constant {{value = 1}} : regs<2xu8>
  %q = constant {{value = 1}} : regs<3xu3>
  {text}
  return
}}
"""
    with pytest.raises(Exception, match=message):
        verify_module(parse_module(module))


# -- every sub-byte type through the SIMT simulator ----------------------------------------------


def _lower_without_the_pass(module, target="sm_80", num_warps=4):
    fn, target = module.functions[0], get_target(target)
    facts = VectorFacts(fn)
    assignment = assign_layouts(fn, target, num_warps, pinned_layouts(fn), facts)
    lowered = lower_to_threads(fn, assignment, target, num_warps, facts).functions[0]
    allocate_shared_memory(lowered)
    return lowered


@pytest.mark.parametrize("shape", [(32, 128, 16, 128), (19, 45, 16, 32)], ids=["aligned", "ragged"])
@pytest.mark.parametrize("dtype", SUB_BYTE, ids=str)
def test_every_sub_byte_type_loads_and_stores_as_the_interpreter_does(dtype, shape):
    K, N, BK, BN = shape
    patterns = np.random.default_rng(dtype.bits).integers(0, 1 << dtype.bits, K * N)
    packed = dt.pack(patterns, dtype)

    def arguments():
        return [Memory(packed.copy(), dtype, numel=K * N), np.zeros((K, N), np.float32),
                Memory(np.zeros_like(packed), dtype, numel=K * N), K, N]

    spec = roundtrip.specialize(tessera.reinterpret(packed, dtype), np.zeros((K, N), np.float32),
                                tessera.reinterpret(packed, dtype), K, N, BK=BK, BN=BN)
    grid = (tessera.cdiv(K, BK), tessera.cdiv(N, BN))
    expected = arguments()
    run_function(spec.module.functions[0], expected, grid)
    np.testing.assert_array_equal(expected[1], dtype.decode(patterns).reshape(K, N))
    after = lower(spec.module, "sm_80").functions[0]
    before = _lower_without_the_pass(spec.module)
    assert any(op.name == "byte_address" for op in after.walk())
    for fn in (before, after):
        got = arguments()
        run_threads(fn, got, grid)
        np.testing.assert_array_equal(got[1], expected[1])
        np.testing.assert_array_equal(got[2].array, expected[2].array)
    whole_bytes = shape[1] % 32 == 0
    assert any(op.name == "unpack_bits" for op in after.walk()) == whole_bytes
    assert any(op.name == "atomic_rmw" for op in after.walk()) != whole_bytes


# -- on a GPU: the byte loads, unpacks, packs and atomics on real hardware -----------------------------

LOW_BIT = SUB_BYTE + [dt.f8e4m3, dt.f8e5m2, dt.e8m0]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(64, 256, 32, 128), (19, 45, 16, 32)], ids=["aligned", "ragged"])
@pytest.mark.parametrize("dtype", LOW_BIT, ids=str)
def test_on_the_gpu_every_low_bit_type_loads_and_stores_what_numpy_says(dtype, shape):
    torch = pytest.importorskip("torch")
    K, N, BK, BN = shape
    patterns = np.random.default_rng(dtype.bits).integers(0, 1 << dtype.bits, K * N)
    packed = dt.pack(patterns, dtype) if dtype.is_subbyte else patterns.astype(np.uint8)
    source, copy = torch.from_numpy(packed).cuda(), torch.zeros(packed.size, dtype=torch.uint8, device="cuda")
    out = torch.zeros((K, N), dtype=torch.float32, device="cuda")
    roundtrip[(tessera.cdiv(K, BK), tessera.cdiv(N, BN))](tessera.reinterpret(source, dtype), out,
                                                          tessera.reinterpret(copy, dtype), K, N, BK=BK, BN=BN)
    values = dtype.decode(patterns).reshape(K, N)
    got = out.cpu().numpy()
    assert ((got == values) | (np.isnan(got) & np.isnan(values))).all()
    stored = copy.cpu().numpy()
    if not dtype.is_subbyte:
        stored, packed = dtype.decode(stored), dtype.decode(packed)         # a NaN may come back canonical
        assert ((stored == packed) | (np.isnan(stored) & np.isnan(packed))).all()
    else:
        np.testing.assert_array_equal(stored, packed)
