"""Save / load drafters as `Qwen3DSparkModel` directories (safetensors only).

Weight names are the ones DeepSpec writes and upstream vLLM's `Qwen3DSparkForCausalLM`
reads: `fc`, `hidden_norm`, `layers.*`, `norm`, `markov_head.markov_w1/markov_w2`,
`confidence_head.proj`, plus `lm_head` and `d2t` for a reduced draft vocabulary. The
shared embedding and full LM head are never stored.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .config import DrafterConfigError, DSparkDrafterConfig
from .model import DSparkDrafter

WEIGHTS_FILE = "model.safetensors"


def expected_shapes(cfg: DSparkDrafterConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of this config must hold, with its shape."""
    h, d, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    nh, nkv, vd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.output_vocab_size
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, cfg.context_feature_size),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (nh * d, h),
            p + "self_attn.k_proj.weight": (nkv * d, h),
            p + "self_attn.v_proj.weight": (nkv * d, h),
            p + "self_attn.o_proj.weight": (h, nh * d),
            p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (f, h),
            p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
        })
    if cfg.markov_rank:
        shapes["markov_head.markov_w1.weight"] = (cfg.vocab_size, cfg.markov_rank)
        shapes["markov_head.markov_w2.weight"] = (vd, cfg.markov_rank)
    if cfg.enable_confidence_head:
        extra = cfg.markov_rank if cfg.confidence_head_with_markov else 0
        shapes["confidence_head.proj.weight"] = (1, h + extra)
        shapes["confidence_head.proj.bias"] = (1,)
    if cfg.uses_reduced_vocab:
        shapes["lm_head.weight"] = (vd, h)
        shapes["d2t"] = (vd,)
    return shapes


def save_drafter(drafter: DSparkDrafter, directory: str | Path,
                 dtype: torch.dtype = torch.bfloat16) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in drafter.state_dict().items():
        if name == "lm_head":
            name = "lm_head.weight"
        # Integer maps stay integer; the confidence head is tiny and kept in fp32 (vLLM
        # holds it in fp32 too); everything else is stored in `dtype`.
        keep = not t.is_floating_point() or name.startswith("confidence_head")
        tensors[name] = (t if keep else t.to(dtype)).contiguous()
    want = expected_shapes(drafter.cfg)
    if set(tensors) != set(want):
        raise RuntimeError(f"drafter state {sorted(set(tensors) ^ set(want))} "
                           "does not match the checkpoint format")
    drafter.cfg.save(directory)
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    return directory


def _weight_files(directory: Path) -> list[Path]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in directory.glob("*.bin")) + \
            sorted(p.name for p in directory.glob("*.pt"))
        hint = f" (found {pickles}: pickled weights are never loaded, convert to " \
               "safetensors)" if pickles else ""
        raise DrafterConfigError(f"{directory}: no *.safetensors weights{hint}")
    return files


def read_checkpoint_shapes(directory: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes from the safetensors headers (no data is read)."""
    shapes = {}
    for path in _weight_files(Path(directory)):
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        except (SafetensorError, OSError, ValueError) as e:
            raise DrafterConfigError(f"{path}: not a readable safetensors file ({e})") from None
    return shapes


def check_checkpoint(directory: str | Path, cfg: DSparkDrafterConfig) -> None:
    """Every expected tensor present with the right shape; extra names only if known."""
    have = read_checkpoint_shapes(directory)
    want = expected_shapes(cfg)
    # Upstream exports may carry the shared embedding / LM head and a training-only t2d.
    optional = {"embed_tokens.weight", "lm_head.weight", "t2d", "mask_embedding"}
    problems = [f"missing {n}{list(s)}" for n, s in want.items() if n not in have]
    problems += [f"{n} is {list(have[n])}, expected {list(s)}"
                 for n, s in want.items() if n in have and have[n] != s]
    problems += [f"unexpected {n}" for n in have if n not in want and n not in optional]
    if problems:
        raise DrafterConfigError(f"{directory}: checkpoint does not match its config.json: "
                                 + "; ".join(problems[:8])
                                 + (f" (+{len(problems) - 8} more)" if len(problems) > 8 else ""))


def load_drafter(directory: str | Path, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                 *, target_num_layers: int, dtype: torch.dtype = torch.float32) -> DSparkDrafter:
    """Load a drafter for a target given its embedding, LM head and depth."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DrafterConfigError(f"drafter directory {str(directory)!r} does not exist")
    cfg = DSparkDrafterConfig.load(directory)
    cfg.check_target(hidden_size=embed_weight.shape[1], vocab_size=embed_weight.shape[0],
                     num_hidden_layers=target_num_layers)
    check_checkpoint(directory, cfg)
    state = {}
    for path in _weight_files(directory):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                state[name] = f.get_tensor(name)
    d2t = state.get("d2t")
    drafter = DSparkDrafter(cfg, embed_weight, lm_head_weight, d2t=d2t)
    if cfg.uses_reduced_vocab:
        state["lm_head"] = state.pop("lm_head.weight")
    else:
        state.pop("lm_head.weight", None)
    for name in ("embed_tokens.weight", "t2d", "mask_embedding"):
        state.pop(name, None)
    drafter.load_state_dict(state, strict=True)
    return drafter.to(dtype)
