"""The DSpark training loss (paper §3; DeepSpec `compute_dspark_loss`), as a pure function.

    L = a_ce * CE(draft, y) + a_l1 * ||p_draft - p_target||_1 + a_conf * BCE(c, c*)
    c* = 1 - ½ ||p_draft - p_target||_1      (the acceptance probability of speculative sampling)
    position weights w_k = exp(-k / gamma), k = 0 .. block-1, only on a contiguous valid prefix.

With a reduced draft vocabulary the target keeps its full-vocabulary normalisation: mass the
target puts outside the draft vocabulary can never be matched and counts fully in the L1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class LossWeights:
    ce: float = 0.1
    l1: float = 0.9
    confidence: float = 1.0
    decay_gamma: float = 4.0  # the public code's exp(-k/4) at block 7


def position_weights(valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """valid: [N, G] contiguous-prefix mask -> w: [N, G] = valid * exp(-k / gamma)."""
    k = torch.arange(valid.shape[-1], device=valid.device, dtype=torch.float32)
    return valid.float() * torch.exp(-k / gamma)


def dspark_loss(
    draft_logits: torch.Tensor,  # [N, G, Vd] after the transition bias
    target_logp: torch.Tensor,  # [N, G, Vd] log p_target on the draft vocabulary (full-vocab norm)
    labels: torch.Tensor,  # [N, G] draft-vocab id of the true next token, -1 if outside Vd
    valid: torch.Tensor,  # [N, G] bool, contiguous prefix per block
    confidence_logits: torch.Tensor | None,  # [N, G]
    weights: LossWeights = LossWeights(),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    w = position_weights(valid, weights.decay_gamma)
    den = w.sum().clamp_min(1e-6)
    q = torch.softmax(draft_logits.float(), -1)
    p = target_logp.float().exp()
    l1 = (q - p).abs().sum(-1) + (1.0 - p.sum(-1)).clamp_min(0.0)  # [N, G]
    accept = (1.0 - 0.5 * l1).clamp(0.0, 1.0)  # c*: exact acceptance probability
    in_vocab = labels >= 0
    ce = F.cross_entropy(draft_logits.float().flatten(0, 1), labels.clamp_min(0).flatten(),
                         reduction="none").view_as(w)
    w_ce = w * in_vocab
    loss_ce = (ce * w_ce).sum() / w_ce.sum().clamp_min(1e-6)
    loss_l1 = (l1 * w).sum() / den
    loss = weights.ce * loss_ce + weights.l1 * loss_l1
    metrics = {"ce": loss_ce.detach(), "l1": loss_l1.detach()}
    if confidence_logits is not None:
        bce = F.binary_cross_entropy_with_logits(confidence_logits.float(), accept.detach(),
                                                 reduction="none")
        loss_conf = (bce * w).sum() / den
        loss = loss + weights.confidence * loss_conf
        metrics["confidence"] = loss_conf.detach()
    with torch.no_grad():
        v = valid.float()
        metrics["accept_prob_at"] = (accept * v).sum(0) / v.sum(0).clamp_min(1)  # [G]
        hit = (draft_logits.argmax(-1) == labels) & valid
        metrics["top1_at"] = hit.float().sum(0) / v.sum(0).clamp_min(1)  # [G]
        # Expected tokens per round at temperature 1 if every valid slot is verified.
        block_ok = valid[:, 0]
        tau = 1.0 + (accept * v).cumprod(-1).sum(-1)
        metrics["tau_expected"] = tau[block_ok].mean() if block_ok.any() else tau.new_zeros(())
    metrics["loss"] = loss.detach()
    return loss, metrics
