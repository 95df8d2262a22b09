"""Keeping one GPU test's broken CUDA context from failing every later test in its process (`conftest.py`).

An illegal address (or a device-side assert, an unspecified launch failure, ...) is sticky: the context that
saw it fails every later call, so in one `pytest -m gpu` process the first bad kernel turns every test after
it into a failure (the H100 run of 2026-11-26: 275 failures from about 5 real ones). After each test marked
`gpu`, `context_error` synchronizes the contexts that are already in use -- torch's, when torch is imported
and has initialized CUDA, and those Tessera's runtime opened -- and never initializes CUDA itself (so a CPU
machine's `pytest -m gpu` still skips cleanly, and a test that never touched the GPU costs nothing). When it
reports an error, `after_poisoning` says what to do: under pytest-xdist end the worker process at once
(xdist reports the test as crashed and starts a fresh worker for the rest: `bench/gpu_session.py` allows
enough restarts); in a single process, fail this test and every later GPU test with a message naming the
test that broke the context, since they cannot run in it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Iterable

Probe = Callable[[], None]      # synchronizes one context in use; raises what the context reports


def context_probes() -> list[Probe]:
    """Synchronizations of the CUDA contexts this process already uses; none that would initialize CUDA."""
    probes: list[Probe] = []
    torch = sys.modules.get("torch")
    if torch is not None and getattr(getattr(torch, "cuda", None), "is_initialized", lambda: False)():
        probes.append(torch.cuda.synchronize)
    cuda = sys.modules.get("tessera.runtime.cuda")
    if cuda is not None and getattr(cuda, "_initialized", False):
        probes.extend(device.synchronize for device in list(cuda._devices.values()))
    return probes


def context_error(probes: Iterable[Probe]) -> str | None:
    """What the first failing probe raised (type and message), or None when every context synchronizes.
    Any error counts: whatever a synchronize after the test reports was left behind by the test, and the
    sticky kinds (illegal address, launch failure, device assert) make the context unusable."""
    for probe in probes:
        try:
            probe()
        except Exception as exc:        # torch.AcceleratorError / RuntimeError, tessera's LaunchError
            return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return None


@dataclass(frozen=True)
class Poisoning:
    """The test after which a context failed to synchronize, what it reported, and what to do: "exit" the
    process (an xdist worker: xdist reports the test as crashed and starts a fresh worker) or "fail" this and
    the later GPU tests (a single process: nothing would restart it)."""

    nodeid: str
    error: str
    action: str

    def message(self) -> str:
        return (f"the CUDA context is unusable after {self.nodeid}: synchronizing it raised {self.error}; every "
                f"later GPU call in this process would fail the same way")


def check_after_test(nodeid: str, marked_gpu: bool, probes: Iterable[Probe], under_xdist: bool) -> Poisoning | None:
    """After a test's call: None when it is not marked `gpu` (its probes are not even run) or every context it
    may have used synchronizes; else the Poisoning, with the action for this kind of process."""
    if not marked_gpu:
        return None
    error = context_error(probes)
    if error is None:
        return None
    return Poisoning(nodeid, error, "exit" if under_xdist else "fail")
