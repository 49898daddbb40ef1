"""Offline acceptance tables: tau per category and per-position acceptance, for every
drafter, at temperature 0 and 1 (reference implementation, exact speculative sampling).

    python -m benchmarks.offline_acceptance --out benchmarks/results/acceptance [--quick]
        [--drafter NAME=DIR ...] [--prompt-lookup NAME ...]

Defaults to the bundled DSpark drafter plus the ablations and MTP-1 under runs/smollm2/.
Writes acceptance.json, acceptance.md and per_position.png. Resumable per (drafter, temp).
--prompt-lookup adds a row NAME+lookup per drafter named: the same drafter with prompt
lookup beside it (dspark_vllm/lookup.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from dspark_vllm.evaluate import EvalConfig, evaluate
from dspark_vllm.serving import BUNDLED_DRAFTER

DEFAULT_DRAFTERS = {
    "dspark-2l": str(BUNDLED_DRAFTER),
    "parallel-2l": "runs/smollm2/parallel-2l/drafter",
    "parallel-5l": "runs/smollm2/parallel-5l/drafter",
    "mtp-1": "runs/smollm2/mtp-1/drafter",
}
SETS = ("spec_bench", "humaneval", "gsm8k")


def run(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "acceptance.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    drafters = dict(d.split("=", 1) for d in args.drafter) if args.drafter else DEFAULT_DRAFTERS
    unknown = [n for n in args.prompt_lookup if n not in drafters]
    if unknown:
        raise SystemExit(f"--prompt-lookup {unknown}: not among the drafters {sorted(drafters)}")
    rows = [(n, d, False) for n, d in drafters.items()] + \
        [(f"{n}+lookup", drafters[n], True) for n in args.prompt_lookup]
    for name, d, looks in rows:
        if d != "random" and not Path(d, "config.json").is_file():
            print(f"skip {name}: no drafter at {d}")
            continue
        for t in args.temperatures:
            key = f"{name}@t{t:g}"
            if key in results:
                continue
            row = {}
            for s in SETS:
                per_cat = args.per_category if s == "spec_bench" else None
                limit = None if s == "spec_bench" else args.limit
                rep = evaluate(EvalConfig(drafter=d, data=s, temperature=t, limit=limit,
                                          per_category=per_cat, max_new_tokens=args.max_new_tokens,
                                          seed=args.seed, prompt_lookup=looks))
                row[s] = rep
                print(f"{key} {s}: tau {rep['tau']:.3f} macro {rep['tau_macro']:.3f} "
                      f"({rep['wall_seconds']:.0f}s)", flush=True)
            results[key] = row
            path.write_text(json.dumps(results, indent=1))
    write_tables(out, results)
    return results


def macro_spec_bench(row: dict) -> float:
    return row["spec_bench"]["tau_macro"]


def _share(r: dict | None) -> str:
    """A result's share of target tokens outside the draft vocabulary ('-' where a result
    written before it was counted lacks it)."""
    v = None if r is None else r.get("outside_vocab")
    return "-" if v is None else f"{100 * v:.1f}"


def write_tables(out: Path, results: dict) -> None:
    cats = sorted({c for r in results.values() for c in r["spec_bench"]["per_category"]})
    lines = [f"# Offline acceptance length tau ({datetime.date.today()})", "",
             "tau = tokens per verification round (bonus included); Spec-Bench first turns, "
             "macro = mean over its categories.", "",
             "| drafter | " + " | ".join(cats) + " | Spec-Bench macro | HumanEval | GSM8K held-out |",
             "|---|" + "---|" * (len(cats) + 3)]
    for key, r in results.items():
        pc = r["spec_bench"]["per_category"]
        lines.append(f"| {key} | " + " | ".join(f"{pc[c]['tau']:.2f}" if c in pc else "-" for c in cats)
                     + f" | {macro_spec_bench(r):.2f} | {r['humaneval']['tau']:.2f} | "
                     f"{r['gsm8k']['tau']:.2f} |")
    lines += ["", "Per-position conditional acceptance (GSM8K held-out):", "",
              "| drafter | " + " | ".join(f"k={k + 1}" for k in range(7)) + " |", "|---|" + "---|" * 7]
    for key, r in results.items():
        rates = r["gsm8k"]["accept_rate"] + [None] * 7
        lines.append(f"| {key} | " + " | ".join("-" if a is None else f"{a:.2f}" for a in rates[:7]) + " |")
    lines += ["", "Target tokens outside the drafter's draft vocabulary, % (a draft stops at each; "
              "0 for a drafter over the whole vocabulary):", "",
              "| drafter | " + " | ".join(cats) + " | HumanEval | GSM8K held-out |",
              "|---|" + "---|" * (len(cats) + 2)]
    for key, r in results.items():
        pc = r["spec_bench"]["per_category"]
        cells = [_share(pc.get(c)) for c in cats] + [_share(r["humaneval"]), _share(r["gsm8k"])]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    looked = {k: r for k, r in results.items() if r["spec_bench"]["config"].get("prompt_lookup")}
    if looked:
        lines += ["", "Rounds that verified the prompt-lookup block instead of the drafter's, %:",
                  "", "| drafter | " + " | ".join(cats) + " | HumanEval | GSM8K held-out |",
                  "|---|" + "---|" * (len(cats) + 2)]
        for key, r in looked.items():
            pc = r["spec_bench"]["per_category"]
            cells = [f"{100 * pc[c]['lookup_rounds'] / max(pc[c]['rounds'], 1):.0f}"
                     if c in pc else "-" for c in cats]
            cells += [f"{100 * r[s]['lookup_share']:.0f}" for s in ("humaneval", "gsm8k")]
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
    (out / "acceptance.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key, r in results.items():
        rates = [a for a in r["gsm8k"]["accept_rate"] if a is not None]
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=key)
    ax.set_xlabel("draft position k")
    ax.set_ylabel("P(accept k | 1..k-1 accepted)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "per_position.png", dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results/acceptance")
    p.add_argument("--drafter", nargs="*", help="NAME=DIR (DIR may be 'random')")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--per-category", type=int, default=6, help="Spec-Bench prompts per category")
    p.add_argument("--limit", type=int, default=30, help="HumanEval / GSM8K prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-lookup", nargs="*", default=[], metavar="NAME",
                   help="also these drafters with prompt lookup beside them (rows NAME+lookup)")
    p.add_argument("--quick", action="store_true", help="one prompt per set, 8 tokens (tests)")
    args = p.parse_args(argv)
    if args.quick:
        args.per_category, args.limit, args.max_new_tokens = 1, 1, 8
        args.temperatures = args.temperatures[:1]
    run(args)


if __name__ == "__main__":
    main()
