"""The sequential stage on vLLM's drafter module: walk a drafted block left to right.

p_k ∝ exp((U_k + W1[x_{k-1}] W2^T) / t), one step of memory; the confidence of slot k reads
x_{k-1} (never x_k), which is what keeps the budget policy on the safe side of the
causality wall.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GREEDY_EPS = 1e-5  # vLLM's sampler treats temperatures below this as greedy


@dataclass
class SampledBlock:
    tokens: torch.Tensor  # [B, K] target-vocabulary ids
    probs: torch.Tensor | None  # [B, K, V_target] draft distribution (probabilistic drafting)
    confidence: torch.Tensor | None  # [B, K] calibrated sigmoid of the confidence head


def _draft_to_target_columns(model, vd: int, device) -> torch.Tensor | None:
    d2t = getattr(model, "draft_id_to_target_id", None)
    if d2t is None:
        return None
    return torch.arange(vd, device=device) + d2t


@torch.no_grad()
def sample_block(
    model,  # vLLM Qwen3DSparkForCausalLM
    h: torch.Tensor,  # [B, K, H] backbone hidden states
    anchor: torch.Tensor,  # [B] target id of x_0
    temperature: torch.Tensor | None,  # [B]; None = all greedy
    conf_temps: torch.Tensor,  # [K] Sequential Temperature Scaling
    want_probs: bool,
    target_vocab_size: int,
) -> SampledBlock:
    b, k, _ = h.shape
    base = model.compute_draft_logits(h.flatten(0, 1)).view(b, k, -1).float()  # [B, K, Vd]
    vd = base.shape[-1]
    cols = _draft_to_target_columns(model, vd, h.device)
    conf_head = model.model.confidence_head
    greedy = None if temperature is None else temperature < GREEDY_EPS
    prev = anchor
    tokens, probs, confs = [], [], []
    for i in range(k):
        emb = model.markov_embed(prev)  # [B, r] W1[x_{i-1}]
        logits = base[:, i] + model.markov_bias(emb).float()  # [B, Vd]
        if conf_head is not None:
            confs.append(torch.sigmoid(conf_head(h[:, i], emb).float() / conf_temps[i]))
        if temperature is None:
            d = logits.argmax(-1)
        else:
            q = torch.softmax(logits / torch.where(greedy, 1.0, temperature)[:, None], -1)
            # Exponential race == sampling from q (Gumbel-max in probability space).
            sampled = (q / torch.empty_like(q).exponential_()).argmax(-1)
            d = torch.where(greedy, logits.argmax(-1), sampled)
            if want_probs:
                if cols is None:
                    probs.append(q)
                else:
                    full = q.new_zeros(b, target_vocab_size)
                    probs.append(full.index_copy_(1, cols, q))
        prev = model.map_draft_to_target(d)
        tokens.append(prev)
    return SampledBlock(
        tokens=torch.stack(tokens, 1),
        probs=torch.stack(probs, 1) if probs else None,
        confidence=torch.stack(confs, 1) if confs else None,
    )
