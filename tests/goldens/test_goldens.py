"""Generated code is unchanged: every tutorial kernel and library GEMM config compiles to its golden text.

The goldens (`tests/goldens/*.json.xz`) hold the PTX for sm_80, sm_90 and
sm_90a and the AMDGCN assembly for gfx942. A change that alters codegen on
purpose regenerates them with `python3 -m tests.goldens --update` (and says
why in its commit); a refactor must leave them byte-identical.
"""

import pytest

from . import store
from .cases import TARGETS, all_cases, generate


@pytest.fixture(scope="module")
def cases():
    return all_cases()


@pytest.mark.parametrize("target", TARGETS)
def test_generated_text_equals_the_goldens(target, cases):
    recorded = store.load(target)
    assert recorded is not None, f"no goldens for {target}: run `python3 -m tests.goldens --update`"
    generated = generate(target, cases)
    report = store.compare(target, recorded, generated)
    if report.not_compared and not (set(recorded.kernels) - set(recorded.libdevice_kernels)):
        pytest.skip(report.not_compared)
    assert report.ok, report.summary()
