"""Torch references for the transition-head kernels: the plain math, the source of truth.

All math is float32 on float32-upcast inputs (a bf16 W1/W2 is widened before the product,
as the kernels do with an fp32-accumulating tl.dot).  Temperature is per row; 0 = greedy.
  logits  = U + W1[prev] W2^T                      # [B, V]
  z       = logits / t   (t = 1 where greedy)
  lse     = logsumexp(z)
  token   = argmax(z)  (greedy)  |  argmax(z + gumbel(seed, position, vocab id))  (t > 0)
  logprob = z[token] - lse,  probs = exp(z - lse)
"""

from __future__ import annotations

import torch

from . import rng

Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _write(result: Outputs, out: Outputs | None) -> Outputs:
    if out is None:
        return result
    for dst, src in zip(out, result):
        dst.copy_(src)
    return out


def _transition_logits(base_logits: torch.Tensor, prev_ids: torch.Tensor, w1: torch.Tensor,
                       w2: torch.Tensor) -> torch.Tensor:
    """U + W1[prev] W2^T in float32 -> [B, V]."""
    return base_logits.float() + w1[prev_ids].float() @ w2.float().t()


def _confidence_logits(h: torch.Tensor, prev_ids: torch.Tensor, w1: torch.Tensor,
                       w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """w . [h ; W1[prev]] + b in float32: [..., H], [...] -> [...]."""
    return torch.cat([h.float(), w1[prev_ids].float()], -1) @ w.float() + b.float()


def _choose(z: torch.Tensor, ids: torch.Tensor, temperature: torch.Tensor,
            seed: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """z [B, N] scaled logits, ids [B, N] their vocab ids -> (column [B], lse [B])."""
    lse = torch.logsumexp(z, -1)
    sampled = temperature > 0
    if not bool(sampled.any()):  # an all-greedy batch needs no noise
        return z.argmax(-1), lse
    score = torch.where(sampled[:, None], z + rng.gumbel(seed, position, ids), z)
    return score.argmax(-1), lse


def transition_step_ref(
    base_logits: torch.Tensor,  # [B, V] U_k
    prev_ids: torch.Tensor,  # [B] int64 target-vocabulary id of x_{k-1}
    w1: torch.Tensor,  # [Vt, r]
    w2: torch.Tensor,  # [V, r]
    temperature: torch.Tensor,  # [B] float32, 0 = greedy
    seed: torch.Tensor,  # [B] int64
    position: torch.Tensor,  # [B] int64
    want_probs: bool = False,
    out_probs: torch.Tensor | None = None,  # [B, V] float32
    *,
    out: Outputs | None = None,  # preallocated (token, logprob, lse)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """-> token [B] int64, logprob [B] f32, lse [B] f32, probs [B, V] f32 or None."""
    logits = _transition_logits(base_logits, prev_ids, w1, w2)
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    z = logits / t[:, None]
    ids = torch.arange(z.shape[1], device=z.device).expand_as(z)
    token, lse = _choose(z, ids, temperature, seed, position)
    logprob = z.gather(1, token[:, None]).squeeze(1) - lse
    probs = None
    if want_probs:
        probs = torch.exp(z - lse[:, None])
        if out_probs is not None:
            probs = out_probs.copy_(probs)
    return (*_write((token, logprob, lse), out), probs)


def transition_argmax_ref(
    base_logits: torch.Tensor,  # [B, V] U_k
    prev_ids: torch.Tensor,  # [B] int64
    w1: torch.Tensor,  # [Vt, r]
    w2: torch.Tensor,  # [V, r]
) -> torch.Tensor:
    """A greedy step's token alone: argmax(U + W1[prev] W2^T) -> [B] int64. The same
    float32 logits as transition_step_ref (z = logits / 1), without the log-normaliser,
    log-probability and temperature work a greedy drafting loop throws away."""
    return _transition_logits(base_logits, prev_ids, w1, w2).argmax(-1)


def transition_step_topk_ref(
    topk_values: torch.Tensor,  # [B, k] base logits of the candidates
    topk_ids: torch.Tensor,  # [B, k] int64 draft-vocabulary ids of the candidates
    prev_ids: torch.Tensor,  # [B] int64
    w1: torch.Tensor,  # [Vt, r]
    w2: torch.Tensor,  # [V, r]
    temperature: torch.Tensor,  # [B] float32
    seed: torch.Tensor,  # [B] int64
    position: torch.Tensor,  # [B] int64
    *,
    out: Outputs | None = None,
) -> Outputs:
    """The step restricted to k candidates -> token [B] (draft id), logprob [B], lse [B]
    (both over the candidate set)."""
    bias = torch.einsum("br,bkr->bk", w1[prev_ids].float(), w2[topk_ids].float())
    logits = topk_values.float() + bias
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    z = logits / t[:, None]
    col, lse = _choose(z, topk_ids, temperature, seed, position)
    token = topk_ids.gather(1, col[:, None]).squeeze(1)
    logprob = z.gather(1, col[:, None]).squeeze(1) - lse
    return _write((token, logprob, lse), out)


def confidence_ref(
    h: torch.Tensor,  # [B, H] backbone hidden state h_k
    prev_ids: torch.Tensor,  # [B] int64
    w1: torch.Tensor,  # [Vt, r]
    w: torch.Tensor,  # [H + r] confidence projection (nn.Linear(H + r, 1).weight[0])
    b: torch.Tensor,  # [1] its bias
) -> torch.Tensor:
    """c_k = sigmoid(w . [h_k ; W1[x_{k-1}]] + b) -> [B] float32."""
    return torch.sigmoid(_confidence_logits(h, prev_ids, w1, w, b))


def confidence_block_ref(
    h: torch.Tensor,  # [B, K, H] backbone hidden states of the block
    prev_ids: torch.Tensor,  # [B, K] int64: x_{k-1} for every slot k
    w1: torch.Tensor,  # [Vt, r]
    w: torch.Tensor,  # [H + r]
    b: torch.Tensor,  # [1]
    temps: torch.Tensor,  # [K] per-slot calibration temperature
) -> torch.Tensor:
    """Every slot's c_k = sigmoid((w . [h_k ; W1[x_{k-1}]] + b) / T_k) at once -> [B, K]."""
    return torch.sigmoid(_confidence_logits(h, prev_ids, w1, w, b) / temps.float())
