"""Scratch (2026-12-06): each step-trace file (DSPARK_STEP_TRACE) of one directory, by step kind at batch >= 14 (argv[2]):
model ms a step, the engine gap between steps, tokens a step and tokens per cycle-second. Usage: python steps_by_kind.py TRACE_DIR [MIN_BATCH]"""
import json, sys, glob, collections, statistics as st
for f in sorted(glob.glob(sys.argv[1] + "/*.jsonl")):
    rows = [json.loads(l) for l in open(f)]
    name = "adaptive" if any("source" in r for r in rows) else ("k2" if any(r["slots"] for r in rows) else "plain")
    lo = int(sys.argv[2]) if len(sys.argv) > 2 else 14
    # cycle gaps: between consecutive steps' ends minus this step's model seconds
    agg = collections.defaultdict(lambda: [0, 0.0, 0, 0.0, 0])
    for prev, r in zip(rows, rows[1:]):
        if r["batch"] < lo: continue
        gap = r["t"] - prev["t"] - r["seconds"]
        if gap > 0.05: continue  # idle
        kind = ("prefill" if r["prefill"] else "decode") + ("+draft" if r["slots"] else "") + ("+verify" if r["verified"] else "")
        a = agg[kind]; a[0] += 1; a[1] += r["seconds"]; a[2] += r["generated"]; a[3] += gap; a[4] += r["tokens"]
    tot = [sum(a[i] for a in agg.values()) for i in range(5)]
    print(f"== {name} {f.split('/')[-1]}: steps {tot[0]} model {tot[1]:.1f}s gaps {tot[3]:.2f}s tok {tot[2]} -> {tot[2]/(tot[1]+tot[3]):.1f} tok/cycle-s")
    for k, (n, s, g, gap, tk) in sorted(agg.items()):
        print(f"   {k:22s} steps {n:5d} model ms {1e3*s/n:6.1f} gap ms {1e3*gap/n:5.2f} sched tok {tk/n:6.1f} gen tok/step {g/n:5.2f} tok/cycle-s {g/(s+gap):6.1f}")
