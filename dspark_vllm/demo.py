"""`dspark demo`: serve the embedded target with the bundled DSpark drafter through
`vllm serve`, talk to it with the official OpenAI client, report the acceptance."""

from __future__ import annotations

import json
import shlex
import time

from .config import LOOKUP_ENV
from .drafter.config import DSparkDrafterConfig
from .hardware import preferred_dtype
from .lookup import MAX_NGRAM
from .serving import BUNDLED_DRAFTER, VllmServer, acceptance_length, metric_sum
from .target import prepare_target

QUESTIONS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did Natalia sell altogether in April and May?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give three tips for staying healthy.",
]


def run_demo(drafter: str | None = None, num_speculative_tokens: int = 5,
             adaptive: bool = True, max_tokens: int = 160, log_path: str | None = None,
             dtype: str = "auto", eager: bool = False, prompt_lookup: bool = True) -> dict:
    """Served as `vllm serve` serves by default: compiled (torch.compile; on a 2-core CPU the
    first start compiles for a few minutes, later starts reuse vLLM's cache), in bfloat16
    where the CPU computes it natively. `eager` (--enforce-eager) starts in seconds; served
    eagerly, plain decoding ran ~10% slower and DSpark 0-4% (README, "Compiled, as `vllm
    serve` runs by default"). `prompt_lookup`: prompt lookup beside the drafter where the
    drafter has its table (DSPARK_PROMPT_LOOKUP, lookup.py)."""
    from openai import OpenAI

    target = prepare_target()
    dtype = preferred_dtype(dtype)
    drafter = drafter or str(BUNDLED_DRAFTER)
    if not (BUNDLED_DRAFTER / "config.json").is_file() and drafter == str(BUNDLED_DRAFTER):
        raise FileNotFoundError(f"no bundled drafter at {BUNDLED_DRAFTER}; train one with "
                                "`dspark recipe --out runs/smollm2` and pass --drafter")
    spec = {"method": "dspark", "model": drafter,
            "num_speculative_tokens": num_speculative_tokens,
            "enable_adaptive_verification": adaptive}
    env = {}
    # Loaded through the validated config: a missing or malformed one is named here.
    if prompt_lookup and DSparkDrafterConfig.load(drafter).dspark_lookup_acceptance is not None:
        env[LOOKUP_ENV] = str(MAX_NGRAM)
    server = VllmServer(target, spec=spec, log_path=log_path, dtype=dtype, enforce_eager=eager,
                        env=env)
    print("$ " + " ".join([f"{k}={v}" for k, v in env.items()]
                          + [shlex.quote(c) for c in server.cmd]), flush=True)
    t0 = time.time()
    with server:
        print(f"server healthy after {time.time() - t0:.0f}s at {server.url}", flush=True)
        client = OpenAI(base_url=server.url + "/v1", api_key="none")
        tokens, t1 = 0, time.time()
        for q in QUESTIONS:
            print(f"\n>>> {q}\n", flush=True)
            stream = client.chat.completions.create(
                model="target", messages=[{"role": "user", "content": q}],
                max_tokens=max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True})
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    print(chunk.choices[0].delta.content, end="", flush=True)
                if chunk.usage:
                    tokens += chunk.usage.completion_tokens
            print()
        elapsed = time.time() - t1
        done = client.completions.create(model="target", prompt="def is_prime(n):",
                                         max_tokens=48, temperature=0)
        print(f"\n>>> completion API: def is_prime(n):{done.choices[0].text}")
        m = server.metrics()
    report = {
        "acceptance_length": acceptance_length(m),
        "draft_tokens": metric_sum(m, "vllm:spec_decode_num_draft_tokens_total"),
        "accepted_tokens": metric_sum(m, "vllm:spec_decode_num_accepted_tokens_total"),
        "dspark_admitted": metric_sum(m, "dspark_draft_tokens_admitted_total"),
        "dspark_dropped": metric_sum(m, "dspark_draft_tokens_dropped_total"),
        "prompt_lookup_blocks": metric_sum(m, "dspark_prompt_lookup_blocks_total"),
        "dtype": dtype, "compiled": not eager, "chat_tokens": tokens, "chat_seconds": elapsed,
        "tokens_per_second_single_user": tokens / elapsed if elapsed else None,
    }
    print("\n" + json.dumps(report, indent=2))
    return report
