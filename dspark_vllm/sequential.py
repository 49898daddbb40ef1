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
    conf_head = model.model.confidence_head
    if temperature is None and not want_probs:  # every row greedy, no distribution wanted
        return _greedy_block(model, h, base, anchor, w1, w2, conf_head, conf_temps)
    cols = _draft_to_target_columns(model, base.shape[-1], h.device)
    t = torch.zeros(b, device=h.device) if temperature is None else \
        torch.where(temperature < GREEDY_EPS, 0.0, temperature.float())
    # A fresh random stream per step and request; greedy rows ignore it.
    seed = torch.randint(0, 2**62, (b,), device=h.device)
    if positions is None:
        positions = torch.arange(k, device=h.device).expand(b, k)
    prev = anchor
    tokens, probs, confs = [], [], []
    for i in range(k):
        if conf_head is not None:  # reads x_{i-1} (prev), never x_i
            confs.append(_confidence(conf_head, h[:, i], prev, w1, conf_temps[i]))
        # Fused rescoring: U_i + W1[x_{i-1}] W2^T, then argmax / Gumbel-max (kernels/).
        d, _, _, q = kernels.transition_step(base[:, i], prev, w1, w2, t, seed,
                                             positions[:, i].long(), want_probs=want_probs)
        if want_probs:
            probs.append(q if cols is None else
                         q.new_zeros(b, target_vocab_size).index_copy_(1, cols, q))
        prev = model.map_draft_to_target(d)
        tokens.append(prev)
    return SampledBlock(
        tokens=torch.stack(tokens, 1),
        probs=torch.stack(probs, 1) if probs else None,
        confidence=torch.stack(confs, 1) if confs else None,
    )


def _greedy_block(model, h, base, anchor, w1, w2, conf_head, conf_temps) -> SampledBlock:
    """An all-greedy block: only the argmax walks left to right; the confidences, each
    reading x_{k-1} as in the general loop, are computed for every slot at once after it.
    Same tokens and confidences as the general path, fewer small ops per slot: at one
    request on a CPU the general loop took ~3 ms of a ~50 ms step, this one ~2 ms (README,
    the draft pass in-process)."""
    import kernels

    k = h.shape[1]
    prev, tokens = anchor, []
    for i in range(k):
        prev = model.map_draft_to_target(kernels.transition_argmax(base[:, i], prev, w1, w2))
        tokens.append(prev)
    out = torch.stack(tokens, 1)  # [B, K]
    conf = None
    if conf_head is not None:
        prevs = torch.cat([anchor[:, None], out[:, :-1]], 1)  # [B, K]: x_{k-1} of slot k
        w = conf_head.proj.weight
        if conf_head.with_markov and w.numel() == h.shape[-1] + w1.shape[1]:
            conf = kernels.confidence_block(h, prevs, w1, w.view(-1), conf_head.proj.bias.view(-1),
                                            conf_temps[:k])
        else:  # repacked weights: the module, slot by slot
            conf = torch.stack([_confidence(conf_head, h[:, i], prevs[:, i], w1, conf_temps[i])
                                for i in range(k)], 1)
    return SampledBlock(tokens=out, probs=None, confidence=conf)


def _confidence(head, h: torch.Tensor, prev: torch.Tensor, w1: torch.Tensor,
                temp: torch.Tensor) -> torch.Tensor:
    """sigmoid((w^T [h; W1[prev]] + b) / T); the calibration temperature folds into w, b."""
    w = head.proj.weight
    if head.with_markov and w.numel() == h.shape[-1] + w1.shape[1]:
        import kernels

        return kernels.confidence(h, prev, w1, w.view(-1) / temp, head.proj.bias.view(-1) / temp)
    # vLLM may repack linear weights for its CPU GEMM (leaving `weight` empty): use the module.
    return torch.sigmoid(head(h, w1[prev]).float() / temp)
