"""The warm launch path: generated code selects the prepared launcher from the arguments alone.

It must never select another binary than full binding would: for random
launches on every path (positional runtime arguments, constexprs by keyword
or defaulted, a tuple or a callable grid, `stream=`, do_not_specialize, and
`@tessera.autotune` once tuned), the binary each launch runs is the one
compiled for the specialization `bind_arguments` picks for that call. The
driver is `StubDriver`, and "compiling" writes the specialization key into
the binary, so each launch says which specialization it ran.
"""

import contextlib
import types
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

import tessera
from tessera.dsl import gpu_launch
from tessera.dsl.fast_launch import FastLaunches
from tessera.runtime.stub_driver import stubbed_driver
from test_gpu_launch import FakeDeviceArray


@tessera.kernel(do_not_specialize=["m"])
def scaled_copy(x_ptr, out_ptr, n, m, scale, BLOCK: tessera.constexpr, EVEN: tessera.constexpr = False):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    tessera.store(out_ptr + offs, tessera.load(x_ptr + offs, mask=offs < n) * scale, mask=offs < n + m)


def choose_by_n(configs, named):
    """Tuning picks the config by n's parity, so the key's values must choose among prepared launches."""
    return [configs[named["n"] % 2]]


tuned_copy = tessera.autotune(configs=[tessera.Config({"BLOCK": 16}), tessera.Config({"BLOCK": 32}, num_warps=8)],
                              key=["n"], prune=choose_by_n, metadata=lambda config, named: {},
                              timer=lambda run, config: run() or 1.0)(
    tessera.kernel(scaled_copy.fn, do_not_specialize=["m"]))


def fake_binary(kernel, bound, target, num_warps):
    """A 'binary' naming the specialization it was compiled for."""
    return types.SimpleNamespace(name=kernel.name, target=target, ptx=None, metadata={"num_threads": 128},
                                 binary=repr((bound.key, num_warps)).encode())


@contextlib.contextmanager
def stub_gpu():
    """A fresh stub driver, 'compiling' with `fake_binary`; the kernels forget launchers prepared on another."""
    for kernel in (scaled_copy, tuned_copy.kernel):
        kernel.launchers.clear()
        kernel.fast_launches = FastLaunches(kernel.launch_signature(), kernel._launch_slowly)
    tuned_copy.fast_launches = FastLaunches(tuned_copy.fast_launches.signature, tuned_copy._launch_slowly)
    with pytest.MonkeyPatch.context() as mp, stubbed_driver() as stub:
        mp.setattr(gpu_launch, "binary_for", fake_binary)
        yield stub


@pytest.fixture
def driver():
    with stub_gpu() as stub:
        yield stub


def ran(driver) -> str:
    """The specialization the last launch ran (the stub's function handle holds its module's image)."""
    return driver.launches()[-1][1][2][2].decode()


BASE = 0x7F0000000000
arrays = st.builds(lambda offset, typestr, n: FakeDeviceArray(n, typestr=typestr, address=BASE + offset),
                   st.sampled_from([0, 4, 16, 32, 4096, 4100]), st.sampled_from(["<f4", "<f2"]),
                   st.sampled_from([0, 16, 64, 1024]))
ints = st.one_of(st.sampled_from([0, 1, 16, 17, 32, 2**31 - 1, 2**31, -(2**31) - 1, 2**64 - 1]),
                 st.integers(-100, 100))
launches = st.fixed_dictionaries({
    "args": st.tuples(arrays, arrays, ints, st.sampled_from([1, 16, 17]), st.one_of(st.floats(-2, 2), st.just(1)))
    .flatmap(lambda args: st.sampled_from([args, (args[0], args[0], *args[2:])])),      # or x passed as out too
    "block": st.sampled_from([16, 32, 16.0, True]),
    "even": st.sampled_from([None, False, True, 0]),
    "grid": st.sampled_from(["tuple", "int", "callable"]),
    "stream": st.sampled_from([None, 7]),
})


def grid_of(launch):
    return {"tuple": (2,), "int": 3, "callable": lambda meta: (min(max(meta["n"], 1), 4096) // 16 + 1,)}[launch["grid"]]


def keywords(launch, tuned=False):
    kwargs = {} if tuned else {"BLOCK": launch["block"]}
    if launch["even"] is not None:
        kwargs["EVEN"] = launch["even"]
    if launch["stream"] is not None:
        kwargs["stream"] = launch["stream"]
    return kwargs


def expected(kernel, args, kwargs, num_warps=4):
    bound = kernel._bind(args, {k: v for k, v in kwargs.items() if k != "stream"})
    return repr((bound.key, num_warps))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(first=launches, second=launches)
def test_every_warm_launch_runs_the_binary_full_binding_picks(first, second):
    with stub_gpu() as stub:
        for launch in [first, second] * 3:      # the first rounds warm the path, later ones take it
            kwargs = keywords(launch)
            scaled_copy[grid_of(launch)](*launch["args"], **kwargs)
            assert ran(stub) == expected(scaled_copy, launch["args"], kwargs)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(first=launches, second=launches)
def test_every_warm_autotuned_launch_runs_the_binary_of_its_tuned_config(first, second):
    with stub_gpu() as stub:
        for launch in [first, second] * 3:
            kwargs = keywords(launch, tuned=True)
            tuned_copy[grid_of(launch)](*launch["args"], **kwargs)
            config = tuned_copy.best_config(*launch["args"], **kwargs)
            assert ran(stub) == expected(tuned_copy.kernel, launch["args"], {**kwargs, **config.kwargs},
                                         config.num_warps)


def last_values(driver, kernel) -> list:
    """The argument values the last launch's parameter buffer held (its launcher's packer, decoded)."""
    params = driver.launches()[-1][6]
    return next(launcher.packer for launcher in kernel.launchers.values()
                if launcher.packer.kernel_params == params).decode()


@settings(max_examples=80, deadline=None, derandomize=True)
@given(first=launches, second=launches)
def test_resolve_takes_apart_exactly_the_launch_the_warm_entry_makes(first, second):
    """`FastLaunches.resolve` (what `tessera::gemm`'s plans record) gives the warm entry's own launch: the same
    binary, grid and argument values; None wherever the entry would not launch warm."""
    with stub_gpu() as stub:
        fast = scaled_copy.fast_launches
        slow = []
        real_slow = fast.slow
        fast.slow = lambda *a: slow.append(1) or real_slow(*a)
        for launch in [first, second] * 2:
            scaled_copy[grid_of(launch)](*launch["args"], **keywords(launch))
        for launch in (first, second):
            kwargs, grid = keywords(launch), grid_of(launch)
            found = fast.resolve(grid, *launch["args"], **kwargs)
            slow.clear()
            scaled_copy[grid](*launch["args"], **kwargs)
            if found is None:
                assert slow or launch["stream"] is not None, "resolve refused a launch the entry took warm"
                continue
            assert not slow
            entry_launch, entry_values = stub.launches()[-1], last_values(stub, scaled_copy)
            found.launch(*found.dims, found.values, 0 if found.stream_of is None else found.stream_of(found.ordinal))
            assert stub.launches()[-1][1:5] == entry_launch[1:5]          # binary, grid, block, shared memory
            assert last_values(stub, scaled_copy) == entry_values
            assert ran(stub) == expected(scaled_copy, launch["args"], kwargs)


def warm_calls(driver, launch):
    """Driver calls of a launch after two like it (the first binds and prepares, the second records the key)."""
    launch()
    launch()
    before = Counter(driver.counts)
    launch()
    return driver.counts - before


X, OUT = FakeDeviceArray(64), FakeDeviceArray(64, address=BASE + 4096)


@pytest.mark.parametrize("how", [
    lambda: scaled_copy[(1,)](X, OUT, 64, 1, 2.0, BLOCK=64),
    lambda: scaled_copy[lambda meta: (meta["n"] // meta["BLOCK"],)](X, OUT, 64, 1, 2.0, BLOCK=64, EVEN=True),
    lambda: scaled_copy(X, OUT, 64, 1, 2.0, BLOCK=64, grid=(1,), stream=5, num_warps=8),
    lambda: tuned_copy[(2,)](X, OUT, 64, 1, 2.0),
], ids=["tuple-grid", "callable-grid-defaults", "stream-and-warps", "autotuned"])
def test_a_warm_launch_is_one_driver_call_and_no_binding(driver, monkeypatch, how):
    bound = []
    real_bind = tessera.Kernel._bind
    monkeypatch.setattr(tessera.Kernel, "_bind", lambda self, a, k: bound.append(1) or real_bind(self, a, k))
    assert warm_calls(driver, how) == Counter(cuLaunchKernel=1)
    bound.clear()
    how()
    assert bound == [], "a warm launch neither binds nor classifies its arguments"


def test_reinterpreted_device_arrays_take_the_warm_path_to_their_own_specialization(driver, monkeypatch):
    """tessera.reinterpret(gpu_tensor, u4): the launch keys on the dtype it gives, not the tensor's."""
    packed = tessera.reinterpret(FakeDeviceArray(32, typestr="|u1"), tessera.u4)
    as_u8 = FakeDeviceArray(32, typestr="|u1", address=BASE + 4096)
    out = tessera.reinterpret(FakeDeviceArray(32, typestr="|u1", address=BASE + 8192), tessera.u4)
    for x, y in ((packed, out), (as_u8, FakeDeviceArray(32, typestr="|u1", address=BASE + 8192)), (packed, out)):
        assert warm_calls(driver, lambda: scaled_copy[(1,)](x, y, 64, 1, 1, BLOCK=64)) == Counter(cuLaunchKernel=1)
        assert ran(driver) == expected(scaled_copy, (x, y, 64, 1, 1), {"BLOCK": 64})
    assert "ptr<u4>" in ran(driver)


def test_unusual_calls_take_the_slow_path_and_still_launch_right(driver):
    for kwargs in ({"scale": 1.0, "BLOCK": 64},):                    # a runtime argument by keyword
        scaled_copy[(1,)](X, OUT, 64, 1, **kwargs)
        assert ran(driver) == expected(scaled_copy, (X, OUT, 64, 1), kwargs)
    with pytest.raises(tessera.KernelArgumentError, match="constexpr parameter 'BLOCK' got list"):
        scaled_copy[(1,)](X, OUT, 64, 1, 1.0, BLOCK=[64])
    with pytest.raises(tessera.KernelArgumentError, match="missing a required argument: 'scale'"):
        scaled_copy[(1,)](X, OUT, 64, 1, BLOCK=64)


def test_a_kernel_launched_with_other_argument_kinds_gets_another_entry(driver):
    for scale in (2.0, 2, 2.0, 2):                          # float, then int, then both warm
        for _ in range(2):
            scaled_copy[(1,)](X, OUT, 64, 1, scale, BLOCK=64)
            assert ran(driver) == expected(scaled_copy, (X, OUT, 64, 1, scale), {"BLOCK": 64})


def test_launch_errors_on_the_warm_path_name_the_kernel(driver):
    for _ in range(2):
        scaled_copy[(1,)](X, OUT, 64, 1, 2.0, BLOCK=64)
    driver.launch_result = driver.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    with pytest.raises(tessera.LaunchError, match="kernel 'scaled_copy': launching kernel 'scaled_copy'"):
        scaled_copy[(1,)](X, OUT, 64, 1, 2.0, BLOCK=64)


def test_grids_too_large_for_the_device_are_refused_on_the_warm_path(driver):
    for _ in range(2):
        scaled_copy[(1,)](X, OUT, 64, 1, 2.0, BLOCK=64)
    with pytest.raises(tessera.LaunchError, match="grid dimension 1 is 70000"):
        scaled_copy[(1, 70000)](X, OUT, 64, 1, 2.0, BLOCK=64)


def test_pinning_an_autotuned_kernel_changes_what_warm_launches_run(driver):
    for _ in range(3):
        tuned_copy[(1,)](X, OUT, 64, 1, 2.0)
    tuned_copy.pin(tessera.Config({"BLOCK": 32}, num_warps=8))
    try:
        tuned_copy[(1,)](X, OUT, 64, 1, 2.0)
        assert ran(driver) == expected(tuned_copy.kernel, (X, OUT, 64, 1, 2.0), {"BLOCK": 32}, 8)
    finally:
        tuned_copy.pin(None)


# -- torch tensors: the key the generated code computes (CPU tensors never launch warm, so it is read directly) --

def torch_entry_keys(launches_):
    """The warm-path key of each launch (args, kwargs), from an entry generated for torch tensors."""
    from tessera.dsl.fast_launch import argument_kinds
    from tessera.dsl.launch_codegen import generate_entry

    fast = FastLaunches(scaled_copy.launch_signature(), slow=lambda *a: None)
    keys = []
    fast.miss_key = lambda key, *rest: keys.append(key)      # no launch is prepared: every launch reports its key
    (x, out, *_), _ = launches_[0]
    kinds = argument_kinds(fast.signature, {"x_ptr": x, "out_ptr": out, "n": 1, "m": 1, "scale": 1.0})
    assert [kind for kind, _ in kinds] == ["torch", "torch", "int", "int", "float"]
    entry = generate_entry(fast, kinds)
    for args, kwargs in launches_:
        entry((1,), *args, **kwargs)
    assert len(keys) == len(launches_)
    return keys


def test_torch_launches_sharing_a_key_share_their_specialization():
    import itertools

    torch = pytest.importorskip("torch")
    f32, f16 = torch.zeros(4096), torch.zeros(4096, dtype=torch.float16)
    views = [buffer[start:start + n] for buffer in (f32, f16) for start in (0, 1, 4, 8) for n in (16, 256)]
    launches_ = [((x, out, n, m, 0.5), {"BLOCK": block})
                 for x, out, n, m, block in itertools.product(views[::3], views[1::3], [1, 16, 17, 2**31],
                                                              [1, 16], [16, True])]
    groups: dict = {}
    for key, launch in zip(torch_entry_keys(launches_), launches_):
        groups.setdefault(key, set()).add(scaled_copy._bind(*launch).key)
    assert len(groups) < len(launches_) / 2, "the grid must contain launches that share a key"
    assert all(len(specializations) == 1 for specializations in groups.values())


def test_warm_launches_pass_the_stream_and_grid_they_are_given(driver):
    for _ in range(2):
        scaled_copy[(1,)](X, OUT, 64, 1, 2.0, BLOCK=64)
    for stream, handle in ((None, 0), (7, 7), (types.SimpleNamespace(cuda_stream=9), 9)):
        scaled_copy[(3, 2)](X, OUT, 64, 1, 2.0, BLOCK=64, stream=stream)
        assert driver.launches()[-1][2] == (3, 2, 1) and driver.launches()[-1][5] == handle
    scaled_copy[(0,)](X, OUT, 64, 1, 2.0, BLOCK=64)          # an empty grid launches nothing
    assert driver.launches()[-1][2] == (3, 2, 1)
