"""`dspark recipe`: data -> feature cache -> training -> calibration -> export, one command.

Every stage is resumable (finished shards, cache rows and training steps are kept), so
re-running the same command after an interruption continues where it stopped.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .trainer import TrainConfig

log = logging.getLogger("vllm.dspark.recipe")

# The variants trained on the same data with the same recipe (issue: default + ablations).
VARIANTS: dict[str, dict] = {
    "dspark-2l": dict(num_layers=2, markov_rank=64, confidence_head=True),
    "parallel-2l": dict(num_layers=2, markov_rank=0, confidence_head=False),
    "parallel-5l": dict(num_layers=5, markov_rank=0, confidence_head=False),
    "mtp-1": {},  # the one-layer EAGLE-style head (train/eagle.py)
}


@dataclass
class RecipeConfig:
    out: str
    target: str = "default"
    variants: tuple[str, ...] = ("dspark-2l",)
    num_prompts: int = 4500
    max_new_tokens: int = 320
    epochs: float = 4.0
    data_fractions: tuple[float, ...] = (1.0,)
    quick: bool = False
    cache_gb: float = 9.5
    feature_dtype: str = "float16"  # build-cache --feature-dtype (float8: half the feature disk)
    batch_size: int | None = None  # None: TrainConfig's default
    markov_init: str | None = None  # None: TrainConfig's default


def run_recipe(cfg: RecipeConfig) -> dict:
    from ..drafter.config import default_target_layer_ids
    from ..target import load_target, resolve_target
    from ..hardware import FEAT_DTYPES
    from .cache import build_cache
    from .calibrate import calibrate
    from .make_data import MakeDataConfig, make_data
    from .trainer import train

    out = Path(cfg.out)
    # Quick: a minute-sized end-to-end check (tests), not a drafter: no torch.compile for
    # a few hundred generated tokens.
    quick = dict(num_prompts=24, max_new_tokens=32, shard_size=12, eager=True) if cfg.quick else {}
    mdc = MakeDataConfig(out_dir=str(out / "data"), target=cfg.target,
                         **({"num_prompts": cfg.num_prompts,
                             "max_new_tokens": cfg.max_new_tokens} | quick))
    # Refuse bad settings now, not after hours of data generation and caching.
    mdc.validate()
    unknown = [v for v in cfg.variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"variants {unknown}: choose from {list(VARIANTS)}")
    if cfg.feature_dtype not in FEAT_DTYPES:
        raise ValueError(f"feature_dtype={cfg.feature_dtype!r}: one of {FEAT_DTYPES}")
    if not cfg.cache_gb > 0:
        raise ValueError(f"cache_gb={cfg.cache_gb}: must be > 0")
    overrides = {k: getattr(cfg, k) for k in ("batch_size", "markov_init")
                 if getattr(cfg, k) is not None}
    for frac in cfg.data_fractions:
        TrainConfig(cache="", out="", epochs=cfg.epochs, data_fraction=frac,
                    **overrides).validate()
    out.mkdir(parents=True, exist_ok=True)
    target = str(resolve_target(cfg.target))
    timings, t0 = {}, time.time()
    data = make_data(replace(mdc, target=target))
    timings["make_data_s"] = time.time() - t0
    tcfg, _ = load_target(target, tokenizer=False)
    layers = default_target_layer_ids(tcfg.config.num_hidden_layers, 5)
    t1 = time.time()
    build_cache(data, out / "cache", target, layers, max_gb=cfg.cache_gb,
                feat_dtype=cfg.feature_dtype)
    timings["cache_s"] = time.time() - t1
    results = {}
    for name in cfg.variants:
        for frac in cfg.data_fractions:
            run = name if frac == 1.0 else f"{name}-data{int(frac * 100)}"
            t2 = time.time()
            if name == "mtp-1":
                from .eagle import EagleConfig, train_eagle

                ec = EagleConfig(cache=str(out / "cache"), out=str(out / run), target=target,
                                 epochs=1.0, max_steps=4 if cfg.quick else None)
                results[run] = {"drafter": str(train_eagle(ec))}
                timings[f"train_{run}_s"] = time.time() - t2
                continue
            tc = TrainConfig(cache=str(out / "cache"), out=str(out / run), target=target,
                             epochs=cfg.epochs, data_fraction=frac, **VARIANTS[name], **overrides)
            if cfg.quick:
                tc = replace(tc, epochs=1.0, batch_size=4, anchors=8, log_every=2, save_every=5)
            drafter = train(tc)
            timings[f"train_{run}_s"] = time.time() - t2
            rep = None
            if tc.confidence_head:
                rep = calibrate(drafter, out / "cache", target, heldout=tc.heldout,
                                max_blocks=200 if cfg.quick else 4000)
            results[run] = {"drafter": str(drafter), "calibration": rep}
    timings["total_s"] = time.time() - t0
    summary = {"timings": timings, "runs": results}
    # Variants are often trained by separate invocations: keep earlier runs' entries.
    path = out / "recipe.json"
    if path.exists():
        old = json.loads(path.read_text())
        summary = {"timings": old.get("timings", {}) | timings,
                   "runs": old.get("runs", {}) | results}
    path.write_text(json.dumps(summary, indent=2))
    return summary
