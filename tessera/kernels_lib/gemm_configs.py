"""The shipped `tessera::gemm` configs, read from `gemm_configs.json`: data per GPU family, seeding the autotuner.

`COMMON` configs are tuned on every GPU; a family's own configs (`BY_FAMILY`,
e.g. "sm_90": 128 x 256 tiles that only Hopper's wgmma and 227 KB of shared
memory make pay) join them on that family only: the autotuner gets them all
(`ALL`) and `prune_for_device` keeps what the launching device's family
ships. On an AMD GPU it keeps the common configs as its plan target
(`targets.plan_target`) holds them (`BY_AMD_TARGET`): each with no more
STAGES than the target's LDS holds of its rings (`fitted`: the target
description's LDS over a stage's bytes, `ring_bytes`, counted as the
pipeline planner counts them), so that no compile asks for a stage the
planner would drop with a PipelineWarning. gfx942's 64 KiB takes the
BK = 64 tiles with 128 rows or columns 2 deep; gfx950's 160 KiB keeps each
config's own depth. The split-K paths (`gemm_split_k.py`) take their tiles
from the "small_m" entries (`SMALL_M`) and the "split_k" entry (`SPLIT_K`),
the stream-K kernel (`gemm_stream_k.py`) from the "stream_k" entry
(`STREAM_K`), per plan key the same way (`small_m_tiles`, `split_k_tile`,
`stream_k_tile`: each AMD target's fitted by `fitted_tile`). The file is data
so that a GPU session's measurements (bench/gemm.py --part configs) can
reorder or replace entries without code changes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

import tessera

from . import gpus, targets

_DATA = json.loads((Path(__file__).with_name("gemm_configs.json")).read_text())


def _configs(entries: list[dict]) -> list[tessera.Config]:
    return [tessera.Config(dict(e["meta"]), num_warps=e["num_warps"]) for e in entries]


COMMON = _configs(_DATA["common"])
BY_FAMILY = {family: _configs(entries) for family, entries in _DATA.items() if family.startswith("sm_")}
# The operands' element size the AMD ring budget assumes: bf16 / fp16 (fp8's rings take half of it).
RING_ELEMENT_BYTES = 2


def stage_bytes(BM: int, BN: int, row_bytes: int) -> int:
    """LDS bytes one stage of a K loop's rings takes: BM rows of A's block and BN of B's, `row_bytes` of K each,
    each slot 16-byte aligned, as the pipeline planner counts them (`passes/schedule/pipeline_plan.py`, whose AMD
    slots are plain row-major)."""
    return sum(-(-rows * row_bytes // 16) * 16 for rows in (BM, BN))


def ring_bytes(config: tessera.Config) -> int:
    """LDS bytes one stage of the tiled kernel's rings takes (`stage_bytes`, BK elements of RING_ELEMENT_BYTES)."""
    kw = config.kwargs
    return stage_bytes(kw["BM"], kw["BN"], kw["BK"] * RING_ELEMENT_BYTES)


def fitted(config: tessera.Config, lds: int) -> tessera.Config:
    """`config` with no more STAGES than `lds` bytes hold of its rings: the planner's own cap (it lowers S
    until S x the stage's bytes fit), made ahead so that a compile asks for no stage it would drop."""
    stages = min(config.kwargs["STAGES"], lds // ring_bytes(config))
    if stages == config.kwargs["STAGES"]:
        return config
    return tessera.Config({**config.kwargs, "STAGES": stages}, num_warps=config.num_warps)


def fitted_tile(tile: dict, BM: int, lds: int) -> dict | None:
    """A split-K or stream-K tile ({"BN", "K_BYTES", "STAGES", ...}, rows BM) with no more STAGES than `lds`
    bytes hold of its rings (`stage_bytes`: K_BYTES of a row whatever the dtype, as the paths size BK), as
    `fitted` caps the tiled configs; None where not even 2 stages fit (the planner would run it unpipelined):
    the entry is dropped for that target."""
    stages = min(tile["STAGES"], lds // stage_bytes(BM, tile["BN"], tile["K_BYTES"]))
    if stages < 2:
        return None
    return tile if stages == tile["STAGES"] else {**tile, "STAGES": stages}


BY_AMD_TARGET = {target: [fitted(c, targets.lds_bytes(target)) for c in COMMON]
                 for target in targets.AMD_PLAN_TARGETS}
# Each common config followed by its AMD twins that differ from it, so that every list the prune hook keeps is in
# the common order (the untimed model breaks its ties by it), then the families' own.
ALL = []
for _twins in zip(COMMON, *BY_AMD_TARGET.values()):
    ALL += [c for i, c in enumerate(_twins) if c not in _twins[:i]]
ALL += [c for configs in BY_FAMILY.values() for c in configs]
# The small-M path's tiles per row tile BM, in file order (`gemm_split_k.small_m_plan` picks one by its bandwidth
# model): {"BN", "K_BYTES" (BK = K_BYTES / element size, so a ring slot holds the same bytes for any dtype),
# "STAGES", "num_warps"}; the split count is computed.
SMALL_M: dict[int, list[dict]] = {}
for _entry in _DATA["small_m"]:
    SMALL_M.setdefault(_entry["BM"], []).append(dict(_entry["meta"], num_warps=_entry["num_warps"]))
# The few-tiles split-K tile (`gemm_split_k.few_tiles_plan`): {"BM", "BN", "K_BYTES", "STAGES", "num_warps"}.
SPLIT_K = dict(_DATA["split_k"]["meta"], num_warps=_DATA["split_k"]["num_warps"])
# The stream-K tile (`gemm_stream_k.stream_k_plan`): {"BM", "BN", "K_BYTES", "GROUP_M", "STAGES", "num_warps"}, and
# whether a GPU run has timed it (until then the op takes stream K only when $TESSERA_GEMM_STREAM_K forces it).
STREAM_K = dict(_DATA["stream_k"]["meta"], num_warps=_DATA["stream_k"]["num_warps"])
STREAM_K_MEASURED = bool(_DATA["stream_k"].get("measured", False))
# ... and the AMD plan keys whose GPUs have timed it ("measured_amd"): "measured" is an NVIDIA GPU's run (the only
# GPUs this project has run on), and an AMD GPU's atomics and LDS rings are another kernel's worth of risk, so
# "auto" takes stream K on an AMD GPU only once its own target is listed (`stream_k_measured`).
STREAM_K_MEASURED_AMD = tuple(_DATA["stream_k"].get("measured_amd", ()))
STREAM_K_CONFIG = tessera.Config(dict(_DATA["stream_k"]["meta"], STREAM_K=True), num_warps=STREAM_K["num_warps"])


# The split-K and stream-K tiles per plan key (`targets.plan_target`: "nvidia", or an AMD target), each fitted to
# the AMD target's LDS (`fitted_tile`), as BY_AMD_TARGET fits the tiled configs: gfx942's 64 KiB keeps the
# decode tiles 6-10 deep where NVIDIA's are 8-12, and the 128 x 128 split-K and stream-K tiles 2 deep; gfx950's
# 160 KiB holds them as shipped. A row tile (or the few-tiles / stream-K entry) whose 2 stages do not fit is
# left out there (none on gfx942 or gfx950).
def _fitted_small_m(lds: int) -> dict[int, list[dict]]:
    fitted_rows = {bm: [t for t in (fitted_tile(tile, bm, lds) for tile in tiles) if t is not None]
                   for bm, tiles in SMALL_M.items()}
    return {bm: tiles for bm, tiles in fitted_rows.items() if tiles}


SMALL_M_BY_TARGET = {"nvidia": SMALL_M, **{target: _fitted_small_m(targets.lds_bytes(target))
                                           for target in targets.AMD_PLAN_TARGETS}}
SPLIT_K_BY_TARGET = {"nvidia": SPLIT_K, **{target: fitted_tile(SPLIT_K, SPLIT_K["BM"], targets.lds_bytes(target))
                                           for target in targets.AMD_PLAN_TARGETS}}
STREAM_K_BY_TARGET = {"nvidia": STREAM_K, **{target: fitted_tile(STREAM_K, STREAM_K["BM"], targets.lds_bytes(target))
                                             for target in targets.AMD_PLAN_TARGETS}}


def _plans(key: str, table: dict):
    try:
        return table[key]
    except KeyError:
        raise ValueError(f"tessera::gemm: no split-K / stream-K tiles for plan key {key!r}; the keys are "
                         f"{', '.join(table)} (`targets.plan_target` gives a device's)") from None


def small_m_tiles(key: str = "nvidia") -> dict[int, list[dict]]:
    """The small-M tiles per row tile BM that GPUs of plan key `key` run (`SMALL_M_BY_TARGET`)."""
    return _plans(key, SMALL_M_BY_TARGET)


def split_k_tile(key: str = "nvidia") -> dict | None:
    """The few-tiles split-K tile GPUs of plan key `key` run (`SPLIT_K_BY_TARGET`); None: left out there."""
    return _plans(key, SPLIT_K_BY_TARGET)


def stream_k_tile(key: str = "nvidia") -> dict | None:
    """The stream-K tile GPUs of plan key `key` run (`STREAM_K_BY_TARGET`); None: left out there."""
    return _plans(key, STREAM_K_BY_TARGET)


def stream_k_measured(key: str = "nvidia") -> bool:
    """Whether a GPU run of plan key `key`'s GPUs has timed the stream-K kernel (`STREAM_K_MEASURED` for
    NVIDIA's, `STREAM_K_MEASURED_AMD` for an AMD target's): until then the op takes it only when forced."""
    return STREAM_K_MEASURED if key == "nvidia" else key in STREAM_K_MEASURED_AMD


def family_of(capability: tuple[int, int] | None) -> str | None:
    """'sm_90' for compute capability (9, x), 'sm_80' for (8, x), ...; None when not an NVIDIA GPU."""
    return None if capability is None else f"sm_{capability[0]}0"


def configs_for(family: str | None) -> list[tessera.Config]:
    """What a GPU of `family` tunes over: the common configs, then its own."""
    return COMMON + BY_FAMILY.get(family or "", [])


def prune_for_device(configs: list[tessera.Config], named_args: dict) -> list[tessera.Config]:
    """The autotuner's prune hook: keep the configs the launching device's family ships (`configs_for`), or on a
    ROCm build of torch its AMD plan target's (`BY_AMD_TARGET`)."""
    capability, amd_target = None, None
    for value in named_args.values():
        device = getattr(value, "device", None)
        if getattr(device, "type", None) == "cuda":
            if torch.version.hip:                       # (a ROCm build reports gfx archs, not capabilities)
                amd_target = targets.plan_target(device)
            elif torch.version.cuda is not None:
                capability = torch.cuda.get_device_capability(device)
            break
    wanted = BY_AMD_TARGET[amd_target] if amd_target else configs_for(family_of(capability))
    return [c for c in configs if c in wanted]


def is_clustered(config: tessera.Config) -> bool:
    """Whether `config` runs programs in thread-block clusters (CLUSTER_M or CLUSTER_N > 1, sm_90)."""
    return config.kwargs.get("CLUSTER_M", 1) * config.kwargs.get("CLUSTER_N", 1) > 1


def is_persistent_specialized(config: tessera.Config) -> bool:
    """Whether `config` is a persistent warp-specialized kernel (PERSISTENT and WS: the producer warpgroup walks
    the tiles too, `passes/schedule/warp_specialized_tiles.py`)."""
    return bool(config.kwargs.get("PERSISTENT") and config.kwargs.get("WS"))


def is_stream_k(config: tessera.Config) -> bool:
    """Whether `config` is the stream-K kernel's (`gemm_stream_k.py`: STREAM_K in its kwargs)."""
    return bool(config.kwargs.get("STREAM_K"))


def awaits_measurement(config: tessera.Config) -> bool:
    """Whether `config` is shipped for the timed autotuner only, its "why" a model no GPU has measured yet: the
    cluster configs and the persistent warp-specialized ones, and the stream-K config until its entry says
    "measured". The untimed model (`predicted`) never picks them; the op takes stream K by its model only once
    measured (`gemm_stream_k.stream_k_plan`)."""
    return is_clustered(config) or is_persistent_specialized(config) or (is_stream_k(config)
                                                                          and not STREAM_K_MEASURED)


# The SM count `predicted` assumes when the arguments do not name a torch CUDA device (the reference GPU's).
ASSUMED_SMS = gpus.H100_SXM.sms


def predicted(configs: list[tessera.Config], named_args: dict) -> tessera.Config:
    """The autotuner's model (`tessera.autotune(model=...)`): a config chosen without timing, used where a launch
    cannot be timed (inside `tessera.fusion()`) and nothing was tuned for the shape yet. It is the config whose
    waves of tiles compute the least padded area per SM (ceil(tiles / SMs) * BM * BN: tile padding and the
    last wave's idle SMs both count), larger tiles first among equals (more reuse of each loaded block), then
    the configs' own order. Cluster configs (CLUSTER_M / CLUSTER_N > 1) and persistent warp-specialized ones are left
    to the timed autotuner until a GPU run has measured them (`awaits_measurement`, `gemm_configs.json`)."""
    M, N, sms = int(named_args["M"]), int(named_args["N"]), _sm_count(named_args)
    configs = [c for c in configs if not awaits_measurement(c)] or configs            # not yet measured

    def cost(indexed):
        i, config = indexed
        bm, bn = config.kwargs["BM"], config.kwargs["BN"]
        waves = -(-tessera.cdiv(M, bm) * tessera.cdiv(N, bn) // sms)
        return waves * bm * bn, -bm * bn, i

    return min(enumerate(configs), key=cost)[1]


def _sm_count(named_args: dict) -> int:
    for value in named_args.values():
        device = getattr(value, "device", None)
        if getattr(device, "type", None) == "cuda":
            import torch
            return torch.cuda.get_device_properties(device).multi_processor_count
    return ASSUMED_SMS
