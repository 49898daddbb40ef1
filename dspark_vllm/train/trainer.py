"""`dspark train`: distil a DSpark drafter from the feature cache.

Single process by default; under `torchrun` it runs DDP (gloo on CPU, nccl on CUDA), each
rank taking a strided share of every batch. Resumable: `state/` holds the drafter, the
AdamW moments, the step and the RNG state, all as safetensors + JSON.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from ..drafter.checkpoint import load_drafter, save_drafter
from ..drafter.config import drafter_config_for_target
from ..drafter.model import DSparkDrafter, block_inputs, block_mask
from .cache import FeatureCache, open_cache
from .loss import LossWeights, dspark_loss
from .vocab import build_draft_vocab, pick_mask_token, response_counts

log = logging.getLogger("vllm.dspark.train")


@dataclass
class TrainConfig:
    cache: str | list[str]  # a feature cache directory, or several trained on as one
    out: str
    target: str = "default"
    num_layers: int = 2
    block_size: int = 7
    markov_rank: int = 64
    # "bigram": the transition head starts from the responses' bigram PMI (markov_init.py);
    # "zero": it starts as the parallel drafter. Bigram led on both seeds tried (README).
    markov_init: str = "bigram"
    draft_vocab_size: int | None = 8192
    # The mask slots' input token; None: pick_mask_token (SmolLM2: 16, <empty_output>).
    mask_token_id: int | None = None
    confidence_head: bool = True
    num_target_features: int = 5
    epochs: float = 4.0
    data_fraction: float = 1.0  # first fraction of the training sequences (data-scaling runs)
    heldout: float = 0.05  # last share of the cache: never trained on (calibration, checks)
    # Sequences per step (all ranks together). 4 beat 8 at the same compute on two
    # different quarters of the data (README); the bundled drafter was trained at 8.
    batch_size: int = 4
    anchors: int = 32  # anchor blocks sampled per sequence
    lr: float = 6e-4
    warmup: float = 0.04
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    loss: LossWeights = field(default_factory=LossWeights)
    seed: int = 0
    log_every: int = 20
    save_every: int = 200
    max_steps: int | None = None  # stop early (tests); the schedule still spans all epochs
    # A trained drafter (upstream Qwen3DSparkModel format) to continue from: its shape,
    # draft vocabulary and mask token are kept, the fields above that set them are not read.
    init_from: str | None = None

    def validate(self) -> None:
        """Refuse, by name, a setting that would train nothing or crash mid-run (a negative
        --epochs used to train one step; --data-fraction 2 ended in an IndexError)."""
        bad = []
        if not self.epochs > 0:
            bad.append(f"epochs={self.epochs}: must be > 0")
        if not 0 < self.data_fraction <= 1:
            bad.append(f"data_fraction={self.data_fraction}: must be in (0, 1]")
        if not 0 <= self.heldout < 1:
            bad.append(f"heldout={self.heldout}: must be in [0, 1)")
        if not self.lr > 0:
            bad.append(f"lr={self.lr}: must be > 0")
        if not 0 <= self.warmup < 1:
            bad.append(f"warmup={self.warmup}: a fraction of the steps in [0, 1)")
        for name in ("batch_size", "anchors", "num_layers", "block_size"):
            if getattr(self, name) < 1:
                bad.append(f"{name}={getattr(self, name)}: must be a positive integer")
        if self.markov_rank < 0:
            bad.append(f"markov_rank={self.markov_rank}: 0 (purely parallel) or a positive rank")
        if self.max_steps is not None and self.max_steps < 1:
            bad.append(f"max_steps={self.max_steps}: a positive number of steps, or none")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            bad.append(f"draft_vocab_size={self.draft_vocab_size}: a positive size, or none "
                       "for the full vocabulary")
        if self.mask_token_id is not None and self.mask_token_id < 0:
            bad.append(f"mask_token_id={self.mask_token_id}: a token id, or none to pick one")
        if self.init_from is not None and not Path(self.init_from, "config.json").is_file():
            bad.append(f"init_from={self.init_from!r}: no drafter there (a directory with "
                       "config.json and model.safetensors)")
        if self.markov_init not in ("zero", "bigram"):
            bad.append(f"markov_init={self.markov_init!r}: use 'zero' or 'bigram'")
        if bad:
            raise ValueError("; ".join(bad))


def _split(n: int, heldout: float) -> int:
    """How many of n sequences train: the last `heldout` share (at least one) is held out."""
    return n - max(int(n * heldout), 1) if heldout > 0 else n


def train_split(cache, heldout: float) -> list[int]:
    """Training sequences: each cache's (or each part of a union's) first 1 - heldout."""
    return [s + i for s, n in cache.spans() for i in range(_split(n, heldout))]


def heldout_split(cache, heldout: float) -> list[int]:
    """Held-out sequences: each cache's (or each part's) last `heldout` share."""
    return [s + i for s, n in cache.spans() for i in range(_split(n, heldout), n)]


def pad_batch(cache: FeatureCache, idxs: list[int], cols: list[int]) -> dict[str, torch.Tensor]:
    seqs = [cache.sequence(i) for i in idxs]
    t = max(len(s["tokens"]) for s in seqs)
    h = cache.info.hidden_size

    def stack(key, width=None, fill=0.0):
        out = torch.full((len(seqs), t) + ((width,) if width else ()), fill,
                         dtype=seqs[0][key].dtype)
        for r, s in enumerate(seqs):
            out[r, : len(s[key])] = s[key]
        return out

    feats = stack("feats", cache.info.feat_size).view(len(seqs), t, -1, h)[:, :, cols].flatten(2)
    return {"tokens": stack("tokens"), "feats": feats, "last": stack("last", h),
            "lse": stack("lse"), "lens": torch.tensor([len(s["tokens"]) for s in seqs]),
            "prompt_lens": torch.tensor([s["prompt_len"] for s in seqs])}


def sample_anchors(prompt_lens: torch.Tensor, lens: torch.Tensor, num: int,
                   gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchors a in [prompt_len, len-2] (a response token whose successor is too),
    `num` per sequence without replacement; keep=False marks padding when fewer exist."""
    rows, keeps = [], []
    for p, n in zip(prompt_lens.tolist(), lens.tolist()):
        cand = torch.arange(p, max(n - 1, p))
        pick = cand[torch.randperm(len(cand), generator=gen)[:num]].sort().values
        keep = torch.zeros(num, dtype=torch.bool)
        keep[: len(pick)] = True
        rows.append(torch.cat([pick, torch.zeros(num - len(pick), dtype=torch.long)]))
        keeps.append(keep)
    return torch.stack(rows), torch.stack(keeps)


def step_loss(drafter: DSparkDrafter, batch: dict, anchors: torch.Tensor, keep: torch.Tensor,
              t2d: torch.Tensor | None, lm_head_d: torch.Tensor, weights: LossWeights):
    """Forward one batch: [B, A] anchors -> loss over [B*A, G] draft slots."""
    cfg, tok = drafter.cfg, batch["tokens"]
    b, t = tok.shape
    g, a = cfg.block_size, anchors.shape[1]
    ids, pos = block_inputs(tok.gather(1, anchors), anchors, g, cfg.mask_token_id)
    mask = block_mask(anchors, t, g, keep)
    ctx_pos = torch.arange(t).expand(b, t)
    h = drafter(ids, pos, batch["feats"], ctx_pos, mask).view(b, a, g, -1)
    lab_pos = anchors[..., None] + torch.arange(1, g + 1)  # [B, A, G] positions of y_k
    valid = (lab_pos < batch["lens"][:, None, None]) & keep[..., None]
    valid = valid.int().cumprod(-1).bool()
    lab_pos = lab_pos.clamp(max=t - 1)
    labels = tok.gather(1, lab_pos.flatten(1)).view(b, a, g)
    prev = torch.cat([tok.gather(1, anchors)[..., None], labels[..., :-1]], -1)  # teacher forcing
    logits = drafter.base_logits(h)
    bias = drafter.markov_bias(prev)
    if bias is not None:
        logits = logits + bias
    src = (lab_pos - 1).flatten(1)  # the target's distribution for y_k is read at y_{k-1}
    last = batch["last"].gather(1, src[..., None].expand(-1, -1, batch["last"].shape[-1]))
    tlogp = (last @ lm_head_d.t()).view(b, a, g, -1) - batch["lse"].gather(1, src).view(b, a, g, 1)
    dlab = labels if t2d is None else t2d[labels]
    conf = drafter.confidence_logits(h, prev)
    return dspark_loss(logits.flatten(0, 1), tlogp.flatten(0, 1), dlab.flatten(0, 1),
                       valid.flatten(0, 1), None if conf is None else conf.flatten(0, 1), weights)


class Trainer:
    def __init__(self, cfg: TrainConfig) -> None:
        from ..target import load_target

        cfg.validate()
        self.cfg = cfg
        self.ddp = dist.is_available() and "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
        if self.ddp and not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        self.rank = dist.get_rank() if self.ddp else 0
        self.world = dist.get_world_size() if self.ddp else 1
        self.out = Path(cfg.out)
        self.cache = open_cache(cfg.cache)
        target, _ = load_target(cfg.target, dtype=torch.float32, tokenizer=False)
        train_seqs = train_split(self.cache, cfg.heldout)
        self.seqs = train_seqs[:int(math.ceil(len(train_seqs) * cfg.data_fraction))]
        emb, head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
        counts = response_counts(self.cache, self.seqs)
        if cfg.init_from:
            vocab = self._continue_from(cfg.init_from, target, emb, head)
        else:
            vocab = self._new_drafter(counts, target, emb, head)
        cfg = self.cfg
        self.cols = self.cache.select(self.drafter.cfg.target_layer_ids)
        self.t2d = None
        if vocab is not None:
            self.t2d = torch.full((self.drafter.cfg.vocab_size,), -1, dtype=torch.long)
            self.t2d[vocab] = torch.arange(len(vocab))
        resuming = (self._state_dir() / "state.safetensors").is_file()
        # Other ranks get the bigram start by the broadcast below; a continued drafter keeps
        # its trained transition head.
        if (cfg.markov_init == "bigram" and self.drafter.markov_head is not None
                and self.rank == 0 and not resuming and not cfg.init_from):
            self._init_markov_from_bigrams()
        if self.ddp:  # every rank starts from rank 0's weights
            for p in self.drafter.parameters():
                dist.broadcast(p.data, 0)
        self.lm_head_d = self.drafter.lm_head.detach()
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                     betas=(0.9, 0.95))
        self.steps_per_epoch = max(len(self.seqs) // cfg.batch_size, 1)
        self.total_steps = max(int(cfg.epochs * self.steps_per_epoch), 1)
        self.step = 0
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self._maybe_resume()

    def _new_drafter(self, counts, target, emb, head) -> torch.Tensor | None:
        """A fresh drafter shaped by the config; returns its draft vocabulary (or None)."""
        cfg = self.cfg
        if cfg.mask_token_id is None:
            cfg = self.cfg = replace(cfg, mask_token_id=pick_mask_token(cfg.target, counts))
            log.info("mask token %d (the tokenizer's unused special token)", cfg.mask_token_id)
        vocab, d2t = None, None
        if cfg.draft_vocab_size:
            vocab, cov = build_draft_vocab(counts, cfg.draft_vocab_size,
                                           keep=(cfg.mask_token_id,))
            d2t = vocab - torch.arange(len(vocab))
            log.info("draft vocabulary %d covers %.2f%% of response tokens", len(vocab), 100 * cov)
        dcfg = drafter_config_for_target(
            target.config, num_layers=cfg.num_layers, block_size=cfg.block_size,
            markov_rank=cfg.markov_rank, draft_vocab_size=cfg.draft_vocab_size,
            mask_token_id=cfg.mask_token_id, num_target_features=cfg.num_target_features,
            enable_confidence_head=cfg.confidence_head)
        torch.manual_seed(cfg.seed)
        self.drafter = DSparkDrafter(dcfg, emb, head, d2t=d2t)
        return vocab

    def _continue_from(self, path, target, emb, head) -> torch.Tensor | None:
        """A trained drafter, checked against the target (hidden size, vocabulary, layer
        ids) as the server checks it; its calibration is dropped (it no longer applies to
        the weights this run will write; run `dspark calibrate` after)."""
        torch.manual_seed(self.cfg.seed)
        self.drafter = load_drafter(path, emb, head,
                                    target_num_layers=target.config.num_hidden_layers)
        dcfg = self.drafter.cfg
        dcfg.dspark_confidence_temperatures = None
        self.cfg = replace(self.cfg, num_layers=dcfg.num_hidden_layers, block_size=dcfg.block_size,
                           markov_rank=dcfg.markov_rank, mask_token_id=dcfg.mask_token_id,
                           draft_vocab_size=dcfg.draft_vocab_size if dcfg.uses_reduced_vocab else None,
                           confidence_head=dcfg.enable_confidence_head)
        log.info("continuing from %s (%d layers, rank %d, draft vocabulary %s)", path,
                 dcfg.num_hidden_layers, dcfg.markov_rank, self.cfg.draft_vocab_size)
        if self.drafter.d2t is None:
            return None
        return torch.arange(len(self.drafter.d2t)) + self.drafter.d2t

    def _init_markov_from_bigrams(self) -> None:
        from .markov_init import pmi_factors, response_bigrams

        t0, head = time.time(), self.drafter.markov_head
        prev, nxt = response_bigrams(self.cache, self.seqs)
        w1, w2 = pmi_factors(prev, nxt, self.t2d, head.markov_w1.num_embeddings,
                             head.markov_w2.out_features, head.markov_w2.in_features, self.cfg.seed)
        with torch.no_grad():
            head.markov_w1.weight.copy_(w1)
            head.markov_w2.weight.copy_(w2)
        log.info("transition head initialised from %d response bigrams in %.1f s", len(prev),
                 time.time() - t0)

    # ------------------------------------------------------------------ schedule
    def lr_at(self, step: int) -> float:
        warm = max(int(self.cfg.warmup * self.total_steps), 1)
        if step < warm:
            return self.cfg.lr * (step + 1) / warm
        frac = (step - warm) / max(self.total_steps - warm, 1)
        return self.cfg.lr * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))

    def batch_indices(self, step: int) -> list[int]:
        epoch, k = divmod(step, self.steps_per_epoch)
        perm = torch.randperm(len(self.seqs), generator=torch.Generator().manual_seed(
            self.cfg.seed * 1000 + epoch)).tolist()
        chunk = perm[k * self.cfg.batch_size:(k + 1) * self.cfg.batch_size]
        return [self.seqs[i] for i in chunk[self.rank::self.world]]

    # ------------------------------------------------------------------ state
    def _state_dir(self) -> Path:
        return self.out / "state"

    def save_state(self) -> None:
        if self.rank != 0:
            return
        d = self._state_dir()
        d.mkdir(parents=True, exist_ok=True)
        tensors = {f"model.{k}": v.contiguous() for k, v in self.drafter.state_dict().items()}
        names = {id(p): n for n, p in self.drafter.named_parameters()}
        for group in self.opt.param_groups:
            for p in group["params"]:
                for k, v in self.opt.state.get(p, {}).items():
                    tensors[f"opt.{names[id(p)]}.{k}"] = torch.as_tensor(v).contiguous()
        tensors["rng"] = self.gen.get_state()
        save_file(tensors, str(d / "state.tmp.safetensors"))
        (d / "state.tmp.safetensors").rename(d / "state.safetensors")
        (d / "meta.json").write_text(json.dumps({"step": self.step, "config": asdict(self.cfg)},
                                                default=str))

    def _maybe_resume(self) -> None:
        path = self._state_dir() / "state.safetensors"
        if not path.is_file():
            return
        tensors = load_file(str(path))
        meta = json.loads((self._state_dir() / "meta.json").read_text())
        self.drafter.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        for n, p in self.drafter.named_parameters():
            st = {k.rsplit(".", 1)[1]: v for k, v in tensors.items()
                  if k.startswith(f"opt.{n}.") and k.count(".") == n.count(".") + 2}
            if st:
                self.opt.state[p] = st
        self.gen.set_state(tensors["rng"])
        self.step = meta["step"]
        log.info("resumed from %s at step %d", path, self.step)

    # ------------------------------------------------------------------ loop
    def train(self) -> Path:
        cfg, t0, tokens = self.cfg, time.time(), 0
        end = self.total_steps if cfg.max_steps is None else min(cfg.max_steps, self.total_steps)
        log_path = self.out / "train_log.jsonl"
        self.out.mkdir(parents=True, exist_ok=True)
        try:
            from tqdm import tqdm
            bar = tqdm(total=end, initial=self.step, desc="train", disable=self.rank != 0)
        except ImportError:  # pragma: no cover
            bar = None
        while self.step < end:
            idxs = self.batch_indices(self.step)
            batch = pad_batch(self.cache, idxs, self.cols)
            anchors, keep = sample_anchors(batch["prompt_lens"], batch["lens"], cfg.anchors, self.gen)
            for g in self.opt.param_groups:
                g["lr"] = self.lr_at(self.step)
            loss, m = step_loss(self.drafter, batch, anchors, keep, self.t2d, self.lm_head_d,
                                cfg.loss)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            if self.ddp:
                self._all_reduce_grads()
            gnorm = torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), cfg.max_grad_norm)
            self.opt.step()
            self.step += 1
            tokens += int(keep.sum()) * cfg.block_size
            if bar:
                bar.update(1)
                bar.set_postfix(loss=f"{float(m['loss']):.3f}", tau=f"{float(m['tau_expected']):.2f}")
            if self.rank == 0 and (self.step % cfg.log_every == 0 or self.step == end):
                rec = {"step": self.step, "lr": self.lr_at(self.step - 1), "grad_norm": float(gnorm),
                       "slots_per_s": tokens / (time.time() - t0),
                       **{k: (v.tolist() if v.ndim else float(v)) for k, v in m.items()}}
                with open(log_path, "a") as f:
                    f.write(json.dumps(rec) + "\n")
            if self.step % cfg.save_every == 0 or self.step == end:
                self.save_state()
        if bar:
            bar.close()
        final = self.out / "drafter"
        if self.rank == 0:
            save_drafter(self.drafter, final)
        if self.ddp:
            dist.barrier()
        return final

    def _all_reduce_grads(self) -> None:
        """Data parallel: average gradients over ranks in one flat all-reduce."""
        grads = [p.grad for p in self.drafter.parameters() if p.grad is not None]
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat)
        flat /= self.world
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))


def train(cfg: TrainConfig) -> Path:
    return Trainer(cfg).train()
