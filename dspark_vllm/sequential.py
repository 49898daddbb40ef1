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
    positions: torch.Tensor | None = None,  # [B, K] token positions (keys the random stream)
) -> SampledBlock:
    import kernels

    b, k, _ = h.shape
    base = model.compute_draft_logits(h.flatten(0, 1)).view(b, k, -1)  # [B, K, Vd]
    head = model.model.markov_head
    w1, w2 = head.markov_w1.weight, head.markov_w2.weight  # [V, r], [Vd, r]
    greedy = temperature is None and not want_probs  # every row greedy, no distribution wanted
    if not greedy:
        cols = _draft_to_target_columns(model, base.shape[-1], h.device)
        t = torch.zeros(b, device=h.device) if temperature is None else \
            torch.where(temperature < GREEDY_EPS, 0.0, temperature.float())
        # A fresh random stream per step and request; greedy rows ignore it.
        seed = torch.randint(0, 2**62, (b,), device=h.device)
        if positions is None:
            positions = torch.arange(k, device=h.device).expand(b, k)
        slot_positions = positions.long().t().contiguous()  # [K, B]: one dense row per step
    prev = anchor
    tokens, probs = [], []
    for i in range(k):
        # Fused rescoring: U_i + W1[x_{i-1}] W2^T, then argmax / Gumbel-max (kernels/). An
        # all-greedy block needs the token alone, not the log-normaliser and noise.
        if greedy:
            d = kernels.transition_argmax(base[:, i], prev, w1, w2)
        else:
            d, _, _, q = kernels.transition_step(base[:, i], prev, w1, w2, t, seed,
                                                 slot_positions[i], want_probs=want_probs)
            if want_probs:
                probs.append(q if cols is None else
                             q.new_zeros(b, target_vocab_size).index_copy_(1, cols, q))
        prev = model.map_draft_to_target(d)
        tokens.append(prev)
    out = torch.stack(tokens, 1)  # [B, K]
    conf = None
    if model.model.confidence_head is not None:
        # Slot k reads x_{k-1}, never x_k: the anchor, then every draft but the last. One
        # call for the block once its tokens are known (at one request on a CPU the per-slot
        # calls were ~1 ms of a ~50 ms step: README, the draft pass in-process).
        prevs = torch.cat([anchor[:, None], out[:, :-1]], 1)  # [B, K]
        conf = _confidences(model.model.confidence_head, h, prevs, w1, conf_temps[:k])
    return SampledBlock(tokens=out, probs=torch.stack(probs, 1) if probs else None,
                        confidence=conf)


def _confidences(head, h: torch.Tensor, prevs: torch.Tensor, w1: torch.Tensor,
                 temps: torch.Tensor) -> torch.Tensor:
    """[B, K, H], [B, K] x_{k-1} -> [B, K] sigmoid((w^T [h_k; W1[x_{k-1}]] + b) / T_k)."""
    import kernels

    w = head.proj.weight
    if head.with_markov and w.numel() == h.shape[-1] + w1.shape[1]:
        return kernels.confidence_block(h, prevs, w1, w.view(-1), head.proj.bias.view(-1), temps)
    # vLLM may repack linear weights for its CPU GEMM (leaving `weight` empty): use the module.
    b, k = prevs.shape
    z = head(h.flatten(0, 1), w1[prevs.flatten()]).float().view(b, k)
    return torch.sigmoid(z / temps)
