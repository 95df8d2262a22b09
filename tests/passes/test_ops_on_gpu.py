"""On a machine with an NVIDIA GPU: every kernel of the lowering table runs on the device
and matches the CPU tile interpreter (the same table the SIMT simulator is checked with)."""

import numpy as np
import pytest

from tessera.backends.interp import run_function
from tessera.testing import assert_close

from test_lower_to_threads import CASES, orders_agree

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _to_device(value):
    return torch.from_numpy(value.copy()).cuda() if isinstance(value, np.ndarray) else value


@pytest.mark.parametrize("num_warps", [1, 4])
@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_on_the_gpu_matches_the_interpreter(name, num_warps):
    case = CASES[name]
    expected = case.make_args(np.random.default_rng(0))
    module = case.kernel.specialize(*expected, **case.constexprs).module
    run_function(module.functions[0], expected, case.grid)

    on_device = [_to_device(a) for a in case.make_args(np.random.default_rng(0))]
    case.kernel[case.grid](*on_device, **case.constexprs, num_warps=num_warps)
    torch.cuda.synchronize()
    for index, (want, got) in enumerate(zip(expected, on_device)):
        if not isinstance(want, np.ndarray):
            continue
        got = got.cpu().numpy()
        if index in case.order_dependent:
            agree = orders_agree(case, module, got, index)
            assert agree.all(), (f"argument {index}: elements {np.flatnonzero(~agree)[:16].tolist()} match no "
                                 f"order of the programs")
            continue
        exact = want.dtype.kind != "f"   # device math (libdevice, fused reductions) may differ in the last bits
        assert_close(got, want, rtol=0 if exact else 1e-5, atol=0 if exact else 1e-6, name=f"argument {index}")
