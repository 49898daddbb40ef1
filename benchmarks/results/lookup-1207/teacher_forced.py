"""Teacher-forced records for rules.py (T = 0, 64 new tokens, the bundled drafter).

    python benchmarks/results/lookup-1207/teacher_forced.py table runs/q/cache OUT/table.json.gz
    python benchmarks/results/lookup-1207/teacher_forced.py rec DRAFTER spec_bench 4 OUT/records-spec_bench.json.gz
    python benchmarks/results/lookup-1207/teacher_forced.py rec DRAFTER humaneval 8 OUT/records-humaneval.json.gz
    python benchmarks/results/lookup-1207/teacher_forced.py rec DRAFTER gsm8k 8 OUT/records-gsm8k.json.gz

`table`: at every answer position of the cache's held-out greedy answers, per exact match
length n = 1..6, the lookup block's length and accepted tokens. `rec`: the target's greedy
answer to each prompt, one target pass for the drafter's features, then at every answer
position the drafter's greedy block (accepted drafts, expected length from its confidences)
and the lookup blocks as above. Accepted = the prefix matching the answer's continuation.
"""
import gzip
import json
import sys

import numpy as np
import torch

from dspark_vllm import lookup
from dspark_vllm.datasets import encode_chat, load_eval_set
from dspark_vllm.drafter.drafting import propose
from dspark_vllm.evaluate import load_pair

G = 7


def lookup_each(tokens, k, max_n=6):
    """Per exact n = 1..max_n: the block after the latest earlier occurrence of the n-gram
    suffix (empty where there is none), by the package's own match."""
    out = []
    for n in range(1, max_n + 1):
        got, start = lookup.match(tokens, n)
        out.append(tokens[start:start + k] if got == n else tokens[:0])
    return out


def prefix(d, truth) -> int:
    n = 0
    for x, y in zip(d, truth):
        if x != y:
            break
        n += 1
    return n


def table(cache_dir: str, out: str) -> None:
    from dspark_vllm.train.cache import open_cache
    from dspark_vllm.train.trainer import heldout_split
    cache = open_cache(cache_dir)
    rec = []
    for i in heldout_split(cache, 0.05):
        if cache.info.temperatures[i] != 0.0:
            continue
        s = cache.sequence(i)
        tok, P = s["tokens"].numpy(), s["prompt_len"]
        for a in range(P, len(tok) - 1):
            each = lookup_each(tok[:a + 1], G)
            truth = tok[a + 1:a + 1 + G].tolist()
            rec.append([(len(lk), prefix(lk.tolist(), truth)) for lk in each])
    json.dump(rec, gzip.open(out, "wt"))


@torch.no_grad()
def records(drafter_dir: str, data: str, n_prompts: int, out: str, new: int = 64) -> None:
    target, tok, adapter = load_pair("default", drafter_dir)
    prompts = load_eval_set(data, per_category=n_prompts if data == "spec_bench" else None,
                            limit=None if data == "spec_bench" else n_prompts)
    rows = []
    for pi, p in enumerate(prompts):
        ids = encode_chat(tok, p["messages"])
        o = target.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False)
        resp = o[0, len(ids):].tolist()
        if tok.eos_token_id in resp:
            resp = resp[:resp.index(tok.eos_token_id) + 1]
        seq = ids + resp
        feats = adapter.features(target(torch.tensor([seq]), output_hidden_states=True).hidden_states)
        arr = np.array(seq)
        P = len(ids)
        for j in range(len(resp) - 1):
            a = P + j
            truth = seq[a + 1:a + 1 + G]
            d = propose(adapter.drafter, feats[:, :a], torch.tensor([seq[a]]), 0.0, None, G)
            c = d.confidence[0].double()
            ed = float(torch.cumprod(c, 0).sum())
            each = lookup_each(arr[:a + 1], G)
            rows.append((p["category"], pi, j, prefix(d.tokens[0].tolist(), truth), ed,
                         [(len(lk), prefix(lk.tolist(), truth)) for lk in each]))
        print(p["category"], len(rows), flush=True)
    json.dump(rows, gzip.open(out, "wt"))


if __name__ == "__main__":
    if sys.argv[1] == "table":
        table(sys.argv[2], sys.argv[3])
    else:
        records(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
