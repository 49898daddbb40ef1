"""Helpers for the engine tests: drafters, prompt mixes, concurrent OpenAI clients."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from dspark_vllm.serving import BUNDLED_DRAFTER


def drafter_for_tests(tmp_dir: Path) -> Path:
    """The bundled trained drafter when present, else a random-weight one (same format)."""
    if (BUNDLED_DRAFTER / "config.json").is_file():
        return BUNDLED_DRAFTER
    from dspark_vllm.drafter.checkpoint import save_drafter
    from dspark_vllm.drafter.config import drafter_config_for_target
    from dspark_vllm.drafter.model import DSparkDrafter
    from dspark_vllm.target import load_target

    target, _ = load_target(tokenizer=False)
    torch.manual_seed(0)
    cfg = drafter_config_for_target(target.config, mask_token_id=16, draft_vocab_size=8192)
    d = DSparkDrafter(cfg, target.get_input_embeddings().weight,
                      target.get_output_embeddings().weight, d2t=torch.zeros(8192, dtype=torch.long))
    torch.nn.init.normal_(d.markov_head.markov_w2.weight, std=0.02)
    return save_drafter(d, tmp_dir / "random-drafter")


def prompt_mix(n_spec: int = 40, n_code: int = 12) -> list[list[dict]]:
    """Chat prompts: Spec-Bench (first turns, spread over categories) + HumanEval."""
    from dspark_vllm.datasets import humaneval, load_eval_set

    spec = load_eval_set("spec_bench", per_category=max(n_spec // 13, 1) + 1)[:n_spec]
    return [p["messages"] for p in spec] + [p["messages"] for p in humaneval()[:n_code]]


def output_lengths(n: int) -> list[int]:
    """Greedy max_tokens of n prompts: 8 to 63, different from prompt to prompt."""
    return [8 + (7 * i) % 56 for i in range(n)]


def ramp(n: int) -> list[tuple[int, range]]:
    """A concurrency ramp over n prompts: (concurrency, the prompts sent at it)."""
    return [(1, range(0, 6)), (4, range(6, 22)), (8, range(22, n))]


def chat_all(url: str, prompts: list[list[dict]], max_tokens, concurrency: int = 8,
             **kw) -> list[list[int]]:
    """Token ids of each completion (greedy unless kw says otherwise), order preserved."""
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    mts = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)

    def one(i):
        r = client.chat.completions.create(
            model="target", messages=prompts[i], max_tokens=mts[i],
            temperature=kw.get("temperature", 0.0), stop=kw.get("stop"),
            extra_body={"return_token_ids": True, **kw.get("extra", {})})
        return r.choices[0].token_ids

    with ThreadPoolExecutor(concurrency) as ex:
        return list(ex.map(one, range(len(prompts))))
