"""Reference DSpark drafter in plain PyTorch: the source of truth.

Layout (paper, DeepSpec, upstream vLLM agree):
  * context: target hidden states of several layers at the already-verified positions,
    concatenated -> fc -> hidden_norm, then used as extra keys/values in every draft layer
    (k_norm(k_proj(c)), v_proj(c); no input layernorm);
  * block: gamma slots at positions anchor_pos .. anchor_pos+gamma-1 holding
    [anchor, mask, ..., mask]; attention is bidirectional inside the block and sees the
    context strictly before the anchor. Slot k predicts the token at anchor_pos + k + 1
    (anchor-as-first-prediction: gamma slots give gamma drafts);
  * heads: shared (frozen) target LM head gives base logits U_k; the transition head adds
    B(x_{k-1}, .) = W1[x_{k-1}] W2^T; the confidence head is sigmoid(w^T [h_k; W1[x_{k-1}]] + b).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import DSparkDrafterConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding. x: [B, N, heads, d], pos: [B, N]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[..., None] * inv_freq  # [B, N, d/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, :, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated * sin).to(x.dtype)


class DraftAttention(nn.Module):
    def __init__(self, cfg: DSparkDrafterConfig) -> None:
        super().__init__()
        h, nh, nkv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.nh, self.nkv, self.d, self.theta = nh, nkv, d, cfg.rope_theta
        self.q_proj = nn.Linear(h, nh * d, bias=False)
        self.k_proj = nn.Linear(h, nkv * d, bias=False)
        self.v_proj = nn.Linear(h, nkv * d, bias=False)
        self.o_proj = nn.Linear(nh * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.nkv, self.d))
        v = self.v_proj(x).view(b, n, self.nkv, self.d)
        return rope(k, pos, self.theta), v

    def forward(
        self,
        x: torch.Tensor,  # [B, Q, H] block hidden (after input layernorm)
        pos: torch.Tensor,  # [B, Q]
        ctx: torch.Tensor,  # [B, T, H] normalised context (fc + hidden_norm)
        ctx_pos: torch.Tensor,  # [B, T]
        mask: torch.Tensor,  # [B, Q, T + Q] bool, True = may attend
    ) -> torch.Tensor:
        b, q_len, _ = x.shape
        q = rope(self.q_norm(self.q_proj(x).view(b, q_len, self.nh, self.d)), pos, self.theta)
        k_ctx, v_ctx = self.kv(ctx, ctx_pos)
        k_blk, v_blk = self.kv(x, pos)
        k = torch.cat([k_ctx, k_blk], 1).repeat_interleave(self.nh // self.nkv, dim=2)
        v = torch.cat([v_ctx, v_blk], 1).repeat_interleave(self.nh // self.nkv, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None]
        )  # [B, heads, Q, d]
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, self.nh * self.d))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DSparkDrafterConfig) -> None:
        super().__init__()
        self.self_attn = DraftAttention(cfg)
        self.mlp = nn.ModuleDict(dict(
            gate_proj=nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False),
            up_proj=nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False),
            down_proj=nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False),
        ))
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, pos, ctx, ctx_pos, mask):
        x = x + self.self_attn(self.input_layernorm(x), pos, ctx, ctx_pos, mask)
        h = self.post_attention_layernorm(x)
        m = self.mlp
        return x + m["down_proj"](F.silu(m["gate_proj"](h)) * m["up_proj"](h))


class MarkovHead(nn.Module):
    """Low-rank transition bias B(x, .) = W1[x] W2^T (W1: V x r over target ids,
    W2: V_draft x r)."""

    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)
        nn.init.normal_(self.markov_w1.weight, std=0.02)
        nn.init.zeros_(self.markov_w2.weight)  # starts as the parallel drafter

    def embed(self, prev_ids: torch.Tensor) -> torch.Tensor:
        return self.markov_w1(prev_ids)  # [..., r]

    def bias(self, prev_ids: torch.Tensor) -> torch.Tensor:
        return self.markov_w2(self.embed(prev_ids))  # [..., V_draft]


class ConfidenceHead(nn.Module):
    def __init__(self, input_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_dim, 1, bias=True)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features.float()).squeeze(-1)  # logits


class DSparkDrafter(nn.Module):
    """Trainable drafter parameters; the target's embedding and LM head are shared
    (frozen, never saved unless the output vocabulary is reduced)."""

    def __init__(self, cfg: DSparkDrafterConfig, embed_weight: torch.Tensor,
                 lm_head_weight: torch.Tensor, d2t: torch.Tensor | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        if embed_weight.shape != (cfg.vocab_size, h):
            raise ValueError(f"target embedding is {tuple(embed_weight.shape)}, the drafter "
                             f"needs ({cfg.vocab_size}, {h})")
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        self.fc = nn.Linear(cfg.context_feature_size, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        vd = cfg.output_vocab_size
        if cfg.uses_reduced_vocab:
            if d2t is None or d2t.shape != (vd,):
                raise ValueError(f"a reduced vocabulary of {vd} needs a d2t map of shape ({vd},)")
            # d2t holds offsets, as in EAGLE-3/vLLM: target_id = draft_id + d2t[draft_id].
            self.register_buffer("d2t", d2t.long().clone())
            ids = torch.arange(vd) + self.d2t
            self.lm_head = nn.Parameter(lm_head_weight.detach()[ids].clone(), requires_grad=False)
        else:
            self.register_buffer("d2t", None)
            self.register_buffer("lm_head", lm_head_weight.detach(), persistent=False)
        self.markov_head = (MarkovHead(cfg.vocab_size, vd, cfg.markov_rank)
                            if cfg.markov_rank else None)
        self.confidence_head = None
        if cfg.enable_confidence_head:
            extra = cfg.markov_rank if cfg.confidence_head_with_markov else 0
            self.confidence_head = ConfidenceHead(h + extra)

    # ------------------------------------------------------------ vocabulary
    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]

    def to_target_probs(self, q: torch.Tensor) -> torch.Tensor:
        """[..., V_draft] draft-space probabilities -> [..., V] target space (0 elsewhere)."""
        if self.d2t is None:
            return q
        out = q.new_zeros(*q.shape[:-1], self.cfg.vocab_size)
        return out.index_copy_(-1, torch.arange(q.shape[-1], device=q.device) + self.d2t, q)

    # ------------------------------------------------------------- backbone
    def forward(
        self,
        block_ids: torch.Tensor,  # [B, Q] target token ids (anchor / mask)
        block_pos: torch.Tensor,  # [B, Q]
        ctx_feats: torch.Tensor,  # [B, T, n_layers * target_hidden]
        ctx_pos: torch.Tensor,  # [B, T]
        mask: torch.Tensor,  # [B, Q, T + Q] bool
    ) -> torch.Tensor:
        """Backbone hidden states h: [B, Q, H] (after the final norm)."""
        ctx = self.hidden_norm(self.fc(ctx_feats.to(self.fc.weight.dtype)))
        x = F.embedding(block_ids, self.embed_weight).to(self.fc.weight.dtype)
        for layer in self.layers:
            x = layer(x, block_pos, ctx, ctx_pos, mask)
        return self.norm(x)

    def base_logits(self, h: torch.Tensor) -> torch.Tensor:
        """U: [..., V_draft]."""
        return h @ self.lm_head.to(h.dtype).t()

    def markov_bias(self, prev_ids: torch.Tensor) -> torch.Tensor | None:
        return None if self.markov_head is None else self.markov_head.bias(prev_ids)

    def confidence_logits(self, h: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor | None:
        if self.confidence_head is None:
            return None
        feats = h
        if self.cfg.confidence_head_with_markov:
            feats = torch.cat([h, self.markov_head.embed(prev_ids).to(h.dtype)], -1)
        return self.confidence_head(feats)


def block_mask(anchor_pos: torch.Tensor, ctx_len: int, block_size: int,
               keep: torch.Tensor | None = None) -> torch.Tensor:
    """Attention mask for A blocks per sequence.

    anchor_pos: [B, A]. Returns [B, A*block, ctx_len + A*block] bool: a block slot sees
    context positions < its anchor, and every slot of its own block (bidirectional).
    """
    b, a = anchor_pos.shape
    q_block = torch.arange(a * block_size, device=anchor_pos.device) // block_size  # [Q]
    ctx_ok = torch.arange(ctx_len, device=anchor_pos.device)[None, None, :] < \
        anchor_pos.repeat_interleave(block_size, 1)[:, :, None]  # [B, Q, T]
    blk_ok = (q_block[:, None] == q_block[None, :]).expand(b, -1, -1)  # [B, Q, Q]
    if keep is not None:
        # Dummy blocks see only themselves (no empty softmax rows); their loss is masked.
        ctx_ok = ctx_ok & keep.repeat_interleave(block_size, 1)[:, :, None]
    mask = torch.cat([ctx_ok, blk_ok], -1)
    return mask


def block_inputs(anchor_ids: torch.Tensor, anchor_pos: torch.Tensor, block_size: int,
                 mask_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, A] anchors -> block ids [B, A*block] = [anchor, mask...] and positions."""
    b, a = anchor_ids.shape
    ids = torch.full((b, a, block_size), mask_token_id, dtype=torch.long, device=anchor_ids.device)
    ids[:, :, 0] = anchor_ids
    pos = anchor_pos[:, :, None] + torch.arange(block_size, device=anchor_pos.device)
    return ids.view(b, -1), pos.view(b, -1)
