"""Autotuning: pick the fastest of a kernel's configs for each problem, once, and remember it.

    tuner = Autotuner("add", source_hash, configs, key=["n"])
    config = tuner.choose(named_args, device="NVIDIA H200", launch=run_with_config)

`tessera/dsl/autotune.py` ties this to `@tessera.kernel`; this module knows
kernels only through the callables it is handed (the runtime does not import
the DSL), so it can be tested, and reused, without one.

A choice is looked up in memory, then on disk, and only then measured:

* The tuning key is the values of the `key` arguments (an array in `key`
  counts by its shape) plus the dtype of every array argument.
* On disk there is one JSON file per kernel,
  `<cache dir>/autotune/<kernel>-<source hash>.json`, mapping a device name
  (the GPU's, or "cpu-interpreter") and a tuning key to the winning config
  and the timings seen. It is rewritten atomically (temp file + rename); a
  file that cannot be read is ignored and replaced. Two processes tuning the
  same kernel at once may each write: the last rename wins, and the loser's
  result is measured again next time (never a torn file). A stored config
  that is no longer among the kernel's configs is ignored.
* Before measuring, configs that cannot run well are pruned: a compiled
  kernel using more registers per thread than the target allows, spilling
  registers, or needing more shared memory than the target has. Register
  counts come from `ptxas -v`; without ptxas only shared memory can be
  checked. A user `prune(configs, named_args)` runs after that. When nothing
  survives, `AutotuneError` names every config and why it went.
* Measuring launches every surviving config on the caller's own buffers
  (`reset_to_zero` names outputs to zero before each trial, `restore_value`
  names in-place buffers to save before tuning and put back after); the
  caller then launches the winner for the real result. The timer is
  injectable: `timer(run, config) -> seconds`.
* `TESSERA_AUTOTUNE_PIN='{"BLOCK": 128, "num_warps": 4}'` (every autotuned
  kernel) or `'{"add": {"BLOCK": 128}}'` (per kernel name) skips tuning.
* Where nothing may be timed (`tessera.fusion()` records a launch whose
  inputs earlier recorded launches have yet to compute), `predict` returns
  the pinned or tuned config, else the kernel's `model(configs, named_args)`
  choice among the pruned configs.
* While tuning, `tuning add: 3/8 configs` is redrawn in place on stderr when
  stderr is a terminal and `TESSERA_AUTOTUNE_QUIET` is not `1`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .cache import default_cache_directory
from .errors import LaunchError

CPU_DEVICE = "cpu-interpreter"
FORMAT_VERSION = 1
PIN_ENV = "TESSERA_AUTOTUNE_PIN"
QUIET_ENV = "TESSERA_AUTOTUNE_QUIET"

Timer = Callable[[Callable[[], None], "Config"], float]
MetadataFn = Callable[["Config"], dict]


class AutotuneError(LaunchError):
    """No config can run (all pruned or all failed), or a pin or config is malformed."""


@dataclass
class Config:
    """One point of the search: values for the kernel's constexpr parameters, plus launch options."""

    kwargs: dict[str, Any]
    num_warps: int = 4

    def as_dict(self) -> dict[str, Any]:
        """The kernel keywords this config adds to a launch (JSON data; also the stored form)."""
        return {**self.kwargs, "num_warps": self.num_warps}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Config":
        data = dict(data)
        num_warps = data.pop("num_warps", 4)
        if not isinstance(num_warps, int) or isinstance(num_warps, bool) or num_warps < 1:
            raise AutotuneError(f"num_warps must be a positive int, got {num_warps!r}")
        return cls(data, num_warps)

    def __str__(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())


# -- the tuning key --------------------------------------------------------------


def _is_array(value: Any) -> bool:
    return hasattr(value, "dtype") and hasattr(value, "shape") and not isinstance(value, (int, float))


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if _is_array(value):
        return list(value.shape)
    if hasattr(value, "item") and callable(value.item):   # numpy scalars
        return _json_value(value.item())
    return repr(value)


def tuning_key(key_names: Sequence[str], named_args: dict[str, Any]) -> str:
    """The key's argument values and the dtypes of all array arguments, as a JSON string."""
    values = [[name, _json_value(named_args.get(name))] for name in key_names]
    dtypes = [[name, str(value.dtype)] for name, value in named_args.items() if _is_array(value)]
    return json.dumps({"key": values, "dtypes": dtypes}, sort_keys=True, separators=(",", ":"))


# -- the file on disk --------------------------------------------------------------


class TuningStore:
    """The JSON file of a kernel's tuning results: {device: {tuning key: {config, timings}}}."""

    def __init__(self, kernel_name: str, source_hash: str, directory: str | os.PathLike | None = None):
        base = default_cache_directory() if directory is None else Path(directory)
        self.path = None if base is None else base / "autotune" / f"{kernel_name}-{source_hash[:16]}.json"
        self.kernel_name = kernel_name
        self.source_hash = source_hash

    def _read(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text("utf-8"))
        except (OSError, ValueError):   # missing, unreadable or corrupt: as if empty, and rewritten
            return {}
        results = data.get("results") if isinstance(data, dict) else None
        if data.get("version") != FORMAT_VERSION or not isinstance(results, dict):
            return {}
        return results

    def get(self, device: str, key: str) -> Config | None:
        record = self._read().get(device, {})
        record = record.get(key) if isinstance(record, dict) else None
        try:
            return Config.from_dict(record["config"]) if isinstance(record, dict) else None
        except (AutotuneError, KeyError, TypeError):
            return None

    def put(self, device: str, key: str, config: Config, timings: dict[str, float]) -> None:
        """Record a result, keeping the others (best effort: a write that fails is a warning)."""
        if self.path is None:
            return
        results = self._read()
        per_device = results.get(device) if isinstance(results.get(device), dict) else {}
        per_device[key] = {"config": config.as_dict(), "timings": timings}
        results[device] = per_device
        document = {"version": FORMAT_VERSION, "kernel": self.kernel_name, "source_hash": self.source_hash,
                    "results": results}
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "w", encoding="utf-8") as f:
                json.dump(document, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temp.unlink()
            import warnings
            warnings.warn(f"cannot save autotuning results to {self.path}: {exc.strerror or exc}; "
                          f"set TESSERA_CACHE_DIR to a writable directory", stacklevel=3)


# -- pinning, pruning, timing, progress ------------------------------------------------


def pinned_config(kernel_name: str, environ: dict[str, str] | None = None) -> Config | None:
    """The config `TESSERA_AUTOTUNE_PIN` fixes for this kernel, if any."""
    text = (os.environ if environ is None else environ).get(PIN_ENV, "").strip()
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise AutotuneError(f"{PIN_ENV} is not JSON ({exc}); write it like "
                            f"'{{\"BLOCK\": 128, \"num_warps\": 4}}'", kernel=kernel_name) from None
    if not isinstance(data, dict):
        raise AutotuneError(f"{PIN_ENV} must be a JSON object, got {text!r}", kernel=kernel_name)
    if data and all(isinstance(v, dict) for v in data.values()):   # {"kernel": {...}, ...}
        data = data.get(kernel_name)
        if data is None:
            return None
    return Config.from_dict(data)


def resource_problems(metadata: dict, target: Any) -> list[str]:
    """Why a compiled config should not run on `target` (a `tessera.ir.target.Target`); [] when it may."""
    problems = []
    shared = metadata.get("shared_bytes") or 0
    if shared > target.shared_memory_bytes:
        problems.append(f"needs {shared} bytes of shared memory, {target.name} has {target.shared_memory_bytes}")
    registers = metadata.get("registers")   # only known when ptxas ran
    if registers is not None and registers > target.registers_per_thread:
        problems.append(f"uses {registers} registers per thread, {target.name} allows {target.registers_per_thread}")
    threads = metadata.get("num_threads")
    if registers is not None and threads and registers * threads > target.registers_per_block:
        problems.append(f"needs {registers * threads} registers per block, "
                        f"{target.name} has {target.registers_per_block}")
    if metadata.get("spill_stores"):
        problems.append(f"spills registers ({metadata['spill_stores']} bytes of spill stores)")
    return problems


def perf_counter_timer(warmup: int, rep: int) -> Timer:
    """Host timing: `warmup` untimed launches, then the median of `rep` timed ones (seconds)."""
    def timer(run: Callable[[], None], config: Config) -> float:
        for _ in range(warmup):
            run()
        times = []
        for _ in range(max(rep, 1)):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    return timer


def cuda_event_timer(warmup: int, rep: int) -> Timer:
    """GPU timing with torch CUDA events on the current stream: median of `rep` launches (seconds)."""
    import torch

    def timer(run: Callable[[], None], config: Config) -> float:
        for _ in range(warmup):
            run()
        times = []
        for _ in range(max(rep, 1)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        return statistics.median(times)
    return timer


class Progress:
    """`tuning add: 3/8 configs`, redrawn in place on stderr; silent unless stderr is a terminal."""

    def __init__(self, kernel_name: str, total: int):
        self.stream = sys.stderr
        quiet = os.environ.get(QUIET_ENV, "0") == "1"
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = not quiet and callable(isatty) and isatty()
        self.kernel_name, self.total = kernel_name, total

    def update(self, done: int) -> None:
        if self.enabled:
            self.stream.write(f"\rtuning {self.kernel_name}: {done}/{self.total} configs")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


# -- the tuner -------------------------------------------------------------------


@dataclass
class Autotuner:
    """Chooses a config per (device, tuning key); see the module docstring."""

    kernel_name: str
    source_hash: str
    configs: list[Config]
    key: list[str] = field(default_factory=list)
    prune: Callable[[list[Config], dict[str, Any]], list[Config]] | None = None
    reset_to_zero: list[str] = field(default_factory=list)
    restore_value: list[str] = field(default_factory=list)
    timer: Timer | None = None
    model: Callable[[list[Config], dict[str, Any]], Config] | None = None
    cache_directory: str | os.PathLike | None = None
    pinned: Config | None = None
    chosen: dict[tuple[str, str], Config] = field(default_factory=dict)     # in memory
    timings: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    benchmarks: int = 0     # how many times this tuner measured (for tests and logs)

    def __post_init__(self):
        if not self.configs:
            raise AutotuneError("autotune needs at least one Config", kernel=self.kernel_name)
        self.store = TuningStore(self.kernel_name, self.source_hash, self.cache_directory)

    def pin(self, config: Config | None) -> None:
        """Use `config` for every launch without tuning (None to tune again)."""
        self.pinned = config

    def lookup(self, named_args: dict[str, Any], device: str) -> Config | None:
        """The config already chosen for these arguments on `device` (pin, memory, then disk), or None."""
        pinned = self.pinned or pinned_config(self.kernel_name)
        if pinned is not None:
            return pinned
        slot = (device, tuning_key(self.key, named_args))
        config = self.chosen.get(slot)
        if config is None:
            stored = self.store.get(*slot)
            if stored is not None and stored in self.configs:
                config = self.chosen[slot] = stored
        return config

    def choose(self, named_args: dict[str, Any], device: str, launch: Callable[[Config], None], *,
               metadata: MetadataFn | None = None, target: Any = None, timer: Timer | None = None) -> Config:
        """The config to launch with: looked up, else measured with `launch(config)` and stored.

        `metadata(config)` (the compiled kernel's resources) and `target` enable
        resource pruning; `timer` is used when the tuner has none of its own.
        """
        config = self.lookup(named_args, device)
        if config is not None:
            return config
        survivors = self._prune(named_args, metadata, target)
        config, timings = self._benchmark(survivors, named_args, launch, self.timer or timer)
        slot = (device, tuning_key(self.key, named_args))
        self.chosen[slot], self.timings[slot] = config, timings
        self.store.put(*slot, config, timings)
        return config

    def predict(self, named_args: dict[str, Any], device: str) -> tuple[Config, str]:
        """The config to launch with when nothing may be timed (a capture records launches whose inputs are not
        computed yet), and how it was found: "pinned", "tuned" (memory or disk), or "model" (`model(configs,
        named_args)` over the configs the prune function keeps, the first of them without a model). Compiling
        every config to prune by resources is left to tuning: the shipped configs are meant to fit."""
        if self.pinned is not None or pinned_config(self.kernel_name) is not None:
            return self.lookup(named_args, device), "pinned"
        config = self.lookup(named_args, device)
        if config is not None:
            return config, "tuned"
        survivors = self._prune(named_args, None, None)
        return (self.model(survivors, named_args) if self.model is not None else survivors[0]), "model"

    def _prune(self, named_args: dict[str, Any], metadata: MetadataFn | None, target: Any) -> list[Config]:
        reasons: dict[int, str] = {}
        if metadata is not None and target is not None:
            for i, config in enumerate(self.configs):
                try:
                    problems = resource_problems(metadata(config), target)
                except Exception as exc:   # a config that does not even compile cannot win
                    problems = [f"does not compile: {exc}"]
                if problems:
                    reasons[i] = "; ".join(problems)
        survivors = [c for i, c in enumerate(self.configs) if i not in reasons]
        if self.prune is not None and survivors:
            kept = list(self.prune(list(survivors), named_args))
            for i, config in enumerate(self.configs):
                if i not in reasons and config not in kept:
                    reasons[i] = "removed by the prune function"
            survivors = [c for c in survivors if c in kept]
        if not survivors:
            self._fail("every config was pruned", reasons)
        return survivors

    def _benchmark(self, configs: list[Config], named_args: dict[str, Any],
                   launch: Callable[[Config], None], timer: Timer | None) -> tuple[Config, dict[str, float]]:
        self.benchmarks += 1
        timer = timer or perf_counter_timer(1, 3)
        saved = {name: _copy(named_args[name]) for name in self.restore_value}
        progress = Progress(self.kernel_name, len(configs))
        timings: dict[str, float] = {}
        failures: dict[int, str] = {}
        try:
            for i, config in enumerate(configs):
                def trial(config=config):
                    for name in self.reset_to_zero:
                        _zero(named_args[name])
                    launch(config)
                try:
                    timings[str(config)] = float(timer(trial, config))
                except Exception as exc:   # e.g. too many resources for this GPU: the others may run
                    failures[self.configs.index(config)] = f"failed: {type(exc).__name__}: {exc}"
                progress.update(i + 1)
        finally:
            progress.close()
            for name, copy in saved.items():
                _copy_into(named_args[name], copy)
            for name in self.reset_to_zero:
                _zero(named_args[name])
        if not timings:
            self._fail("every config failed to run", failures)
        best = min(configs, key=lambda c: timings.get(str(c), float("inf")))
        return best, timings

    def _fail(self, what: str, reasons: dict[int, str]) -> None:
        lines = [f"  {self.configs[i]}: {reasons.get(i, 'not tried')}" for i in range(len(self.configs))]
        raise AutotuneError(f"{what}, so there is nothing to launch:\n" + "\n".join(lines) +
                            "\nadd configs that fit the target (smaller BLOCK sizes, fewer warps or stages), "
                            "or loosen the prune function", kernel=self.kernel_name)


def _zero(array: Any) -> None:
    if hasattr(array, "zero_"):
        array.zero_()
    else:
        array[...] = 0


def _copy(array: Any) -> Any:
    return array.clone() if hasattr(array, "clone") else array.copy()


def _copy_into(array: Any, saved: Any) -> None:
    if hasattr(array, "copy_"):
        array.copy_(saved)
    else:
        array[...] = saved

