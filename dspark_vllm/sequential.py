"""The sequential stage on vLLM's drafter module: walk a drafted block left to right.

p_k ∝ exp((U_k + W1[x_{k-1}] W2^T) / t), one step of memory; the confidence of slot k reads
x_{k-1} (never x_k), which is what keeps the budget policy on the safe side of the
causality wall.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .block_graph import BlockGraphs

GREEDY_EPS = 1e-5  # vLLM's sampler treats temperatures below this as greedy


@dataclass
class SampledBlock:
    tokens: torch.Tensor  # [B, K] target-vocabulary ids
    probs: torch.Tensor | None  # [B, K, V_target] draft distribution (probabilistic drafting)
    confidence: torch.Tensor | None  # [B, K] calibrated sigmoid of the confidence head
    # [B, K] the greedy chain's confidences when asked (`greedy_confidence`): they read no
    # sampled token, so prompt lookup's choice made on them keeps sampling exact (lookup.py).
    greedy_confidence: torch.Tensor | None = None


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
    graphs: BlockGraphs | None = None,  # replay the walk from CUDA graphs where it can
    greedy_confidence: bool = False,  # also the greedy chain's confidences (prompt lookup)
) -> SampledBlock:
    b, k, _ = h.shape
    base = model.compute_draft_logits(h.flatten(0, 1)).view(b, k, -1)  # [B, K, Vd]
    greedy = temperature is None and not want_probs  # every row greedy, no distribution wanted
    inputs = dict(base=base, anchor=anchor, h=h)
    if not greedy:
        inputs["t"] = torch.zeros(b, device=h.device) if temperature is None else \
            torch.where(temperature < GREEDY_EPS, 0.0, temperature.float())
        # A fresh random stream per step and request; greedy rows ignore it.
        inputs["seed"] = torch.randint(0, 2**62, (b,), device=h.device)
        inputs["positions"] = (torch.arange(k, device=h.device).expand(b, k)
                               if positions is None else positions).long()

    def walk(**x):
        return _walk(model, conf_temps[:k], want_probs, target_vocab_size, **x)

    if graphs is None:
        tokens, probs, conf = walk(**inputs)
    else:
        head = model.model.markov_head
        key = (k, greedy, want_probs, target_vocab_size, base.shape[-1], h.shape[-1],
               head.markov_w1.weight.data_ptr(), head.markov_w2.weight.data_ptr(),
               conf_temps.data_ptr())  # the graph reads these tensors where they lie
        tokens, probs, conf = graphs.run(key, inputs, walk)
    gconf = None
    if greedy_confidence:  # a sampled block's own confidences read its tokens: walk greedily
        gconf = conf if greedy else _walk(model, conf_temps[:k], False, target_vocab_size,
                                          base=base, anchor=anchor, h=h)[2]
    return SampledBlock(tokens=tokens, probs=probs, confidence=conf, greedy_confidence=gconf)


def _walk(model, conf_temps: torch.Tensor, want_probs: bool, target_vocab_size: int, *,
          base: torch.Tensor,  # [B, K, Vd] draft logits U
          anchor: torch.Tensor,  # [B] target id of x_0
          h: torch.Tensor,  # [B, K, H]
          t: torch.Tensor | None = None,  # [B] f32, 0 = greedy row; None = all greedy
          seed: torch.Tensor | None = None,  # [B] int64
          positions: torch.Tensor | None = None,  # [B, K] int64
          ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The block's K steps left to right -> tokens [B, K], probs [B, K, Vt] | None,
    confidence [B, K] | None. Tensor work only, no host sync: block_graph captures it."""
    import kernels

    b, k, vd = base.shape
    head = model.model.markov_head
    w1, w2 = head.markov_w1.weight, head.markov_w2.weight  # [V, r], [Vd, r]
    if t is not None:
        cols = _draft_to_target_columns(model, vd, base.device)
        slot_positions = positions.t().contiguous()  # [K, B]: one dense row per step
    prev = anchor
    tokens, probs = [], []
    for i in range(k):
        # Fused rescoring: U_i + W1[x_{i-1}] W2^T, then argmax / Gumbel-max (kernels/). An
        # all-greedy block needs the token alone, not the log-normaliser and noise.
        if t is None:
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
        conf = _confidences(model.model.confidence_head, h, prevs, w1, conf_temps)
    return out, torch.stack(probs, 1) if probs else None, conf


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
