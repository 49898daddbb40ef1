"""Exact speculative sampling (Leviathan et al.; Chen et al.), the rule DSpark verifies with.

Output is distributed exactly as the target alone would produce it, provided the number
of drafts verified (`num_verify`) is decided without looking at the drafts it admits
(a stopping time; DSpark paper, Appendix A).
"""

from __future__ import annotations

import torch


def speculative_sample(
    p: torch.Tensor,  # [B, K+1, V] target probs at each draft slot, then the bonus slot
    q: torch.Tensor,  # [B, K, V] draft probs each draft token was sampled from
    draft: torch.Tensor,  # [B, K] draft tokens
    num_verify: torch.Tensor | None = None,  # [B] drafts admitted for verification (<= K)
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (num_accepted [B], next_token [B]).

    The emitted tokens of row b are draft[b, :num_accepted[b]] followed by next_token[b].
    Greedy decoding is the temperature-0 case: pass one-hot p and q.
    """
    b, k = draft.shape
    rows = torch.arange(b, device=draft.device)
    n = torch.full((b,), k, device=draft.device) if num_verify is None else num_verify.long()
    p_x = p[:, :k].gather(-1, draft[..., None]).squeeze(-1)  # p(x_k)
    q_x = q.gather(-1, draft[..., None]).squeeze(-1)  # q(x_k) > 0: x_k was drawn from q
    u = torch.rand(b, k, generator=generator, device=draft.device)
    # q(x) <= p(x): always accept; otherwise accept with probability p(x) / q(x).
    accept = u * q_x < p_x
    # Only drafts admitted for verification can be accepted.
    accept &= torch.arange(k, device=draft.device) < n[:, None]
    # Acceptance stops at the first rejection.
    num_accepted = accept.long().cumprod(-1).sum(-1)  # [B]
    j = num_accepted
    p_j = p[rows, j]  # [B, V]: target distribution at the first unaccepted slot
    rejected = j < n
    # Rejected x_j: resample from the normalised residual max(0, p - q). The residual is
    # where p exceeds q, exactly the mass the accept test under-delivered.
    q_j = q[rows, j.clamp(max=k - 1)]
    residual = torch.where(rejected[:, None], (p_j - q_j).clamp_min(0), p_j)
    # All admitted drafts accepted: the bonus token comes from p at slot n (residual = p).
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual, p_j)  # p == q up to rounding: use p
    next_token = torch.multinomial(residual, 1, generator=generator).squeeze(-1)
    return num_accepted, next_token


def one_hot_probs(logits: torch.Tensor) -> torch.Tensor:
    """Greedy as a distribution: all mass on the argmax."""
    return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return one_hot_probs(logits) if temperature <= 0 else torch.softmax(logits.float() / temperature, -1)
