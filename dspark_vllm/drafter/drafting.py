"""Sequential (semi-autoregressive) drafting with the reference drafter.

The backbone produces all gamma hidden states in one parallel pass; the transition head
then walks the block left to right: p_k ∝ exp((U_k + B(x_{k-1}, ·)) / t), one step of memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .model import DSparkDrafter, block_inputs, block_mask


@dataclass
class Draft:
    tokens: torch.Tensor  # [B, G] target-vocabulary ids
    probs: torch.Tensor  # [B, G, V_draft] distribution each token was drawn from
    draft_ids: torch.Tensor  # [B, G] draft-vocabulary ids
    confidence: torch.Tensor | None  # [B, G] sigmoid of the confidence head
    # [B, G] the greedy chain's confidences when asked (= `confidence` when greedy): they
    # read no sampled token, so a choice made on them keeps sampling exact (lookup.py).
    greedy_confidence: torch.Tensor | None = None


def sample_sequential(
    drafter: DSparkDrafter,
    h: torch.Tensor,  # [B, G, H] backbone hidden states of the block
    anchor: torch.Tensor,  # [B] target id of the anchor (x_0)
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> Draft:
    base = drafter.base_logits(h).float()  # [B, G, Vd]
    temps = drafter.cfg.dspark_confidence_temperatures or [1.0] * h.shape[1]
    prev = anchor
    toks, dids, probs, confs = [], [], [], []
    for k in range(h.shape[1]):
        logits = base[:, k]
        bias = drafter.markov_bias(prev)
        if bias is not None:  # the sequential stage: hear the token just drafted
            logits = logits + bias.float()
        conf = drafter.confidence_logits(h[:, k], prev)  # reads x_{k-1}, never x_k
        if temperature <= 0:
            d = logits.argmax(-1)
            q = torch.nn.functional.one_hot(d, logits.shape[-1]).float()
        else:
            q = torch.softmax(logits / temperature, -1)
            d = torch.multinomial(q, 1, generator=generator).squeeze(-1)
        prev = drafter.draft_to_target(d)
        toks.append(prev), dids.append(d), probs.append(q)
        confs.append(None if conf is None else torch.sigmoid(conf.float() / temps[k]))
    return Draft(
        tokens=torch.stack(toks, 1),
        probs=torch.stack(probs, 1),
        draft_ids=torch.stack(dids, 1),
        confidence=None if confs[0] is None else torch.stack(confs, 1),
    )


@torch.no_grad()
def propose(
    drafter: DSparkDrafter,
    ctx_feats: torch.Tensor,  # [B, T, F] target features of positions 0..T-1 (all verified)
    anchor: torch.Tensor,  # [B] the token at position T (emitted, not yet seen by the target)
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    num_slots: int | None = None,
    greedy_confidence: bool = False,  # also the greedy chain's confidences (prompt lookup)
) -> Draft:
    """Draft `num_slots` (default gamma) tokens after the anchor."""
    b, t, _ = ctx_feats.shape
    g = num_slots or drafter.cfg.block_size
    anchor_pos = torch.full((b, 1), t, dtype=torch.long, device=ctx_feats.device)
    ids, pos = block_inputs(anchor[:, None], anchor_pos, g, drafter.cfg.mask_token_id)
    ctx_pos = torch.arange(t, device=ctx_feats.device).expand(b, t)
    h = drafter(ids, pos, ctx_feats, ctx_pos, block_mask(anchor_pos, t, g))
    d = sample_sequential(drafter, h, anchor, temperature, generator)
    if greedy_confidence:  # a sampled block's own confidences read its tokens: walk greedily
        d.greedy_confidence = d.confidence if temperature <= 0 else \
            sample_sequential(drafter, h, anchor, 0.0).confidence
    return d
