"""`tessera::gemm`'s plans (`gemm_plan.py`): a warm call replays exactly the launches the general path makes.

The op's GPU path runs on the stub driver with CPU tensors standing in for
CUDA ones (`gemm_plan.stub_gpu_operands`). "Compiling" writes the
specialization key into the binary (as in tests/dsl/test_fast_launch.py), so
each launch says which specialization it ran; the stub records the grid and
stream, and the launch's packed argument values are read back from its
launcher. For random calls -- shapes that take the tiled and both split-K
paths, float16 / float32, transposes, a bias, activations, misaligned and
overlapping operands, alpha -- the replayed launches must equal the general
path's (with the plans switched off) for the same call, fresh allocations
(C, the workspace) aside.
"""

from __future__ import annotations

import contextlib
import importlib
import types
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera.dsl import gpu_launch  # noqa: E402
from tessera.kernels_lib import gemm_plan, gemm_stream_k  # noqa: E402
from tessera.kernels_lib.gemm_plan import stub_gpu_operands  # noqa: E402
from tessera.runtime.stub_driver import StubDriver, stubbed_driver  # noqa: E402

gemm = importlib.import_module("tessera.kernels_lib.gemm")    # the package exports the function `gemm`
KERNELS = (gemm.gemm_kernel.kernel, gemm.gemm_kernel_fast.kernel, gemm.gemm_split_k.gemm_split_k_kernel,
           gemm.gemm_split_k.gemm_split_k_kernel_fast, gemm.gemm_split_k.gemm_split_k_reduce_kernel,
           gemm.gemm_split_k.gemm_split_k_reduce_kernel_fast, gemm_stream_k.gemm_stream_k_kernel,
           gemm_stream_k.gemm_stream_k_kernel_fast)
TUNED = (gemm.gemm_kernel, gemm.gemm_kernel_fast)


def fake_binary(kernel, bound, target, num_warps):
    """A 'binary' naming the specialization it was compiled for."""
    return types.SimpleNamespace(name=kernel.name, target=target, ptx=None, metadata={"num_threads": 128},
                                 binary=repr((kernel.name, bound.key, num_warps)).encode())


def forget_launches() -> None:
    """Drop the kernels' launchers and warm launches (as a test swapping the driver does)."""
    for kernel in KERNELS:
        kernel.launchers.clear()
        kernel.fast_launches.clear()
    for tuned in TUNED:
        tuned.fast_launches.clear()


def forget() -> None:
    """Drop launchers, warm launches and plans made on another driver (or with other binaries)."""
    forget_launches()
    gemm.clear_plans()


@contextlib.contextmanager
def stub_gpu(*, hopper: bool = False, fake: bool = True):
    """The op's GPU path on a fresh stub driver (an sm_80 one by default), the tiled kernel pinned."""
    gemm.pin_config(gemm.CONFIGS[0])
    forget()
    try:
        with pytest.MonkeyPatch.context() as mp, stubbed_driver(ValueStub(hopper=hopper)) as driver, \
                stub_gpu_operands():
            if fake:
                mp.setattr(gpu_launch, "binary_for", fake_binary)
            yield driver
    finally:
        forget()
        gemm.pin_config(None)


class ValueStub(StubDriver):
    """The stub driver, keeping for each recorded cuLaunchKernel (by its index in `calls`) the values its
    parameter buffer held."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.values: dict[int, tuple] = {}

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        packer = next(launcher.packer for kernel in KERNELS for launcher in kernel.launchers.values()
                      if launcher.packer.kernel_params == params)
        result = super().cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
        self.values[len(self.calls) - 1] = tuple(packer.decode())
        return result


class NoPlans(dict):
    """In place of the op's plans: nothing found, nothing kept (the general path on every call)."""

    def remember(self, *args) -> None:
        pass


def launched(driver, since: int, named: dict[int, str]) -> list[tuple]:
    """The launches recorded after call `since`: (binary, grid, block, shared, stream, argument values), each
    pointer value named by `named` (address -> "a", "b", ...) or "fresh" (an allocation of the call)."""
    packers = {launcher.packer.kernel_params: launcher.packer for kernel in KERNELS
               for launcher in kernel.launchers.values()}
    out = []
    for index, call in enumerate(driver.calls[since:], start=since):
        if call[0] != "cuLaunchKernel":
            continue
        function, grid, block, shared, stream, params = call[1:7]
        values = tuple(named.get(v, "fresh") if slot.is_pointer else v
                       for slot, v in zip(packers[params].slots, driver.values[index]))
        out.append((function[2][2].decode(), grid, block, shared, stream, values))
    return out


calls = st.fixed_dictionaries({
    "MNK": st.sampled_from([(16, 64, 64), (64, 64, 64), (64, 40, 24), (100, 96, 64), (128, 128, 128),
                            (256, 64, 1024)]),
    "dtype": st.sampled_from([torch.float16, torch.float32]),
    "trans_a": st.booleans(), "trans_b": st.booleans(),
    "bias": st.sampled_from([None, "f32", "out"]),
    "activation": st.sampled_from([None, "relu", "gelu"]),
    "out_dtype": st.sampled_from([None, torch.float32]),
    "alpha": st.sampled_from([1.0, 0.5, 2]),
})


def variants(call) -> list[tuple]:
    """`_gemm` arguments for `call` whose operands differ only in what their addresses say: aligned or not
    (A, B, the bias), A at another aligned address, B overlapping A (B is A; B a view into A's buffer), the
    bias inside A's buffer. The plan key must tell apart every pair the kernels' entries tell apart."""
    M, N, K = call["MNK"]
    dtype, trans_a, trans_b = call["dtype"], call["trans_a"], call["trans_b"]
    out_dtype = call["out_dtype"] or dtype
    bias_dtype = None if call["bias"] is None else torch.float32 if call["bias"] == "f32" else out_dtype
    a_shape, b_shape = ((K, M) if trans_a else (M, K)), ((N, K) if trans_b else (K, N))
    buffer = torch.randn(4 * (M * K + K * N + N) + 64).to(dtype)

    def at(offset: int, shape: tuple[int, int], transposed: bool = False) -> torch.Tensor:
        rows, cols = shape
        return buffer[offset:offset + rows * cols].view(cols, rows).t() if transposed else \
            buffer[offset:offset + rows * cols].view(rows, cols)

    def bias_at(offset: int | str):
        if bias_dtype is None:
            return None
        if isinstance(offset, str):             # inside A's or B's part of the buffer (when the dtypes agree)
            start = 16 if offset == "a" else far + 16
            return buffer[start:start + N] if bias_dtype == dtype else torch.randn(N).to(bias_dtype)
        return torch.randn(N + offset).to(bias_dtype)[offset:]

    far = M * K + 64                            # B's place, clear of A
    cases = [(at(0, a_shape), at(far, b_shape, trans_b), bias_at(0)),
             (at(1, a_shape), at(far, b_shape, trans_b), bias_at(0)),              # A misaligned
             (at(32, a_shape), at(far + 32, b_shape, trans_b), bias_at(0)),        # both elsewhere, aligned
             (at(0, a_shape), at(far + 3, b_shape, trans_b), bias_at(0)),          # B misaligned
             (at(0, a_shape), at(far, b_shape, trans_b), bias_at(1)),              # the bias misaligned
             (at(0, a_shape), at(M * K // 2, b_shape, trans_b), bias_at("a")),     # B overlaps A, bias in A
             (at(0, a_shape), at(far, b_shape, trans_b), bias_at("b"))]            # the bias in B
    if a_shape == b_shape and not trans_b:
        cases.append((cases[0][0], cases[0][0], bias_at(0)))                       # B is A
    rest = (None, None, call["activation"], call["out_dtype"], trans_a, trans_b, call["alpha"])
    return [(a, b, bias, *rest) for a, b, bias in cases]


def run(driver, args) -> list[tuple]:
    """The launches of one `_gemm` call with `args`, pointer values named."""
    since = len(driver.calls)
    out = gemm._gemm(*args)
    a, b = args[:2]
    named = {a.data_ptr(): "a", b.data_ptr(): "b", out.data_ptr(): "c"}
    for name, t in zip(("bias", "scale_a", "scale_b"), args[2:5]):
        if t is not None:                   # (a scale's own address is launched: a 0-d one is read as it is)
            named[t.data_ptr()] = name
    return launched(driver, since, named)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(call=calls)
def test_a_replayed_plan_launches_what_the_general_path_launches(call):
    with stub_gpu() as driver:
        cases = variants(call)
        for args in cases * 2:              # record each key's plan (the second call of a key, once warm)
            run(driver, args)
        assert gemm._PLANS, "warm calls are planned"
        for args in cases:
            replayed = run(driver, args)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(gemm, "_PLANS", NoPlans())
                general = run(driver, args)
            assert replayed == general
            assert replayed, "a GPU call launches"


def test_warm_calls_replay_their_plan_without_checks_or_binding(monkeypatch):
    with stub_gpu() as driver:
        a, b = (torch.randn(64, 64).half() for _ in range(2))
        for _ in range(2):
            gemm._gemm(a, b, None, None, None, None, None, False, False, 1.0)
        assert len(gemm._PLANS) == 1
        entries = []
        monkeypatch.setattr(gemm, "_check", lambda *args: entries.append("check"))
        for kernel in KERNELS:
            monkeypatch.setattr(kernel.fast_launches, "entry", lambda *args, **kwargs: entries.append("entry"))
        before = Counter(driver.counts)
        gemm._gemm(a, b, None, None, None, None, None, False, False, 1.0)
        assert entries == [] and driver.counts - before == Counter(cuLaunchKernel=1)


@pytest.mark.parametrize("M", [64, 256], ids=["small-m", "tiled"])
def test_pinning_another_config_or_forgetting_launches_drops_the_plan(M):
    with stub_gpu() as driver:
        a, b = torch.randn(M, 64).half(), torch.randn(64, 128).half()
        args = (a, b, None, None, None, None, None, False, False, 1.0)
        for _ in range(2):
            gemm._gemm(*args)
        forget_launches()                     # as a test swapping the driver does: prepare everything again
        loads = driver.counts["cuModuleLoadData"]
        gemm._gemm(*args)
        assert driver.counts["cuModuleLoadData"] > loads, "the plan was dropped: the kernels were loaded again"
        assert driver.launches()[-1][1][2][2].decode().startswith("('gemm_")
        if M == 256:                          # the tiled kernel: its config decides the binary
            assert built_for(gemm.CONFIGS[0], driver.launches()[-1][1][2][2].decode())
            gemm.pin_config(gemm.CONFIGS[1])
            gemm._gemm(*args)
            assert built_for(gemm.CONFIGS[1], driver.launches()[-1][1][2][2].decode())


def built_for(config: tessera.Config, binary: str) -> bool:
    """Whether a fake binary was 'compiled' with `config`'s constexprs and warps."""
    return binary.endswith(f", {config.num_warps})") and all(
        f"('{name}', '{type(value).__name__}', {value!r})" in binary for name, value in config.kwargs.items())


def test_the_atomic_split_switch_is_read_on_every_call_of_a_split_plan(monkeypatch):
    with stub_gpu() as driver:
        a, b = torch.randn(16, 4096).half(), torch.randn(4096, 256).half()     # small M, K split
        args = (a, b, None, None, None, None, None, False, False, 1.0)
        plan = gemm._split_k_plan(16, 256, 4096, 2, 132, False)
        assert plan.split_k > 1
        for _ in range(2):
            gemm._gemm(*args)
        monkeypatch.setenv(gemm.ATOMIC_SPLIT_K_ENV, "1")
        since = len(driver.calls)
        gemm._gemm(*args)
        ran = [c[1][2][2].decode() for c in driver.calls[since:] if c[0] == "cuLaunchKernel"]
        assert "('ATOMIC', 'bool', True)" in ran[0] and "('SPLITS', 'int', 1)" in ran[1], ran
        gemm._gemm(*args)                               # the atomic plan, replayed
        monkeypatch.delenv(gemm.ATOMIC_SPLIT_K_ENV)
        since = len(driver.calls)
        gemm._gemm(*args)
        ran = [c[1][2][2].decode() for c in driver.calls[since:] if c[0] == "cuLaunchKernel"]
        assert "('ATOMIC', 'bool', False)" in ran[0] and f"('SPLITS', 'int', {plan.split_k})" in ran[1], ran


def test_a_stream_k_plan_replays_what_the_general_path_launches_on_its_stream_only(monkeypatch):
    """$TESSERA_GEMM_STREAM_K=1, 3072 x 3072 tiles on the stub's 132 SMs (a partial fifth wave): the plan replays
    the general path's one launch, fresh workspace included; on another stream it steps aside."""
    monkeypatch.setenv(gemm.STREAM_K_ENV, "1")
    gemm._stream_k_plan.cache_clear()
    with stub_gpu() as driver:
        a, b = torch.randn(3072, 64).half(), torch.randn(64, 3072).half()
        args = (a, b, None, None, None, "relu", None, False, False, 1.0)
        for _ in range(3):                  # compiled, then warm, then recorded
            run(driver, args)
        assert len(gemm._PLANS) == 1
        replayed = run(driver, args)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gemm, "_PLANS", NoPlans())
            general = run(driver, args)
        assert replayed == general and len(general) == 1 and general[0][0].startswith("('gemm_stream_k_kernel'")
        plan = next(iter(gemm._PLANS.values()))
        assert plan.stream == 0 and plan.workspace == ((2 * 132 * 128, 128), False)
        plan.stream = 1                                 # as if recorded on another stream: not replayed
        assert plan.run(a.data_ptr(), b.data_ptr(), 0, 1.0) is None
    gemm._stream_k_plan.cache_clear()


def test_an_amd_plan_replays_only_while_its_plan_target_holds(monkeypatch):
    """On AMD the plan target is read per call ($TESSERA_AMD_PLANS, `targets.plan_target`): a plan recorded for
    one target steps aside (launching nothing) once the target reads otherwise, and the general path decides.
    (`_gpu_of` is stubbed to answer as an AMD GPU would; NVIDIA plans carry no target to check.)"""
    target = {"now": "gfx942"}
    gpu_of = gemm._gpu_of
    with stub_gpu() as driver:
        a, b = torch.randn(64, 64).half(), torch.randn(64, 64).half()
        args = (a, b, None, None, None, None, None, False, False, 1.0)
        for _ in range(3):
            gemm._gemm(*args)
        assert next(iter(gemm._PLANS.values())).target is None
        gemm.clear_plans()
        monkeypatch.setattr(gemm, "_gpu_of", lambda device: (gpu_of(device)[0], target["now"]))
        for _ in range(2):
            gemm._gemm(*args)
        plan = next(iter(gemm._PLANS.values()))
        assert plan.target[0] == "gfx942"
        before = len(driver.calls)
        assert plan.run(a.data_ptr(), b.data_ptr(), 0, 1.0) is not None and len(driver.calls) == before + 1
        target["now"] = "gfx950"
        assert plan.run(a.data_ptr(), b.data_ptr(), 0, 1.0) is None and len(driver.calls) == before + 1


def fp8_scale_variants(M: int, N: int, K: int) -> list[tuple]:
    """`_gemm` arguments of fp8 GEMMs whose scales differ in what the launches' specialization sees: per tensor,
    per row / column, mixed, absent, a scale not 16-byte aligned (vector or 0-d), one 0-d scale on both sides, a
    0-d scale inside the bias, a vector that is the bias or the other scale."""
    g = torch.Generator().manual_seed(M + N + K)
    a = torch.randn((M, K), generator=g).to(torch.float8_e4m3fn)
    b = torch.randn((K, N), generator=g).to(torch.float8_e5m2)
    rows, columns = torch.rand(M, generator=g), torch.rand(N, generator=g)
    shifted = torch.rand(N + 1, generator=g)[1:]                        # 4 bytes past a 16-byte boundary
    bias = torch.randn(N, generator=g)
    one = torch.tensor(0.5)
    cases = [(None, one, torch.tensor(2.0)), (None, rows, columns), (None, None, columns),
             (None, one, None), (None, rows, shifted), (bias, rows, columns),
             (None, rows, torch.tensor(2.0)), (None, one, columns),          # mixed
             (None, one, one), (None, one, shifted[2]), (bias, bias[1], rows if M == N else columns)]
    if M == N:
        cases += [(bias, rows, bias), (None, rows, rows)]                 # scale_b is the bias; one vector twice
    return [(a, b, bias_, scale_a, scale_b, "relu", None, False, False, 1.5) for bias_, scale_a, scale_b in cases]


def launched_name(args: tuple, scale: torch.Tensor) -> str:
    """The name `run` gives `scale`'s address (the last of bias, scale_a, scale_b at that address)."""
    return [name for name, t in zip(("bias", "scale_a", "scale_b"), args[2:5])
            if t is not None and t.data_ptr() == scale.data_ptr()][-1]


@pytest.mark.parametrize("M,N,K", [(64, 64, 64), (128, 128, 128), (16, 96, 1024)],
                         ids=["small-m", "tiled", "small-m-split"])
def test_fp8_calls_with_scales_replay_what_the_general_path_launches(M, N, K):
    """fp8 scales are planned: each variant's replay (no checks run: `_check` fails if called) launches what the
    general path does, and both pass every scale's own address: a 0-d scale is read as one scalar, not expanded
    (no fresh vector), a dense vector as it is."""
    with stub_gpu() as driver:
        for args in fp8_scale_variants(M, N, K):
            for _ in range(3):              # compiled, warm, recorded
                run(driver, args)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(gemm, "_check", lambda *_: pytest.fail(f"not replayed: scales {args[3:5]}"))
                replayed = run(driver, args)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(gemm, "_PLANS", NoPlans())
                general = run(driver, args)
            assert replayed == general and replayed, args[2:5]
            values = {v for launch in replayed for v in launch[5]}
            assert {launched_name(args, t) for t in args[3:5] if t is not None} <= values, args[2:5]


def test_a_plan_for_a_vector_scale_is_never_keyed_as_a_per_tensor_one():
    """M = N = 1: a (1,) scale and a 0-d one hold the same float at the same kind of address, but the kernels
    read them differently (SCALE_A "vector" / "tensor"), so the plan keys differ, either side."""
    a, b = torch.randn(1, 32).to(torch.float8_e4m3fn), torch.randn(32, 1).to(torch.float8_e4m3fn)
    vector, scalar = torch.tensor([0.5]), torch.tensor(0.5)

    def key(scale_a, scale_b):
        return gemm_plan.plan_key(a, b, None, None, None, False, False, scale_a, scale_b)[0]
    assert key(vector, None) != key(scalar, None) and key(None, vector) != key(None, scalar)
    assert key(vector, scalar) != key(scalar, vector)
    assert (gemm_plan.scale_mode(None), gemm_plan.scale_mode(scalar), gemm_plan.scale_mode(vector)) == \
        ("none", "tensor", "vector")


def test_a_warm_per_tensor_fp8_call_is_one_launch_and_allocates_only_c():
    """The warm fp8 call with per-tensor scales: one cuLaunchKernel, passing the 0-d scales' own addresses, and
    one torch op (C's allocation; a per-tensor scale was expanded with two more: expand + copy)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with stub_gpu() as driver:
        a, b = (torch.randn(64, 64).to(torch.float8_e4m3fn) for _ in range(2))
        scale_a, scale_b = torch.tensor(0.5), torch.tensor(2.0)
        args = (a, b, None, scale_a, scale_b, None, None, False, False, 1.0)
        for _ in range(3):
            gemm._gemm(*args)
        before, since = Counter(driver.counts), len(driver.calls)
        with Ops() as ops:
            c = gemm._gemm(*args)
        assert driver.counts - before == Counter(cuLaunchKernel=1)
        assert ops.seen == ["aten.empty.memory_format"], ops.seen
        named = {a.data_ptr(): "a", b.data_ptr(): "b", c.data_ptr(): "c", scale_a.data_ptr(): "scale_a",
                 scale_b.data_ptr(): "scale_b"}
        assert {"scale_a", "scale_b"} <= set(launched(driver, since, named)[0][5])


def test_fp8_scales_on_the_interpreter():
    """(The CPU interpreter, beside the plans: a per-tensor scale on each side multiplies the product.)"""
    a, b = (torch.randn(16, 16).to(torch.float8_e4m3fn) for _ in range(2))
    scale = torch.tensor(0.5)
    out = gemm._gemm(a, b, None, scale, scale, None, None, False, False, 1.0)
    expected = (a.float() @ b.float()) * 0.25
    assert torch.allclose(out.float(), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("case", ["not-dense", "empty-k", "fusion"])
def test_calls_a_plan_cannot_replay_take_the_general_path(case):
    with stub_gpu():
        a, b = torch.randn(64, 64).half(), torch.randn(64, 64).half()
        if case == "not-dense":
            a = torch.randn(64, 128).half()[:, ::2]
        if case == "empty-k":
            a, b = torch.randn(64, 0).half(), torch.randn(0, 64).half()
        for _ in range(3):
            if case == "fusion":
                with tessera.fusion():
                    gemm._gemm(a, b, None, None, None, None, None, False, False, 1.0)
            else:
                gemm._gemm(a, b, None, None, None, None, None, False, False, 1.0)
        assert len(gemm._PLANS) == 0


# The tessera functions a warm op call runs, in order (`tessera_frames`): the op, the plan's key and replay, the
# prepared launch and its packing. A new layer here costs every call ~0.1-0.3 µs: add it on purpose.
WARM_FRAMES = ["_gemm", "launching_directly", "plan_key", "run", "launch", "pack"]


def tessera_frames(fn) -> list[str]:
    """The names of the Python functions of the tessera package that `fn()` calls, in order (sys.setprofile), the
    driver's calls (`cu*`, the stub's Python) and what they call left out."""
    import os
    import sys
    root = os.path.dirname(tessera.__file__) + os.sep
    names, in_driver = [], []

    def profile(frame, event, arg):
        if event == "call" and not in_driver:
            if frame.f_code.co_name.startswith("cu"):
                in_driver.append(frame)
            elif frame.f_code.co_filename.startswith(root):
                names.append(frame.f_code.co_name)
        elif event == "return" and in_driver and in_driver[-1] is frame:
            in_driver.pop()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return names


def test_a_warm_op_call_on_hopper_is_one_driver_call_and_a_new_output_one_encode(monkeypatch):
    """The real sm_90a binaries (TMA maps for A, B and C): the op's replay writes C's map only when C moves, and
    runs WARM_FRAMES; with $TESSERA_TMA_ADDRESS_PATCH=1 a moved C's map is patched, not encoded, once learned."""
    with stub_gpu(hopper=True, fake=False) as driver:
        a, b = (torch.randn(64, 64).half() for _ in range(2))
        args = (a, b, None, None, None, None, None, False, False, 1.0)
        kept = [gemm._gemm(*args) for _ in range(3)]
        assert len(gemm._PLANS) == 1
        before = Counter(driver.counts)
        kept.append(gemm._gemm(*args))                 # C at a new address: its map is encoded
        assert driver.counts - before == Counter(cuTensorMapEncodeTiled=1, cuLaunchKernel=1)
        del kept
        # C where the last one was (freed, so the allocator usually hands its bytes back): its map is kept, and
        # a moved C costs at most one encode. Whether C moved is read from its address, not assumed (under xdist
        # the allocator sometimes hands out other bytes).
        last = gemm._gemm(*args).data_ptr()
        seen, previous = {last}, None
        for step in range(12):
            before = Counter(driver.counts)
            out = []
            names = tessera_frames(lambda: out.append(gemm._gemm(*args)))
            moved, cached = out[0].data_ptr() != last, out[0].data_ptr() in seen
            last = out[0].data_ptr()
            seen.add(last)
            if step >= 6:                   # then C kept until the next call returns, as in x = gemm(x, w)
                previous = out.pop()
            out.clear()
            calls = driver.counts - before
            assert calls["cuLaunchKernel"] == 1 and calls["cuTensorMapEncodeTiled"] <= moved
            assert set(calls) <= {"cuLaunchKernel", "cuTensorMapEncodeTiled"}
            # a C seen before: its map comes from the cache of encoded maps (no _blob, no encode)
            assert names == (WARM_FRAMES + ["write_maps"] if moved else WARM_FRAMES) if cached else \
                names[:len(WARM_FRAMES)] == WARM_FRAMES, names
        del previous

        monkeypatch.setenv("TESSERA_TMA_ADDRESS_PATCH", "1")
        forget_launches()                               # prepared again: C's map encoder learns its address field
        before = Counter(driver.counts)
        kept = [gemm._gemm(*args) for _ in range(64)]
        assert len({c.data_ptr() for c in kept}) == len(kept)
        assert driver.counts["cuTensorMapEncodeTiled"] - before["cuTensorMapEncodeTiled"] < 32
        maps = [(encoder, plan.blobs) for kernel in KERNELS for launcher in kernel.launchers.values()
                if launcher.tensor_maps is not None for plan in launcher.tensor_maps._plans
                for encoder in plan.by_shape.values()]
        patchers = [encoder.patcher for encoder, _ in maps]
        assert any(p.patched for p in patchers) and not any(p.broken for p in patchers)
        for encoder, blobs in maps:                     # every map the launches used is the driver's
            assert all(blob == encoder.patcher.encode(key[0]) for key, blob in blobs.items())


@pytest.mark.parametrize("M,N,K,launches", [(16, 256, 256, 1), (16, 256, 4096, 2), (256, 256, 64, 1),
                                             (256, 64, 1024, 2)],
                         ids=["small-m", "small-m-split", "tiled", "few-tiles-split"])
def test_a_warm_op_call_is_one_driver_call_per_kernel(M, N, K, launches):
    with stub_gpu() as driver:
        a, b = torch.randn(M, K).half(), torch.randn(K, N).half()
        args = (a, b, None, None, None, None, None, False, False, 1.0)
        for _ in range(3):                  # compiled, warm, recorded (run alone, the tiled and split cases
            gemm._gemm(*args)               # record their plan on the third call; after other tests, the second)
        assert len(gemm._PLANS) == 1
        before = Counter(driver.counts)
        gemm._gemm(*args)
        assert driver.counts - before == Counter(cuLaunchKernel=launches)
