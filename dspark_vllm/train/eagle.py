"""The MTP-1 baseline: a one-layer EAGLE-style head proposing one token, in the format
vLLM's `eagle` method loads (`EagleLlamaForCausalLM`: `fc` over [embed(x_{t+1}); h_t],
one Llama layer without input norm, no final norm, the target's shared LM head).

h_t is the target's final (post-norm) hidden state, exactly what vLLM's V1 runner feeds
an EAGLE-1 drafter; the feature cache stores it, so this trains from the same cache.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from ..drafter.model import RMSNorm, rope
from .cache import open_cache
from .trainer import pad_batch, train_split

log = logging.getLogger("vllm.dspark.eagle")


class EagleLayer(nn.Module):
    def __init__(self, c) -> None:
        super().__init__()
        h, nh, nkv, d = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, \
            getattr(c, "head_dim", c.hidden_size // c.num_attention_heads)
        self.nh, self.nkv, self.d = nh, nkv, d
        self.theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        self.self_attn = nn.ModuleDict(dict(
            q_proj=nn.Linear(h, nh * d, bias=False), k_proj=nn.Linear(h, nkv * d, bias=False),
            v_proj=nn.Linear(h, nkv * d, bias=False), o_proj=nn.Linear(nh * d, h, bias=False)))
        self.mlp = nn.ModuleDict(dict(
            gate_proj=nn.Linear(h, c.intermediate_size, bias=False),
            up_proj=nn.Linear(h, c.intermediate_size, bias=False),
            down_proj=nn.Linear(c.intermediate_size, h, bias=False)))
        self.post_attention_layernorm = RMSNorm(h, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # x: [B, T, H]
        b, t, _ = x.shape
        a = self.self_attn
        q = rope(a["q_proj"](x).view(b, t, self.nh, self.d), pos, self.theta)
        k = rope(a["k_proj"](x).view(b, t, self.nkv, self.d), pos, self.theta)
        v = a["v_proj"](x).view(b, t, self.nkv, self.d)
        rep = self.nh // self.nkv
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.repeat_interleave(rep, 2).transpose(1, 2),
                                           v.repeat_interleave(rep, 2).transpose(1, 2), is_causal=True)
        x = x + a["o_proj"](o.transpose(1, 2).reshape(b, t, -1))  # layer 0: no input norm
        m, hn = self.mlp, self.post_attention_layernorm(x)
        return x + m["down_proj"](F.silu(m["gate_proj"](hn)) * m["up_proj"](hn))


class EagleHead(nn.Module):
    def __init__(self, target_config, embed_weight: torch.Tensor) -> None:
        super().__init__()
        self.config = target_config
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        h = target_config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList([EagleLayer(target_config)])

    def forward(self, next_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """next_ids: [B, T] tokens x_{t+1}; hidden: [B, T, H] target h_t -> [B, T, H]."""
        x = self.fc(torch.cat([F.embedding(next_ids, self.embed_weight), hidden], -1))
        pos = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        return self.layers[0](x, pos)


def save_eagle(head: EagleHead, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    cfg = head.config.to_dict()
    cfg.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"], tie_word_embeddings=False)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous() for k, v in head.state_dict().items()},
              str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


@dataclass
class EagleConfig:
    cache: str
    out: str
    target: str = "default"
    epochs: float = 1.0  # one pass: every response position is a training example
    batch_size: int = 8
    lr: float = 6e-4
    ce: float = 0.1  # same mix as DSpark: hard labels + L1 to the target distribution
    l1: float = 0.9
    seed: int = 0
    heldout: float = 0.05
    max_steps: int | None = None


def train_eagle(cfg: EagleConfig) -> Path:
    from ..target import load_target

    target, _ = load_target(cfg.target, tokenizer=False)
    cache = open_cache(cfg.cache)
    seqs = list(train_split(cache, cfg.heldout))
    torch.manual_seed(cfg.seed)
    head = EagleHead(target.config, target.get_input_embeddings().weight)
    lm_head = target.get_output_embeddings().weight.detach()
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95))
    steps_per_epoch = max(len(seqs) // cfg.batch_size, 1)
    total = int(cfg.epochs * steps_per_epoch)
    end = total if cfg.max_steps is None else min(total, cfg.max_steps)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    state = out / "state.safetensors"
    step = 0
    if state.is_file():
        head.load_state_dict({k[6:]: v for k, v in load_file(str(state)).items() if k.startswith("model.")})
        step = json.loads((out / "state.json").read_text())["step"]
    from tqdm import tqdm

    bar, t0 = tqdm(total=end, initial=step, desc="train mtp-1"), time.time()
    while step < end:
        epoch, k = divmod(step, steps_per_epoch)
        perm = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(cfg.seed * 1000 + epoch))
        batch = pad_batch(cache, [seqs[i] for i in perm[k * cfg.batch_size:(k + 1) * cfg.batch_size]], [])
        tok, hid, lse = batch["tokens"], batch["last"], batch["lse"]
        n = tok.shape[1] - 2
        out_h = head(tok[:, 1:n + 1], hid[:, :n])  # position t predicts x_{t+2}
        pos = torch.arange(n)
        mask = (pos[None] + 2 < batch["lens"][:, None]) & (pos[None] + 1 >= batch["prompt_lens"][:, None])
        logits = out_h[mask] @ lm_head.t()  # [M, V]
        labels = tok[:, 2:n + 2][mask]
        p = torch.exp(hid[:, 1:n + 1][mask] @ lm_head.t() - lse[:, 1:n + 1][mask][:, None])
        q = torch.softmax(logits, -1)
        loss = cfg.ce * F.cross_entropy(logits, labels) + cfg.l1 * (q - p).abs().sum(-1).mean()
        for g in opt.param_groups:
            g["lr"] = cfg.lr * 0.5 * (1 + math.cos(math.pi * step / max(total, 1)))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss):.3f}", acc=f"{float((logits.argmax(-1) == labels).float().mean()):.2f}")
        if step % 100 == 0 or step == end:
            save_file({f"model.{k}": v.contiguous() for k, v in head.state_dict().items()}, str(state))
            (out / "state.json").write_text(json.dumps({"step": step, "config": asdict(cfg)}))
    bar.close()
    log.info("MTP-1 head: %d steps in %.0fs", step, time.time() - t0)
    return save_eagle(head, out / "drafter")
