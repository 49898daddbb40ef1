"""The one validated description of a DSpark drafter.

It maps 1:1 onto the `config.json` of a `Qwen3DSparkModel` checkpoint, the format
DeepSeek's DeepSpec exports and upstream vLLM's `qwen3_dspark.py` reads, so a drafter
trained here serves upstream and vice versa.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ARCHITECTURE = "Qwen3DSparkModel"
MARKOV_HEAD_TYPES = ("vanilla",)


class DrafterConfigError(ValueError):
    """A drafter config (or checkpoint) that cannot be used, with the reason."""


@dataclass
class DSparkDrafterConfig:
    # --- draft backbone (Qwen3-style decoder layers) ---
    hidden_size: int
    """Width of the draft layers; equals the target's hidden size (shared embeddings)."""
    intermediate_size: int
    num_hidden_layers: int
    """Number of draft decoder layers (the paper's default drafter has 2)."""
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    """Target vocabulary size: input embeddings and the transition table W1 use it."""
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 8192
    hidden_act: str = "silu"

    # --- DSpark ---
    block_size: int = 7
    """gamma: draft slots per round (anchor + gamma-1 masks give gamma drafts)."""
    mask_token_id: int = 0
    """Token whose (shared, frozen) embedding fills the gamma-1 masked slots."""
    target_layer_ids: list[int] = field(default_factory=list)
    """Target layers whose outputs are concatenated as context (DFlash semantics:
    id i is the output of decoder layer i, HF `hidden_states[i + 1]`)."""
    num_target_layers: int = 0
    target_hidden_size: int = 0
    markov_rank: int = 256
    """Rank r of the transition head B(x, .) = W1[x] W2; 0 gives a purely parallel drafter."""
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True
    """Confidence reads [h_k ; W1[x_{k-1}]] (the paper) rather than h_k alone."""
    draft_vocab_size: int | None = None
    """Reduced output vocabulary (needs `lm_head` and a `d2t` map in the weights)."""
    dspark_confidence_temperatures: list[float] | None = None
    """Sequential Temperature Scaling: c_k = sigmoid(z_k / T_k), one T per position
    (written by `dspark calibrate`; upstream vLLM ignores the key)."""
    dspark_lookup_acceptance: list[list[float]] | None = None
    """Prompt lookup's acceptance table (lookup.py): row n - 1, slot j = acceptance at slot j
    given slots < j accepted, for a longest match of n tokens (written by `dspark calibrate`;
    upstream vLLM ignores the key)."""
    dspark_lookup_acceptance_sampled: list[list[float]] | None = None
    """The same measured on answers sampled at temperature > 0 (read for requests that
    sample; absent: prompt lookup only for greedy requests)."""

    def __post_init__(self) -> None:
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        if not self.target_hidden_size:
            self.target_hidden_size = self.hidden_size
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        def bad(name: str, why: str) -> DrafterConfigError:
            return DrafterConfigError(f"{name}={getattr(self, name)!r}: {why}")

        for name in ("hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "vocab_size", "block_size"):
            if int(getattr(self, name)) <= 0:
                raise bad(name, "must be a positive integer")
        if self.num_attention_heads % self.num_key_value_heads:
            raise bad("num_key_value_heads",
                      f"must divide num_attention_heads={self.num_attention_heads}")
        if self.markov_rank < 0:
            raise bad("markov_rank", "must be >= 0 (0 turns the transition head off)")
        if self.markov_rank and self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise bad("markov_head_type", f"supported: {MARKOV_HEAD_TYPES}")
        if self.confidence_head_with_markov and self.enable_confidence_head \
                and self.markov_rank == 0:
            raise bad("confidence_head_with_markov",
                      "needs a transition head (markov_rank > 0); set it to false")
        if not self.target_layer_ids:
            raise bad("target_layer_ids", "must list at least one target layer")
        if sorted(set(self.target_layer_ids)) != self.target_layer_ids:
            raise bad("target_layer_ids", "must be unique and strictly increasing")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise bad("mask_token_id", f"must be a token id in [0, {self.vocab_size})")
        temps = self.dspark_confidence_temperatures
        if temps is not None and (len(temps) != self.block_size or min(temps) <= 0):
            raise bad("dspark_confidence_temperatures",
                      f"needs {self.block_size} positive temperatures (one per position)")
        for key in ("dspark_lookup_acceptance", "dspark_lookup_acceptance_sampled"):
            table = getattr(self, key)
            if table is not None and not (
                    isinstance(table, list) and table
                    and all(isinstance(r, list) and len(r) == self.block_size for r in table)
                    and all(isinstance(x, (int, float)) and 0 <= x <= 1
                            for r in table for x in r)):
                raise bad(key, f"needs one row per match length (at least one), each "
                          f"{self.block_size} acceptance rates in [0, 1]; run `dspark "
                          "calibrate --lookup-only` to measure it")
        if self.draft_vocab_size is not None and not \
                0 < self.draft_vocab_size <= self.vocab_size:
            raise bad("draft_vocab_size", f"must be in (0, vocab_size={self.vocab_size}]")

    def check_target(self, *, hidden_size: int, vocab_size: int,
                     num_hidden_layers: int, source: str = "target") -> None:
        """Raise a DrafterConfigError naming every way this drafter does not fit."""
        problems = []
        if self.target_hidden_size != hidden_size:
            problems.append(f"target_hidden_size={self.target_hidden_size} but the "
                            f"{source} has hidden_size={hidden_size}")
        if self.hidden_size != hidden_size:
            problems.append(f"hidden_size={self.hidden_size} but the {source} embeddings "
                            f"are {hidden_size} wide (they are shared)")
        if self.vocab_size != vocab_size:
            problems.append(f"vocab_size={self.vocab_size} but the {source} has "
                            f"vocab_size={vocab_size}")
        bad_ids = [i for i in self.target_layer_ids if not 0 <= i <= num_hidden_layers - 2]
        if bad_ids:
            problems.append(f"target_layer_ids {bad_ids} out of range: the {source} has "
                            f"{num_hidden_layers} layers, usable ids are "
                            f"0..{num_hidden_layers - 2}")
        if self.num_target_layers and self.num_target_layers != num_hidden_layers:
            problems.append(f"num_target_layers={self.num_target_layers} but the {source} "
                            f"has {num_hidden_layers} layers")
        if problems:
            raise DrafterConfigError("drafter does not match the target: "
                                     + "; ".join(problems))

    # --------------------------------------------------------------- derived
    @property
    def output_vocab_size(self) -> int:
        return self.draft_vocab_size or self.vocab_size

    @property
    def uses_reduced_vocab(self) -> bool:
        return self.output_vocab_size < self.vocab_size

    @property
    def context_feature_size(self) -> int:
        return self.target_hidden_size * len(self.target_layer_ids)

    # ------------------------------------------------------------------ json
    def to_hf_dict(self) -> dict[str, Any]:
        """config.json contents that both HF `Qwen3Config` and vLLM accept."""
        d = dataclasses.asdict(self)
        for key in ("draft_vocab_size", "dspark_confidence_temperatures",
                    "dspark_lookup_acceptance", "dspark_lookup_acceptance_sampled"):
            if d[key] is None:
                del d[key]
        d.update(
            architectures=[ARCHITECTURE],
            model_type="qwen3",
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            tie_word_embeddings=False,
            attention_bias=False,
            attention_dropout=0.0,
            layer_types=["full_attention"] * self.num_hidden_layers,
            use_sliding_window=False,
            torch_dtype="bfloat16",
        )
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config") -> DSparkDrafterConfig:
        archs = d.get("architectures") or []
        if ARCHITECTURE not in archs:
            raise DrafterConfigError(
                f"{source}: architectures={archs!r}; a DSpark drafter needs "
                f"[{ARCHITECTURE!r}]")
        rope = d.get("rope_parameters") or {}
        kwargs = {f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d}
        kwargs.setdefault("rope_theta", rope.get("rope_theta", 1_000_000.0))
        kwargs.setdefault("head_dim", d["hidden_size"] // d["num_attention_heads"])
        missing = [n for n in ("hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "num_key_value_heads", "vocab_size",
                               "target_layer_ids", "mask_token_id") if n not in d]
        if missing:
            raise DrafterConfigError(f"{source}: missing keys {missing}")
        # Upstream checkpoints without the keys default to a plain vanilla drafter.
        kwargs.setdefault("markov_rank", 0)
        kwargs.setdefault("enable_confidence_head", False)
        kwargs.setdefault("confidence_head_with_markov", False)
        try:
            return cls(**kwargs)
        except DrafterConfigError as e:
            raise DrafterConfigError(f"{source}: {e}") from None

    def save(self, directory: str | Path) -> None:
        path = Path(directory) / "config.json"
        path.write_text(json.dumps(self.to_hf_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> DSparkDrafterConfig:
        path = Path(directory) / "config.json"
        if not path.is_file():
            raise DrafterConfigError(f"{path}: missing (is {directory} a drafter directory?)")
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise DrafterConfigError(f"{path}: not valid JSON ({e})") from None
        return cls.from_hf_dict(d, source=str(path))


def default_target_layer_ids(num_target_layers: int, count: int = 5) -> list[int]:
    """Spread `count` layers evenly from layer 1 to the third-to-last layer, as the
    paper does ([1, 9, 17, 25, 33] over Qwen3-4B's 36 layers)."""
    last = num_target_layers - 3
    if count == 1:
        return [last]
    step = (last - 1) / (count - 1)
    return sorted({round(1 + i * step) for i in range(count)})


def drafter_config_for_target(target_cfg: Any, *, num_layers: int = 2, block_size: int = 7,
                              markov_rank: int = 64, draft_vocab_size: int | None = None,
                              mask_token_id: int, num_target_features: int = 5,
                              enable_confidence_head: bool = True) -> DSparkDrafterConfig:
    """A drafter shaped like the target's own layers (HF config of the target). Configs
    without Llama's field names (GPT-2's n_inner, layer_norm_epsilon, n_positions) get the
    nearest equivalent: the drafter is its own Qwen3-style stack either way."""
    heads = target_cfg.num_attention_heads

    def first(*names, default):
        return next((getattr(target_cfg, n) for n in names
                     if getattr(target_cfg, n, None) is not None), default)
    return DSparkDrafterConfig(
        hidden_size=target_cfg.hidden_size,
        intermediate_size=first("intermediate_size", "n_inner",
                                default=4 * target_cfg.hidden_size),
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(target_cfg, "num_key_value_heads", heads),
        head_dim=getattr(target_cfg, "head_dim", None) or target_cfg.hidden_size // heads,
        vocab_size=target_cfg.vocab_size,
        rms_norm_eps=first("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps",
                           default=1e-6),
        max_position_embeddings=first("max_position_embeddings", "n_positions",
                                      default=4096),
        rope_theta=(getattr(target_cfg, "rope_parameters", None) or {}).get(
            "rope_theta", getattr(target_cfg, "rope_theta", 10000.0)),
        block_size=block_size,
        mask_token_id=mask_token_id,
        target_layer_ids=default_target_layer_ids(target_cfg.num_hidden_layers,
                                                  num_target_features),
        num_target_layers=target_cfg.num_hidden_layers,
        target_hidden_size=target_cfg.hidden_size,
        markov_rank=markov_rank,
        enable_confidence_head=enable_confidence_head,
        confidence_head_with_markov=enable_confidence_head and markov_rank > 0,
        draft_vocab_size=draft_vocab_size,
    )
