"""Prefix caching under DSpark: the trailing cached block kept (the plugin's setting) or
dropped (vLLM's setting for EAGLE-like drafters, `DSPARK_EAGLE_BLOCK_DROP=1`), in-process.

    python -m benchmarks.prefix_cache          # both settings, each in its own process

Each setting: one `vllm.LLM` (DSpark, K = 5, bundled drafter) answers the prompts longer
than one 128-token CPU cache block (HumanEval and Spec-Bench first turns) greedily, twice.
Prints one JSON line per pass: prompt tokens queried and served from cache, drafts proposed
and accepted, and whether the second pass reproduced the first token for token.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:spec_decode_num_drafts",
            "vllm:spec_decode_num_accepted_tokens")


def measure(max_tokens: int) -> list[dict]:
    from vllm import SamplingParams

    from benchmarks.engine_profile import in_process_llm
    from dspark_vllm.datasets import encode_chat, humaneval, load_eval_set
    from dspark_vllm.serving import BUNDLED_DRAFTER

    spec = {"method": "dspark", "model": str(BUNDLED_DRAFTER), "num_speculative_tokens": 5}
    llm = in_process_llm(spec, max_num_seqs=8, disable_log_stats=False)
    tok = llm.get_tokenizer()
    chats = [p["messages"] for p in humaneval()[:6]] + \
        [p["messages"] for p in load_eval_set("spec_bench", per_category=1)[:10]]
    prompts = [ids for ids in (encode_chat(tok, m) for m in chats) if len(ids) > 140][:10]
    params = SamplingParams(temperature=0, max_tokens=max_tokens)

    def counters() -> dict[str, float]:
        return {m.name: m.value for m in llm.get_metrics() if m.name in COUNTERS}

    rows, outs = [], []
    for rep in range(2):
        before = counters()
        res = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        after = counters()
        rows.append({"pass": rep, **{k.split(":")[1]: after[k] - before.get(k, 0) for k in after}})
        outs.append([list(o.outputs[0].token_ids) for o in res])
    rows[1]["same_outputs_as_first_pass"] = outs[0] == outs[1]
    rows[0]["prompt_lengths"] = [len(p) for p in prompts]
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=("keep", "drop"), default=None,
                   help="measure one setting in this process (default: both, in subprocesses)")
    p.add_argument("--max-tokens", type=int, default=48)
    args = p.parse_args(argv)
    if args.setting:
        for row in measure(args.max_tokens):
            print(json.dumps({"setting": args.setting, **row}), flush=True)
        return
    for setting in ("keep", "drop"):
        env = {**os.environ, "DSPARK_EAGLE_BLOCK_DROP": "1" if setting == "drop" else "0"}
        out = subprocess.run([sys.executable, "-m", "benchmarks.prefix_cache", "--setting", setting,
                              "--max-tokens", str(args.max_tokens)], env=env, check=True,
                             capture_output=True, text=True).stdout
        print("".join(line + "\n" for line in out.splitlines() if line.startswith("{")), end="")


if __name__ == "__main__":
    main()
