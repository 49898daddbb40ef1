"""Held-out greedy survival sum of any drafter, with or without a confidence head.

1 + sum over k of the rate at which the first k greedy drafts all match the target's greedy
tokens, over the cache's held-out blocks (the same blocks and anchors `dspark calibrate`
reads; `collect_greedy` also takes the parallel drafters, which have no confidence head).

    python benchmarks/results/rank-1207/survival.py CACHE NAME=DRAFTER_DIR [...] > survival.json
"""
import json
import sys

from dspark_vllm.drafter.checkpoint import load_drafter
from dspark_vllm.target import load_target
from dspark_vllm.train.cache import open_cache
from dspark_vllm.train.calibrate import collect_greedy
from dspark_vllm.train.trainer import TrainConfig, heldout_split

cache_dir, specs = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
target, _ = load_target("default", tokenizer=False)
cache = open_cache(cache_dir)
out = {}
for name, path in specs.items():
    d = load_drafter(path, target.get_input_embeddings().weight,
                     target.get_output_embeddings().weight,
                     target_num_layers=target.config.num_hidden_layers).eval()
    cols = cache.select(d.cfg.target_layer_ids)
    _, acc = collect_greedy(d, cache, list(heldout_split(cache, TrainConfig.heldout)), cols, None)
    rate = acc.mean(0).tolist()
    out[name] = {"blocks": len(acc), "survival_sum": 1 + sum(rate), "acceptance_rate_at": rate}
    print(name, json.dumps(out[name]), file=sys.stderr, flush=True)
print(json.dumps(out, indent=2))
