"""The two prompt files of this comparison.

    python benchmarks/results/longform-1207/prompts.py OUT_DIR

weak.jsonl: the first 10 Spec-Bench first turns of writing, stem, humanities and summarization
(the categories furthest off the default mix). heldout.jsonl: 24 `longform` prompts well past
the 768 that `dspark make-data --mix longform=1 --num-prompts 768` answered (it takes them in
order, skipping those over 384 tokens; ~865 were read), so never trained on."""
import json
import sys
from pathlib import Path

from dspark_vllm import datasets

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
taken: dict[str, int] = {}
weak = []
for r in datasets.spec_bench():
    if r["category"] in ("writing", "stem", "humanities", "summarization") and taken.get(r["category"], 0) < 10:
        taken[r["category"]] = taken.get(r["category"], 0) + 1
        weak.append(r)
held = datasets.training_prompts(mix={"longform": 1.0})[1200:1224]
for name, rows in (("weak.jsonl", weak), ("heldout.jsonl", held)):
    (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
