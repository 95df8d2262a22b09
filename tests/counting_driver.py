"""The real CUDA driver bindings with every `cu*` call counted: the GPU tests that say how many driver calls a
warm launch makes (tests/runtime/test_launch_gpu.py, tests/kernels_lib/test_gemm_launch_calls_on_gpu.py) put
it in place of `tessera.runtime.cuda._driver()`."""

from collections import Counter


class CountingDriver:
    """The real driver bindings, counting each `cu*` call."""

    def __init__(self, real):
        self.real, self.counts = real, Counter()

    def __getattr__(self, name):
        value = getattr(self.real, name)
        if not (name.startswith("cu") and callable(value)):
            return value

        def counted(*args, **kwargs):
            self.counts[name] += 1
            return value(*args, **kwargs)
        return counted
