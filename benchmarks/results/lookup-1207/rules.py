"""Tau of the drafter, prompt lookup and the expected-length rule, from teacher-forced records.

    python benchmarks/results/lookup-1207/rules.py DIR   (DIR: teacher_forced.py's outputs)

Every record is one answer position: the drafter's accepted drafts there (greedy), its
expected accepted length (the survival sum of its calibrated confidences), and for each exact
match length n = 1..6 the lookup block's length and accepted drafts. tau per answer = the
greedy round walk (anchor, accept a, jump a + 1); per category the mean over answers.
"""
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

K, MAX_N, PRIOR = 7, 6, 5.0  # lookup.MAX_NGRAM and lookup.TABLE_PRIOR


def longest(each, max_n=MAX_N):
    return max([n + 1 for n in range(max_n) if each[n][0] > 0], default=0)


def table(rows):
    """lookup.measure_table's rule on (length, accepted) per n records."""
    hits, trials = np.zeros((MAX_N, K)), np.zeros((MAX_N, K))
    for each in rows:
        n = longest(each)
        if not n:
            continue
        length, acc = each[n - 1]
        for j in range(length):
            trials[n - 1, j] += 1
            if acc <= j:
                break
            hits[n - 1, j] += 1
    return hits / (trials + PRIOR)


def walk(acc):
    j = rounds = toks = 0
    while j < len(acc):
        rounds, toks, j = rounds + 1, toks + acc[j] + 1, j + acc[j] + 1
    return toks / max(rounds, 1)


def main(d: Path) -> None:
    T = table(json.load(gzip.open(d / "table.json.gz")))
    el = lambda n, m: float(np.cumprod(np.r_[T[n - 1][:m], np.zeros(K - m)]).sum())  # noqa
    rules = {
        "drafter": lambda nd, ed, n, L, A: nd,
        "lookup alone": lambda nd, ed, n, L, A: A,
        "expected-length rule": lambda nd, ed, n, L, A: A if n and el(n, L) > ed else nd,
        "better of the two (oracle)": lambda nd, ed, n, L, A: max(nd, A),
    }
    out = ["| set | category | " + " | ".join(rules) + " | lookup's first token right | "
           "drafter's first token right |", "|---|---|" + "---|" * (len(rules) + 2)]
    for name in ("spec_bench", "humaneval", "gsm8k"):
        recs = json.load(gzip.open(d / f"records-{name}.json.gz"))
        by = defaultdict(lambda: defaultdict(list))
        for cat, p, j, nd, ed, each in recs:
            n = longest(each)
            L, A = each[n - 1] if n else (0, 0)
            by[cat][p].append((nd, ed, n, L, A))
        taus = defaultdict(dict)
        for cat, ps in sorted(by.items()):
            flat = [x for p in ps.values() for x in p]
            cells = [np.mean([walk([r(*x) for x in p]) for p in ps.values()]) for r in rules.values()]
            taus[cat] = cells
            out.append(f"| {name} | {cat} | " + " | ".join(f"{c:.2f}" for c in cells)
                       + f" | {np.mean([x[4] > 0 for x in flat]):.2f} | "
                       f"{np.mean([x[0] > 0 for x in flat]):.2f} |")
        if len(taus) > 1:
            macro = np.mean(list(taus.values()), axis=0)
            out.append(f"| {name} | **macro** | " + " | ".join(f"**{c:.2f}**" for c in macro)
                       + " | | |")
    print("\n".join(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
