"""Tensor maps patched at new addresses (`runtime/tensor_map_patch.py`): a patched map is the driver's map, or the
driver encodes it.

Synthetic "drivers" lay the address out in ways the patcher's hypothesis covers (one word, shifted, beside
flags) and in ways it does not (split over two words, mixed into a checksum, a flag that follows the
address's alignment): for every address the patcher must return exactly the encoder's bytes, and call the
encoder only while learning (and on spot checks) where the layout is learnable. The GPU test compares
patched maps with the real driver's; the default stays off until it passes.
"""

from __future__ import annotations

import random
import warnings

import pytest

from tessera.runtime import tensor_map_patch
from tessera.runtime.tensor_map_patch import PROPOSALS, SPOT_CHECK, AddressPatcher

BASE = 0x7F00_0000_0000


def words(*values: int) -> bytes:
    return b"".join((v & (1 << 64) - 1).to_bytes(8, "little") for v in values + (0x33,) * (16 - len(values)))


LAYOUTS = {     # address -> 128 bytes, as a driver might encode one description
    "word-0": lambda a: words(a, 2, 1, 64, 64),
    "shifted-beside-flags": lambda a: words(7, 9, 11, 0x55 | (a >> 4) << 8, 3),
    "top-flags": lambda a: words(5, (a >> 4) | 0xA << 60),
    "alignment-flag": lambda a: words(a | (a % 1024 == 0) << 63, 2),    # learned per alignment class
}
UNLEARNABLE = {
    "split-over-two-words": lambda a: words(a & 0xFFFFF, a >> 20, 1),
    "checksum": lambda a: words(a, 2, (a * 0x9E3779B97F4A7C15) >> 7, 4),
    "bytes-reversed": lambda a: words(int.from_bytes(a.to_bytes(8, "little"), "big"), 2),
}


def addresses(count: int, seed: int, step: int = 512) -> list[int]:
    rng = random.Random(seed)
    return [BASE + step * rng.randrange(1 << 22) for _ in range(count)]


class Counted:
    def __init__(self, layout):
        self.layout, self.calls = layout, 0

    def __call__(self, address: int) -> bytes:
        self.calls += 1
        return self.layout(address)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_a_learnable_layout_is_patched_exactly_and_mostly_without_the_driver(name):
    encode = Counted(LAYOUTS[name])
    patcher = AddressPatcher(encode)
    seen = addresses(1000, seed=1) + addresses(200, seed=2, step=16)    # 16-byte aligned ones too
    assert [patcher(a) for a in seen] == [LAYOUTS[name](a) for a in seen]
    assert set(patcher.fields) >= {512, 1024, 2048, 4096} and not patcher.broken
    assert encode.calls < len(seen) // 10           # learning, widening the verified bits, spot checks


@pytest.mark.parametrize("name", sorted(UNLEARNABLE))
def test_an_unlearnable_layout_is_always_the_drivers(name):
    encode = Counted(UNLEARNABLE[name])
    patcher = AddressPatcher(encode)
    seen = addresses(300, seed=3) + [BASE + 1024 * i for i in range(1, 40)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # no patched map reached the caller, so no miss to warn about
        assert [patcher(a) for a in seen] == [UNLEARNABLE[name](a) for a in seen]
    assert encode.calls == len(seen) and not patcher.fields


def test_a_field_two_encodes_propose_must_predict_the_third():
    layout = lambda a: words(a, (a >> 20) & 1)      # noqa: E731  (bit 20 also lands in word 1)
    patcher = AddressPatcher(layout)
    for a in (BASE + 512, BASE + 1536, BASE + (1 << 20) + 512):
        patcher(a)
    assert not patcher.fields and patcher.failed == {512: 1}


def test_learning_stops_after_failed_proposals():
    patcher = AddressPatcher(Counted(UNLEARNABLE["checksum"]))
    for a in addresses(60, seed=4):
        patcher(a)
    assert max(patcher.failed.values()) == PROPOSALS and not any(patcher.samples.values())


def test_only_address_bits_seen_varying_are_patched_and_others_checked_against_the_driver():
    """A layout right only while address bit 47 is clear: learned from addresses below 2**47, it is never used
    above: the driver encodes there, and the miss ends patching."""
    layout = lambda a: words(a & ~(1 << 47), 2, (a >> 47) & 1)         # noqa: E731
    encode = Counted(layout)
    patcher = AddressPatcher(encode)
    for a in addresses(30, seed=5, step=1024):
        patcher(a)
    assert 1024 in patcher.fields                     # 1024-byte aligned addresses are patched ...
    calls, far = encode.calls, BASE | 1 << 47 | 1 << 10
    assert patcher(far) == layout(far) and encode.calls == calls + 1     # ... but not one with bit 47 set
    assert patcher.broken and not patcher.fields


def test_a_spot_check_miss_stops_patching_with_a_warning():
    """A driver whose layout changes after the patcher trusted it: the next spot check sees it, and every map
    after is the driver's. At most SPOT_CHECK - 1 wrong maps go out first: the risk the default-off switch
    waits on a GPU run to rule out."""
    state = {"flag": 0}
    layout = lambda a: words(a, state["flag"])      # noqa: E731
    patcher = AddressPatcher(layout)
    seen = addresses(2 * SPOT_CHECK, seed=6)
    for a in seen:
        patcher(a)
    state["flag"] = 1
    with pytest.warns(RuntimeWarning, match="differed from the driver's"):
        wrong = sum(patcher(a) != layout(a) for a in seen)
    assert patcher.broken and 0 < wrong < SPOT_CHECK and all(patcher(a) == layout(a) for a in seen)


@pytest.fixture
def hopper_stub(monkeypatch):
    from tessera.runtime.stub_driver import StubDriver, stubbed_driver
    with stubbed_driver(StubDriver(hopper=True)) as driver:
        yield driver


def description(address: int):
    from tessera.ir import dtypes as dt
    from tessera.runtime.tensor_map import TensorMapDescription
    return TensorMapDescription(global_address=address, dtype=dt.f16, shape=(64, 64), strides=(128, 2),
                                box_shape=(64, 64), swizzle="128B")


@pytest.mark.parametrize("switch", ["0", "1"])
def test_prepared_encodings_patch_only_when_switched_on(hopper_stub, monkeypatch, switch):
    from tessera.runtime.tensor_map import encode_tensor_map, prepare_encoding
    monkeypatch.setenv(tensor_map_patch.ENV, switch)
    encode = prepare_encoding(description(BASE))
    seen = addresses(200, seed=7)
    maps = [encode(a) for a in seen]
    calls = hopper_stub.counts["cuTensorMapEncodeTiled"]
    assert maps == [encode_tensor_map(description(a)) for a in seen]
    assert calls == len(seen) if switch == "0" else calls < 40


@pytest.mark.gpu
def test_patched_maps_equal_the_real_drivers():
    """On a GPU: for each description (dtypes, swizzles, ranks), maps patched at the addresses of live allocations
    (and 16-byte aligned views into them) equal what cuTensorMapEncodeTiled returns. Should pass, with a field
    learned for each, before $TESSERA_TMA_ADDRESS_PATCH defaults on."""
    torch = pytest.importorskip("torch")
    from tessera.ir import dtypes as dt
    from tessera.runtime.tensor_map import TensorMapDescription, encode_tensor_map, prepare_encoding
    cases = [(dt.f16, (64, 64), (128, 2), (64, 64), "128B"),
             (dt.bf16, (4096, 4096), (8192, 2), (64, 64), "128B"),
             (dt.f32, (300, 100), (400, 4), (32, 16), "64B"),
             (dt.u8, (8, 128, 256), (32768, 256, 1), (1, 64, 128), "128B"),
             (dt.f16, (512, 64), (128, 2), (8, 8), "none")]
    buffers = [torch.empty(1 << 16, dtype=torch.uint8, device="cuda") for _ in range(400)]
    places = [t.data_ptr() for t in buffers] + [buffers[0].data_ptr() + 16 * i for i in range(1, 200)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tensor_map_patch.ENV, "1")
        for dtype, shape, strides, box, swizzle in cases:
            desc = lambda a: TensorMapDescription(global_address=a, dtype=dtype, shape=shape, strides=strides,  # noqa
                                                  box_shape=box, swizzle=swizzle)
            encode = prepare_encoding(desc(places[0]))
            assert [encode(a) for a in places] == [encode_tensor_map(desc(a)) for a in places], (dtype, shape)
            assert encode.patcher.fields, f"no field learned for {dtype.name} {shape}: the driver's layout is not one"
