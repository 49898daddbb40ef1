"""Scratch (2026-12-06): the budget server's drafted decode steps binned by the gate pool's mean first-slot survival; the pool mean's expected
accepted tokens a request over its verified slots against the realised ones. Usage: python pool_mean_vs_realised.py TRACE_DIR..."""
import json, sys, collections, glob
bins = collections.defaultdict(lambda: [0, 0.0, 0.0, 0])
for d in sys.argv[1:]:
  for f in glob.glob(d + "/*.jsonl"):
    rows = [json.loads(l) for l in open(f)]
    for r in rows:
        if r["prefill"] or not r.get("mean") or not r["verified"]: continue
        b = r["batch"]; v = r["verified"] / b
        m = r["mean"]; k = round(v)
        exp = sum(m[:k])
        acc = (r["generated"] - b) / b
        key = min(int(m[0] * 10), 9)
        x = bins[key]; x[0] += 1; x[1] += exp; x[2] += acc; x[3] += v
for k in sorted(bins):
    n, e, a, v = bins[k]
    print(f"mean1 {k/10:.1f}-{(k+1)/10:.1f} steps {n:5d} verified/req {v/n:4.2f} expected acc/req {e/n:4.2f} realised {a/n:4.2f}")
