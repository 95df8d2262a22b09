"""Autotuning on the CPU interpreter, with a fake clock so the winner is known in advance."""

import io
import json

import numpy as np
import pytest

import tessera
from tessera.runtime.autotune import AutotuneError, Autotuner


@tessera.kernel
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    mask = offs < n
    tessera.store(out_ptr + offs, tessera.load(x_ptr + offs, mask=mask) + tessera.load(y_ptr + offs, mask=mask),
                  mask=mask)


@tessera.kernel
def accumulate(x_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    mask = offs < n
    total = tessera.load(out_ptr + offs, mask=mask) + tessera.load(x_ptr + offs, mask=mask)
    tessera.store(out_ptr + offs, total, mask=mask)


CONFIGS = [tessera.Config({"BLOCK": 32}, num_warps=1), tessera.Config({"BLOCK": 64}, num_warps=2),
           tessera.Config({"BLOCK": 128}, num_warps=4)]
SECONDS = {32: 3.0, 64: 1.0, 128: 2.0}     # BLOCK=64 wins
GRID = lambda meta: (tessera.cdiv(meta["n"], meta["BLOCK"]),)  # noqa: E731


class FakeTimer:
    """Runs each trial once (so the kernel really executes) and reports SECONDS for its BLOCK."""

    def __init__(self, seconds=SECONDS):
        self.seconds, self.calls = seconds, []

    def __call__(self, run, config):
        run()
        self.calls.append(config.kwargs["BLOCK"])
        return self.seconds[config.kwargs["BLOCK"]]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TESSERA_AUTOTUNE_PIN", raising=False)
    monkeypatch.delenv("TESSERA_AUTOTUNE_QUIET", raising=False)
    return tmp_path


def tuned(kernel=add, configs=CONFIGS, key=("n",), **options):
    timer = options.pop("timer", FakeTimer())
    return tessera.autotune(configs, key=list(key), timer=timer, **options)(kernel), timer


def vectors(n, dtype=np.float32):
    x = np.arange(n, dtype=dtype)
    return x, 2 * x + 1, np.zeros_like(x)


def test_picks_the_fastest_config_and_the_result_is_correct():
    fast_add, timer = tuned()
    x, y, out = vectors(200)
    fast_add[GRID](x, y, out, 200)
    assert sorted(timer.calls) == [32, 64, 128]
    assert fast_add.best_config(x, y, out, 200) == tessera.Config({"BLOCK": 64}, num_warps=2)
    np.testing.assert_array_equal(out, x + y)


def test_best_config_is_none_before_tuning_and_tunes_when_given_a_grid():
    fast_add, timer = tuned()
    x, y, out = vectors(50)
    assert fast_add.best_config(x, y, out, 50) is None
    assert fast_add.best_config(x, y, out, 50, grid=GRID).kwargs == {"BLOCK": 64}
    assert len(timer.calls) == 3


def test_results_are_stored_on_disk_and_reused_without_measuring(private_cache):
    first, _ = tuned()
    x, y, out = vectors(100)
    first[GRID](x, y, out, 100)
    files = list((private_cache / "autotune").glob("add-*.json"))
    assert len(files) == 1
    stored = json.loads(files[0].read_text())
    assert list(stored["results"]) == ["cpu-interpreter"]

    second, timer = tuned()     # a fresh autotuner, as in a new process
    out[:] = 0
    second[GRID](x, y, out, 100)
    assert timer.calls == []
    assert second.best_config(x, y, out, 100).kwargs == {"BLOCK": 64}
    np.testing.assert_array_equal(out, x + y)


def test_a_new_key_value_or_dtype_retunes_and_a_known_one_does_not():
    fast_add, timer = tuned()
    fast_add[GRID](*vectors(100), 100)
    fast_add[GRID](*vectors(100), 100)
    assert len(timer.calls) == 3
    fast_add[GRID](*vectors(150), 150)
    assert len(timer.calls) == 6
    fast_add[GRID](*vectors(150, np.float64), 150)
    assert len(timer.calls) == 9
    assert fast_add.tuner.benchmarks == 3


def test_configs_needing_too_much_shared_memory_are_pruned():
    shared = lambda config, args: {"shared_bytes": config.kwargs["BLOCK"] * 1024}  # noqa: E731
    fast_add, timer = tuned(metadata=shared, target="sm_89")     # 99 KiB: BLOCK=128 does not fit
    x, y, out = vectors(100)
    fast_add[GRID](x, y, out, 100, )
    assert sorted(timer.calls) == [32, 64]
    fast, _ = tuned(metadata=shared, target="sm_89", timer=FakeTimer({32: 3.0, 64: 2.0, 128: 1.0}))
    fast[GRID](*vectors(64), 64)
    assert fast.best_config(*vectors(64), 64).kwargs == {"BLOCK": 64}    # the fastest did not fit


def test_registers_and_spills_prune_when_known():
    metadata = {32: {"registers": 300}, 64: {"registers": 40, "spill_stores": 16}, 128: {"registers": 40}}
    fast_add, timer = tuned(metadata=lambda config, args: metadata[config.kwargs["BLOCK"]], target="sm_80")
    fast_add[GRID](*vectors(100), 100)
    assert timer.calls == [128]


def test_when_every_config_is_pruned_the_error_says_why_for_each():
    fast_add, timer = tuned(metadata=lambda config, args: {"shared_bytes": 10**6}, target="sm_80",
                            prune=lambda configs, args: configs)
    with pytest.raises(AutotuneError) as info:
        fast_add[GRID](*vectors(100), 100)
    message = str(info.value)
    assert "kernel 'add'" in message and "every config was pruned" in message
    for block in (32, 64, 128):
        assert f"BLOCK={block}" in message
    assert message.count("needs 1000000 bytes of shared memory, sm_80 has") == 3
    assert timer.calls == []


def test_a_user_prune_function_runs_and_is_named_in_the_error():
    fast_add, timer = tuned(prune=lambda configs, args: [c for c in configs if c.kwargs["BLOCK"] <= args["n"]])
    fast_add[GRID](*vectors(40), 40)
    assert sorted(timer.calls) == [32]
    nothing, _ = tuned(prune=lambda configs, args: [])
    with pytest.raises(AutotuneError, match="removed by the prune function"):
        nothing[GRID](*vectors(41), 41)     # n=40 is on disk already


def test_pin_with_the_environment(monkeypatch):
    monkeypatch.setenv("TESSERA_AUTOTUNE_PIN", '{"BLOCK": 128, "num_warps": 4}')
    fast_add, timer = tuned()
    x, y, out = vectors(300)
    fast_add[GRID](x, y, out, 300)
    assert timer.calls == []
    assert fast_add.best_config(x, y, out, 300) == tessera.Config({"BLOCK": 128}, num_warps=4)
    np.testing.assert_array_equal(out, x + y)
    monkeypatch.setenv("TESSERA_AUTOTUNE_PIN", '{"other_kernel": {"BLOCK": 16}}')   # per kernel name
    assert fast_add.best_config(x, y, out, 300) is None
    monkeypatch.setenv("TESSERA_AUTOTUNE_PIN", "{BLOCK: 128")
    with pytest.raises(AutotuneError, match="TESSERA_AUTOTUNE_PIN is not JSON"):
        fast_add[GRID](x, y, out, 300)


def test_pin_with_the_method():
    fast_add, timer = tuned()
    fast_add.pin(tessera.Config({"BLOCK": 32}, num_warps=1))
    x, y, out = vectors(100)
    fast_add[GRID](x, y, out, 100)
    assert timer.calls == []
    np.testing.assert_array_equal(out, x + y)
    fast_add.pin(None)
    fast_add[GRID](x, y, out, 100)
    assert len(timer.calls) == 3


def test_restore_value_and_reset_to_zero_keep_tuning_from_corrupting_outputs():
    x = np.ones(100, dtype=np.float32)
    out = np.full(100, 5.0, dtype=np.float32)
    in_place, timer = tuned(accumulate, restore_value=["out_ptr"])
    in_place[GRID](x, out, 100)     # three trials ran on `out`; it is restored, then the winner runs once
    assert len(timer.calls) == 3
    np.testing.assert_array_equal(out, 6.0)

    out = np.full(100, 5.0, dtype=np.float32)
    zeroed, _ = tuned(accumulate, key=("n",), reset_to_zero=["out_ptr"], timer=FakeTimer())
    zeroed[GRID](x, out, 99)
    np.testing.assert_array_equal(out[:99], 1.0)     # zeroed before each trial and before the real launch


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_goes_to_stderr_on_a_terminal_and_the_env_var_silences_it(monkeypatch, capsys):
    terminal = FakeTerminal()
    monkeypatch.setattr("sys.stderr", terminal)
    fast_add, _ = tuned()
    fast_add[GRID](*vectors(100), 100)
    assert "\rtuning add: 1/3 configs" in terminal.getvalue()
    assert terminal.getvalue().endswith("\rtuning add: 3/3 configs\n")
    assert capsys.readouterr().out == ""

    quiet = FakeTerminal()
    monkeypatch.setattr("sys.stderr", quiet)
    monkeypatch.setenv("TESSERA_AUTOTUNE_QUIET", "1")
    fast_add[GRID](*vectors(120), 120)
    assert quiet.getvalue() == ""


def test_no_progress_when_stderr_is_not_a_terminal(capsys):
    fast_add, _ = tuned()
    fast_add[GRID](*vectors(100), 100)
    assert capsys.readouterr().err == ""


def test_a_corrupt_results_file_is_ignored_and_rewritten(private_cache):
    fast_add, _ = tuned()
    path = fast_add.tuner.store.path
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 1, "results": {"cpu-interp')
    x, y, out = vectors(100)
    fast_add[GRID](x, y, out, 100)
    np.testing.assert_array_equal(out, x + y)
    stored = json.loads(path.read_text())
    assert stored["kernel"] == "add"
    assert len(stored["results"]["cpu-interpreter"]) == 1
    assert not list(path.parent.glob(".*.tmp"))


def test_a_stored_config_no_longer_offered_is_retuned():
    first, _ = tuned()
    first[GRID](*vectors(100), 100)     # stores BLOCK=64
    second, timer = tuned(configs=[CONFIGS[0], CONFIGS[2]])
    second[GRID](*vectors(100), 100)
    assert sorted(timer.calls) == [32, 128]


def test_launches_may_not_pass_the_tuned_parameters():
    fast_add, _ = tuned()
    with pytest.raises(tessera.KernelArgumentError, match="chosen by autotune"):
        fast_add[GRID](*vectors(10), 10, BLOCK=32)
    with pytest.raises(tessera.KernelArgumentError, match="unknown parameters"):
        tuned(key=("m",))
    with pytest.raises(tessera.KernelArgumentError, match="not constexpr"):
        tuned(configs=[tessera.Config({"n": 3})])


def test_the_runtime_tuner_works_without_a_kernel():
    tuner = Autotuner("f", "0" * 64, CONFIGS, key=["n"], timer=FakeTimer())
    launched = []
    best = tuner.choose({"n": 5}, "cpu-interpreter", launched.append)
    assert best.kwargs == {"BLOCK": 64} and len(launched) == 3


def test_predicted_config_is_pinned_then_tuned_then_the_models_choice_among_the_pruned_never_timed():
    smallest_fitting = lambda configs, named: min(configs, key=lambda c: abs(c.kwargs["BLOCK"] - named["n"]))  # noqa
    fast_add, timer = tuned(prune=lambda configs, named: configs[1:], model=smallest_fitting)
    x, y, out = vectors(40)
    assert fast_add.predicted_config(x, y, out, 40) == (CONFIGS[1], "model")     # 32 was pruned
    assert fast_add.predicted_config(x, y, out, 120) == (CONFIGS[2], "model")
    assert timer.calls == [] and not out.any()          # nothing ran
    fast_add[GRID](x, y, out, 40)
    assert fast_add.predicted_config(x, y, out, 40) == (CONFIGS[1], "tuned")
    fast_add.pin(CONFIGS[2])
    assert fast_add.predicted_config(x, y, out, 40) == (CONFIGS[2], "pinned")
    without_model, _ = tuned()
    assert without_model.predicted_config(x, y, out, 41) == (CONFIGS[0], "model")     # 40 is tuned (on disk)


def test_inside_a_capture_an_autotuned_launch_runs_its_predicted_config_fused():
    fast_add, timer = tuned(model=lambda configs, named: configs[2])
    x, y, t = vectors(300)
    out = np.zeros_like(x)
    with tessera.fusion() as f:
        fast_add[GRID](x, y, t, 300)
        fast_add[GRID](t, y, out, 300)
        f.intermediate(t)
    assert timer.calls == [] and f.ran == ["add+add"]
    assert "add: autotuned; launched with the model config (BLOCK=128, num_warps=4)" in f.report()
    np.testing.assert_array_equal(out, x + 2 * y)
