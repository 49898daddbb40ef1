"""`dspark eval-acceptance`: target + drafter with the reference implementation.

Each round: the drafter proposes gamma tokens after the anchor (the last emitted token);
the target scores [anchor, drafts] in one pass; exact speculative sampling accepts a
prefix and emits one more token (correction or bonus). τ = tokens emitted per round.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from . import lookup
from .datasets import encode_chat, load_eval_set
from .drafter.drafting import propose
from .spec_sampling import speculative_sample, target_probs


@dataclass
class EvalConfig:
    drafter: str
    target: str = "default"
    data: str = "gsm8k"
    temperature: float = 0.0
    max_new_tokens: int = 128
    limit: int | None = None
    per_category: int | None = None
    block_size: int | None = None
    seed: int = 0
    dtype: str = "float32"
    # Prompt lookup beside the drafter (lookup.py): per round, the block expected to be
    # accepted further, by the drafter's confidences and the drafter's lookup table.
    prompt_lookup: bool = False


def target_features(hidden_states: tuple[torch.Tensor, ...], layer_ids: list[int]) -> torch.Tensor:
    """Concatenate the outputs of `layer_ids` (HF hidden_states[i + 1])."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


class DSparkAdapter:
    """The reference DSpark drafter: context = concatenated target layers; with
    `prompt_lookup`, the lookup block instead of the drafter's where it is expected to be
    accepted further (lookup.py)."""

    def __init__(self, drafter, prompt_lookup: bool = False) -> None:
        self.drafter, self.block = drafter, drafter.cfg.block_size
        self.table = self.sampled_table = None
        if prompt_lookup:
            if drafter.confidence_head is None or drafter.cfg.dspark_lookup_acceptance is None:
                raise ValueError(
                    "prompt lookup needs a drafter with a confidence head and a lookup table "
                    "(dspark_lookup_acceptance in its config.json: `dspark calibrate "
                    "--lookup-only --drafter DIR --cache CACHE` measures it)")
            self.table = drafter.cfg.dspark_lookup_acceptance
            self.sampled_table = drafter.cfg.dspark_lookup_acceptance_sampled
        self.lookup_rounds = 0  # rounds that verified the lookup block
        # [V] bool: the target ids the drafter can propose (its reduced draft vocabulary);
        # None when it drafts over the whole vocabulary.
        self.proposable = None
        if drafter.d2t is not None:
            ids = drafter.draft_to_target(torch.arange(len(drafter.d2t)))
            self.proposable = torch.zeros(drafter.cfg.vocab_size, dtype=torch.bool)
            self.proposable[ids] = True

    def features(self, hidden_states) -> torch.Tensor:
        return target_features(hidden_states, self.drafter.cfg.target_layer_ids)

    def propose(self, feats, tokens, anchor, t, gen, num_slots):
        d = propose(self.drafter, feats, anchor, t, gen, num_slots=num_slots,
                    greedy_confidence=self.table is not None)
        drafts, q = d.tokens, self.drafter.to_target_probs(d.probs)  # [1, g], [1, g, V]
        if self.table is not None:  # tokens: the context up to the anchor
            drafts, q = drafts.clone(), q.clone()
            self.lookup_rounds += lookup.splice_block(drafts, d.confidence, q,
                                                      [np.asarray(tokens)], self.table,
                                                      decide=d.greedy_confidence,
                                                      sampled_rows=[t > 0],
                                                      sampled_table=self.sampled_table)
        return drafts, q


class EagleAdapter:
    """The MTP-1 baseline: one token from the EAGLE head over [embed(x_{t+1}); h_t]."""

    def __init__(self, head, lm_head: torch.Tensor) -> None:
        self.head, self.lm_head, self.block = head, lm_head, 1
        self.proposable = None  # drafts over the whole vocabulary

    def features(self, hidden_states) -> torch.Tensor:
        return hidden_states[-1]  # the final post-norm hidden state

    def propose(self, feats, tokens, anchor, t, gen, num_slots):
        ids = torch.tensor([tokens[1:]])  # x_1 .. x_T (the anchor is the last)
        logits = (self.head(ids, feats)[:, -1] @ self.lm_head.t()).float()  # [1, V]
        q = target_probs(logits, t)
        tok = torch.multinomial(q, 1, generator=gen)  # [1, 1]
        return tok, q[:, None]


class SpecDecoder:
    """One prompt at a time: greedy (temperature 0) or sampled exact speculative decoding."""

    def __init__(self, target, adapter, eos_ids: set[int], temperature: float, block: int,
                 generator: torch.Generator) -> None:
        self.target, self.adapter, self.eos = target, adapter, eos_ids
        self.t, self.block, self.gen = temperature, block, generator

    def _sample(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(probs, 1, generator=self.gen).squeeze(-1)

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> dict:
        from transformers import DynamicCache

        cache = DynamicCache()
        ids = torch.tensor([prompt_ids])
        out = self.target(ids, past_key_values=cache, output_hidden_states=True, use_cache=True)
        feats = self.adapter.features(out.hidden_states)  # [1, T, F]
        anchor = self._sample(target_probs(out.logits[0, -1:], self.t))  # [1]
        tokens = list(prompt_ids) + [int(anchor)]  # everything up to the anchor
        emitted = [int(anchor)]
        rounds, accepted_at, reached_at = 0, [0] * self.block, [0] * self.block
        while len(emitted) < max_new_tokens and emitted[-1] not in self.eos:
            drafts, q = self.adapter.propose(feats, tokens, anchor, self.t, self.gen, self.block)
            block = torch.cat([anchor[:, None], drafts], 1)  # [1, 1 + g]
            out = self.target(block, past_key_values=cache, output_hidden_states=True,
                              use_cache=True)
            p = target_probs(out.logits[0], self.t)[None]  # [1, g + 1, V]
            n_acc, nxt = speculative_sample(p, q, drafts, generator=self.gen)
            n = int(n_acc)
            for k in range(min(n + 1, self.block)):
                reached_at[k] += 1
                accepted_at[k] += k < n
            rounds += 1
            # Keep the target's state for the anchor and the accepted drafts only.
            if n < drafts.shape[1]:
                cache.crop(-(drafts.shape[1] - n))
            feats = torch.cat([feats, self.adapter.features(out.hidden_states)[:, :1 + n]], 1)
            new = drafts[0, :n].tolist() + [int(nxt)]
            tokens += new
            for tok in new:  # stop exactly at EOS / the token budget, like a server would
                if len(emitted) >= max_new_tokens or emitted[-1] in self.eos:
                    break
                emitted.append(tok)
            anchor = nxt.view(1)
        # Emitted tokens the drafter could never have proposed: a draft stops at each one,
        # whatever the drafter learned (the cap a reduced draft vocabulary puts on tau).
        can = self.adapter.proposable
        outside = 0 if can is None else int((~can[torch.tensor(emitted)]).sum())
        return {"tokens": emitted, "rounds": rounds, "accepted_at": accepted_at,
                "reached_at": reached_at, "outside_vocab": outside}


def _random_drafter(target):
    from .drafter.config import drafter_config_for_target
    from .drafter.model import DSparkDrafter

    torch.manual_seed(0)
    cfg = drafter_config_for_target(target.config, mask_token_id=0)
    emb = target.get_input_embeddings().weight
    return DSparkDrafter(cfg, emb, target.get_output_embeddings().weight).eval()


def load_pair(target_path: str, drafter_path: str, dtype: torch.dtype = torch.float32,
              prompt_lookup: bool = False):
    """(target, tokenizer, adapter) for a DSpark drafter, an MTP-1 head or 'random'."""
    import json
    from pathlib import Path

    from .drafter.checkpoint import load_drafter
    from .drafter.config import DrafterConfigError
    from .target import load_target

    target, tok = load_target(target_path, dtype=dtype)
    emb, head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    if drafter_path == "random":
        return target, tok, DSparkAdapter(_random_drafter(target).to(dtype), prompt_lookup)
    cfg_path = Path(drafter_path) / "config.json"
    archs = []
    if cfg_path.is_file():
        try:
            archs = json.loads(cfg_path.read_text()).get("architectures", [])
        except (json.JSONDecodeError, AttributeError) as e:
            raise DrafterConfigError(f"{cfg_path}: not a valid drafter config ({e})") from None
    if "LlamaForCausalLM" in archs:
        from safetensors.torch import load_file

        from .train.eagle import EagleHead

        eagle = EagleHead(target.config, emb)
        eagle.load_state_dict(load_file(str(Path(drafter_path) / "model.safetensors")))
        if prompt_lookup:
            raise ValueError(f"{drafter_path}: an MTP-1 head; prompt lookup goes beside a "
                             "DSpark drafter (its confidences choose between the two)")
        return target, tok, EagleAdapter(eagle.to(dtype).eval(), head)
    drafter = load_drafter(drafter_path, emb, head,
                           target_num_layers=target.config.num_hidden_layers, dtype=dtype)
    return target, tok, DSparkAdapter(drafter.eval(), prompt_lookup)


def evaluate(cfg: EvalConfig) -> dict:
    from tqdm import tqdm

    if cfg.max_new_tokens < 1 or cfg.temperature < 0:
        raise ValueError(f"max_new_tokens={cfg.max_new_tokens}, temperature={cfg.temperature}: "
                         "need max_new_tokens >= 1 and temperature >= 0")
    # A bad --data, --limit or --per-category is named before the models load.
    prompts = load_eval_set(cfg.data, limit=cfg.limit, per_category=cfg.per_category, seed=cfg.seed)
    dtype = getattr(torch, cfg.dtype)
    target, tok, adapter = load_pair(cfg.target, cfg.drafter, dtype, cfg.prompt_lookup)
    block = cfg.block_size or adapter.block
    if not 1 <= block <= adapter.block:
        raise ValueError(f"--block-size {block}: must be in 1..{adapter.block} "
                         "(the drafter's trained block)")
    gen_eos = getattr(target.generation_config, "eos_token_id", None)
    eos = {tok.eos_token_id} | set(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    gen = torch.Generator().manual_seed(cfg.seed)
    dec = SpecDecoder(target, adapter, {e for e in eos if e is not None}, cfg.temperature,
                      block, gen)
    cats: dict[str, dict] = {}
    t0 = time.time()
    for p in tqdm(prompts, desc="eval-acceptance", unit="prompt"):
        looked = getattr(adapter, "lookup_rounds", 0)
        r = dec.generate(encode_chat(tok, p["messages"]), cfg.max_new_tokens)
        c = cats.setdefault(p["category"], {"prompts": 0, "rounds": 0, "tokens": 0,
                                            "lookup_rounds": 0,
                                            "outside_vocab": 0, "accepted_at": [0] * block,
                                            "reached_at": [0] * block})
        c["prompts"] += 1
        c["outside_vocab"] += r["outside_vocab"]
        c["rounds"] += r["rounds"]
        c["lookup_rounds"] += getattr(adapter, "lookup_rounds", 0) - looked
        c["tokens"] += len(r["tokens"])
        c["accepted_at"] = [a + b for a, b in zip(c["accepted_at"], r["accepted_at"])]
        c["reached_at"] = [a + b for a, b in zip(c["reached_at"], r["reached_at"])]
    return summarize(cats, cfg, time.time() - t0, block)


def _tau(c: dict) -> float:
    # Tokens per round = accepted drafts + 1, from the raw counters (truncation at EOS or
    # the budget does not lower it).
    return 1.0 + sum(c["accepted_at"]) / max(c["rounds"], 1)


def summarize(cats: dict, cfg: EvalConfig, wall: float, block: int) -> dict:
    per_cat = {}
    for name, c in sorted(cats.items()):
        per_cat[name] = {
            "tau": _tau(c), "prompts": c["prompts"], "rounds": c["rounds"],
            "lookup_rounds": c["lookup_rounds"],
            "outside_vocab": c["outside_vocab"] / max(c["tokens"], 1),
            "accept_rate": [a / r if r else None for a, r in zip(c["accepted_at"], c["reached_at"])],
        }
    tokens = sum(c["tokens"] for c in cats.values())
    total = {"rounds": sum(c["rounds"] for c in cats.values()),
             "lookup_rounds": sum(c["lookup_rounds"] for c in cats.values()),
             "accepted_at": [sum(c["accepted_at"][k] for c in cats.values()) for k in range(block)],
             "reached_at": [sum(c["reached_at"][k] for c in cats.values()) for k in range(block)]}
    return {
        "config": asdict(cfg),
        "block": block,
        "tau": _tau(total),
        "tau_macro": sum(v["tau"] for v in per_cat.values()) / max(len(per_cat), 1),
        "accept_rate": [a / r if r else None for a, r in zip(total["accepted_at"], total["reached_at"])],
        "per_category": per_cat,
        "wall_seconds": wall,
        "tokens_generated": tokens,
        # Share of the target's tokens outside the drafter's vocabulary (0 for a full one).
        "outside_vocab": sum(c["outside_vocab"] for c in cats.values()) / max(tokens, 1),
        "lookup_share": total["lookup_rounds"] / max(total["rounds"], 1),
    }


def format_report(r: dict) -> str:
    lines = [f"tau {r['tau']:.3f} (macro over {len(r['per_category'])} categories "
             f"{r['tau_macro']:.3f}), block {r['block']}, temperature "
             f"{r['config']['temperature']}, {r['wall_seconds']:.0f}s, "
             f"{r['tokens_generated']} tokens"]
    rate = " ".join("-" if a is None else f"{a:.2f}" for a in r["accept_rate"])
    lines.append(f"per-position acceptance (conditional): {rate}")
    lines.append(f"target tokens outside the draft vocabulary: {100 * r['outside_vocab']:.1f}%")
    if r["config"].get("prompt_lookup"):
        lines.append(f"rounds that verified the prompt-lookup block: {100 * r['lookup_share']:.1f}%")
    for name, c in r["per_category"].items():
        lines.append(f"  {name:16s} tau {c['tau']:.3f}  prompts {c['prompts']:4d}  rounds "
                     f"{c['rounds']}  outside vocabulary {100 * c['outside_vocab']:.1f}%"
                     + (f"  lookup {c['lookup_rounds']}" if r["config"].get("prompt_lookup") else ""))
    return "\n".join(lines)
