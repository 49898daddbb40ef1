"""Sequential Temperature Scaling (STS) of the confidence head (paper §3.3).

The scheduler ranks slots by the survival product a_k = prod_{j<=k} c_j, so what must be
calibrated is that product. STS fits one temperature per position, left to right:
T_k = argmin_T ECE(a_{k-1} * sigmoid(z_k / T)) given the already fitted T_1..T_{k-1}.

Greedy (temperature 0) outcomes come exactly from held-out greedy sequences in the feature
cache: until the first miss, teacher forcing *is* the drafted chain, so draft k is accepted
iff the drafter's argmax equals the target's token at every position up to k.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..drafter.model import DSparkDrafter, block_inputs, block_mask

TEMPERATURE_GRID = np.exp(np.linspace(np.log(0.1), np.log(10.0), 121))
ECE_BINS = 10
MIN_GREEDY_SEQS = 8  # fewer held-out greedy sequences than this: borrow training ones
# Answer positions prompt lookup's table is measured at: a quarter of the recipe's data
# (6,943 greedy and 49,168 sampled positions) took 4.2 s for both tables, imports included
# (`dspark calibrate --lookup-only`, README); the cap bounds a large cache's time.
MAX_LOOKUP_POSITIONS = 50_000


def ece(pred: np.ndarray, outcome: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error with equal-width bins, weighted by bin size."""
    pred, outcome = np.asarray(pred, float).ravel(), np.asarray(outcome, float).ravel()
    if not len(pred):
        return float("nan")
    idx = np.minimum((pred * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            total += m.sum() * abs(pred[m].mean() - outcome[m].mean())
    return total / len(pred)


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney probability P(score_pos > score_neg), ties counting ½."""
    from scipy.stats import rankdata

    score, label = np.asarray(score, float), np.asarray(label, bool)
    npos, nneg = label.sum(), (~label).sum()
    if npos == 0 or nneg == 0:
        return float("nan")
    ranks = rankdata(score)
    return float((ranks[label].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def _json_num(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def survival(z: np.ndarray, temps: np.ndarray) -> np.ndarray:
    """z: [N, G] confidence logits -> a: [N, G] cumulative products of sigmoid(z / T)."""
    return np.cumprod(1.0 / (1.0 + np.exp(-z / temps[None, :])), axis=1)


def fit_sts(z: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    """z: [N, G] logits; accepted: [N, G] bool, 1 iff drafts 1..k were all accepted."""
    g = z.shape[1]
    temps = np.ones(g)
    prefix = np.ones(len(z))
    for k in range(g):
        errs = [ece(prefix / (1.0 + np.exp(-z[:, k] / t)), accepted[:, k]) for t in TEMPERATURE_GRID]
        temps[k] = TEMPERATURE_GRID[int(np.argmin(errs))]
        prefix = prefix / (1.0 + np.exp(-z[:, k] / temps[k]))
    return temps


def report(z: np.ndarray, accepted: np.ndarray, temps: np.ndarray) -> dict:
    a_raw, a_cal = survival(z, np.ones(z.shape[1])), survival(z, temps)
    per_pos_auc = []
    for k in range(z.shape[1]):
        reached = accepted[:, k - 1] if k else np.ones(len(z), bool)  # conditional on prefix
        per_pos_auc.append(auc(z[reached, k], accepted[reached, k]))
    defined = [x for x in per_pos_auc if not np.isnan(x)]
    # An AUC is undefined where the held-out blocks hold only one outcome (quick mode's few
    # blocks often do): it is written as null, which strict JSON readers accept and NaN is not.
    return {
        "temperatures": temps.tolist(),
        "auc_per_position": [_json_num(x) for x in per_pos_auc],
        "auc_mean": float(np.mean(defined)) if defined else None,
        "auc_survival": _json_num(auc(a_cal.ravel(), accepted.ravel())),
        "ece_survival_before": ece(a_raw, accepted),
        "ece_survival_after": ece(a_cal, accepted),
        "blocks": int(len(z)),
        "acceptance_rate_at": accepted.mean(0).tolist(),
    }


@torch.no_grad()
def collect_greedy(drafter: DSparkDrafter, cache, seqs, cols, t2d, max_blocks: int = 4000,
                   anchors_per_seq: int = 24, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Confidence logits and greedy acceptance outcomes on held-out greedy sequences.
    A drafter without a confidence head (the purely parallel ones) gets logits of zero, so
    its outcomes can be measured on the same blocks."""
    from .trainer import pad_batch, sample_anchors

    g = drafter.cfg.block_size
    gen = torch.Generator().manual_seed(seed)
    greedy = [i for i in seqs if cache.info.temperatures[i] == 0.0]
    zs, accs = [], []
    for start in range(0, len(greedy), 8):
        batch = pad_batch(cache, greedy[start:start + 8], cols)
        anchors, keep = sample_anchors(batch["prompt_lens"], batch["lens"], anchors_per_seq, gen)
        tok = batch["tokens"]
        b, t = tok.shape
        ids, pos = block_inputs(tok.gather(1, anchors), anchors, g, drafter.cfg.mask_token_id)
        h = drafter(ids, pos, batch["feats"], torch.arange(t).expand(b, t),
                    block_mask(anchors, t, g, keep)).view(b, -1, g, drafter.cfg.hidden_size)
        lab_pos = anchors[..., None] + torch.arange(1, g + 1)
        full = (lab_pos < batch["lens"][:, None, None]).all(-1) & keep  # whole block in range
        labels = tok.gather(1, lab_pos.clamp(max=t - 1).flatten(1)).view(b, -1, g)
        prev = torch.cat([tok.gather(1, anchors)[..., None], labels[..., :-1]], -1)
        logits = drafter.base_logits(h)
        bias = drafter.markov_bias(prev)
        if bias is not None:
            logits = logits + bias
        hit = drafter.draft_to_target(logits.argmax(-1)) == labels
        z = drafter.confidence_logits(h, prev)
        if z is None:
            z = torch.zeros(hit.shape)  # [b, A, g]
        zs.append(z[full].numpy())
        accs.append(hit[full].int().cumprod(-1).bool().numpy())
        if sum(len(x) for x in zs) >= max_blocks:
            break
    return np.concatenate(zs)[:max_blocks], np.concatenate(accs)[:max_blocks]


def lookup_table(cache, seqs, block: int, sampled: bool = False) -> dict:
    """Prompt lookup's acceptance table (lookup.measure_table) on the greedy answers of
    `seqs` (`sampled`: on those sampled at temperature > 0, where a copied token's match
    with the sampled continuation is distributed as its acceptance there): what lookup
    would have had accepted, whatever drafter it goes beside."""
    from .. import lookup

    def answers():
        left = MAX_LOOKUP_POSITIONS
        for i in seqs:
            if (cache.info.temperatures[i] > 0.0) != sampled or left <= 0:
                continue
            a, b = cache.info.offsets[i], cache.info.offsets[i + 1]
            plen = cache.info.prompt_lens[i]
            tokens = np.asarray(cache.tokens[a:min(b, a + plen + left)], dtype=np.int64)
            left -= len(tokens) - plen
            yield tokens, plen

    table, blocks = lookup.measure_table(answers(), block)
    return {"table": table, "blocks_per_match_length": blocks,
            "expected_length": [float(lookup.expected_length(np.array(r))) for r in table]}


def _calibration_seqs(cache, heldout: float) -> list[int]:
    from .trainer import heldout_split

    seqs = list(heldout_split(cache, heldout))
    if sum(cache.info.temperatures[i] == 0.0 for i in seqs) < MIN_GREEDY_SEQS:
        # Tiny caches (quick runs): too few held-out greedy answers; borrow trained ones.
        seqs += list(range(len(cache)))[::-1]
    return seqs


def calibrate_lookup(drafter_dir: str | Path, cache_dir: str | Path,
                     heldout: float = 0.05) -> dict:
    """Measure prompt lookup's table alone and write it into the drafter's config (its
    confidence temperatures stay as they are)."""
    from ..drafter.config import DSparkDrafterConfig
    from .cache import open_cache

    cfg = DSparkDrafterConfig.load(drafter_dir)
    cache = open_cache(cache_dir)
    rep = _lookup_tables(cfg, cache, _calibration_seqs(cache, heldout))
    cfg.validate()
    cfg.save(drafter_dir)
    path = Path(drafter_dir) / "calibration.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**old, **rep}, indent=2) + "\n")
    return rep


def _lookup_tables(cfg, cache, seqs) -> dict:
    """Both of prompt lookup's tables into `cfg` -> their reports. The greedy one on the
    held-out greedy answers, like the confidences; the sampled one on every sampled answer
    (a held-out share holds few: 13 of a quarter's 56 sequences), as lookup has no trained
    weights to hold data out from. No sampled answers: no table, no lookup when sampling."""
    rep = {"lookup": lookup_table(cache, seqs, cfg.block_size)}
    cfg.dspark_lookup_acceptance = rep["lookup"]["table"]
    sampled = lookup_table(cache, range(len(cache)), cfg.block_size, sampled=True)
    cfg.dspark_lookup_acceptance_sampled = sampled["table"] if sum(
        sampled["blocks_per_match_length"]) else None
    if cfg.dspark_lookup_acceptance_sampled is not None:
        rep["lookup_sampled"] = sampled
    return rep


def calibrate(drafter_dir: str | Path, cache_dir: str | Path, target: str = "default",
              heldout: float = 0.05, max_blocks: int = 4000) -> dict:
    """Fit STS on held-out cache data; write the temperatures (and prompt lookup's table)
    into the drafter's config."""
    if max_blocks < 1:
        raise ValueError(f"max_blocks={max_blocks}: calibration needs at least one block")
    from ..drafter.checkpoint import load_drafter
    from ..target import load_target
    from .cache import open_cache

    target_model, _ = load_target(target, tokenizer=False)
    drafter = load_drafter(drafter_dir, target_model.get_input_embeddings().weight,
                           target_model.get_output_embeddings().weight,
                           target_num_layers=target_model.config.num_hidden_layers).eval()
    if drafter.confidence_head is None:
        raise ValueError(f"{drafter_dir}: the drafter has no confidence head to calibrate")
    cache = open_cache(cache_dir)
    cols = cache.select(drafter.cfg.target_layer_ids)
    seqs = _calibration_seqs(cache, heldout)
    z, acc = collect_greedy(drafter, cache, seqs, cols, None, max_blocks)
    temps = fit_sts(z, acc)
    rep = report(z, acc, temps)
    rep.update(_lookup_tables(drafter.cfg, cache, seqs))
    drafter.cfg.dspark_confidence_temperatures = rep["temperatures"]
    drafter.cfg.validate()
    drafter.cfg.save(drafter_dir)
    (Path(drafter_dir) / "calibration.json").write_text(json.dumps(rep, indent=2) + "\n")
    return rep
