"""Tables and plots of a serving sweep, including the paper's matched-throughput view."""

from __future__ import annotations

import datetime
import platform
import subprocess
from pathlib import Path

import numpy as np

BASELINE = "mtp-1"
PHASES = ("draft", "schedule", "verify")  # the engine's dspark_phase_seconds_total labels


def _frontier(points: dict) -> tuple[np.ndarray, np.ndarray]:
    """(throughput, per-user speed) sorted by throughput."""
    xs = [(p["median"]["throughput_tok_s"], p["median"].get("per_user_tok_s") or 0.0)
          for p in points.values()]
    xs.sort()
    return np.array([x for x, _ in xs]), np.array([y for _, y in xs])


def per_user_at(points: dict, throughput: float) -> float | None:
    """Per-user speed of a configuration at a given aggregate throughput (interpolated on
    its measured frontier; None outside the measured range)."""
    t, u = _frontier(points)
    if not len(t) or throughput < t[0] - 1e-9 or throughput > t[-1] + 1e-9:
        return None
    return float(np.interp(throughput, t, u))


def throughput_at(points: dict, per_user: float) -> float | None:
    """The most aggregate throughput a configuration reaches while its per-user speed is
    still >= `per_user`: the frontier walked in throughput order, linear between measured
    points (so a frontier that rises before it falls is read right). None where it never
    ran that fast; below its slowest point, its highest measured throughput (a lower bound)."""
    t, u = _frontier(points)
    if not len(t) or per_user > u.max():
        return None
    best = max(float(x) for x, y in zip(t, u) if y >= per_user)
    for i in range(len(t) - 1):  # segments that cross the target
        if (u[i] - per_user) * (u[i + 1] - per_user) < 0:
            frac = (u[i] - per_user) / (u[i] - u[i + 1])
            best = max(best, float(t[i] + frac * (t[i + 1] - t[i])))
    return best


def _per_baseline_load(results: dict, baseline: str, row) -> dict:
    """{config: [row(config's points, the baseline's median at one load, that load), one per
    baseline load]}; {} when the sweep has no baseline."""
    if baseline not in results:
        return {}
    base = results[baseline]["points"]
    return {name: [row(r["points"], p["median"], int(c)) for c, p in base.items()]
            for name, r in results.items()}


def matched(results: dict, baseline: str = BASELINE) -> dict:
    """Per-user speed of each configuration at the throughput the baseline reached at each
    of its loads, and its ratio to the baseline's per-user speed there (the paper's view)."""
    def row(points, m, c):
        thr, bu = m["throughput_tok_s"], m.get("per_user_tok_s")
        u = per_user_at(points, thr)
        return {"baseline_concurrency": c, "throughput": thr, "baseline_per_user": bu,
                "per_user": u, "ratio": (u / bu) if (u and bu) else None}
    return _per_baseline_load(results, baseline, row)


def at_speed(results: dict, baseline: str = BASELINE) -> dict:
    """matched()'s dual, the issue's "throughput at a per-user speed target": the targets
    are the per-user speeds the baseline reached at each of its loads; for each, the most
    aggregate throughput a configuration reaches while still serving every user that fast
    (throughput_at: None where it never ran that fast, a lower bound, `at_least`, where it
    never ran that slowly), and its ratio to the baseline's own throughput at that speed."""
    def row(points, m, c):
        target, bt = m.get("per_user_tok_s"), m["throughput_tok_s"]
        t = throughput_at(points, target) if target else None
        return {"baseline_concurrency": c, "per_user": target, "baseline_throughput": bt,
                "throughput": t, "at_least": bool(t and target < _frontier(points)[1].min()),
                "ratio": (t / bt) if (t and bt) else None}
    return _per_baseline_load(results, baseline, row)


def matched_table(results: dict, baseline: str = BASELINE) -> list[str]:
    """Markdown lines of matched(); empty without the baseline."""
    mt = matched(results, baseline)
    if not mt:
        return []
    return [f"## Per-user speed at matched throughput (vs {baseline})", "",
            "| config | " + " | ".join(f"@{r['throughput']:.0f} tok/s (c={r['baseline_concurrency']})"
                                      for r in mt[baseline]) + " |",
            "|---|" + "---|" * len(mt[baseline])] + [
        f"| {name} | " + " | ".join(f"{r['ratio']:.2f}x" if r["ratio"] else "-" for r in rows) + " |"
        for name, rows in mt.items()]


def speed_table(results: dict, baseline: str = BASELINE) -> list[str]:
    """Markdown lines of at_speed(); empty without the baseline."""
    mt = at_speed(results, baseline)
    if not mt:
        return []
    cols = [i for i, r in enumerate(mt[baseline]) if r["per_user"]]  # loads with a speed

    def cell(r):
        ge = ">=" if r["at_least"] else ""
        return f"{ge}{r['throughput']:.0f} ({ge}{r['ratio']:.2f}x)" if r["ratio"] else "-"
    lines = [f"## Throughput at a per-user speed target ({baseline}'s per-user speed at each "
             "of its loads)", "",
             "| config | " + " | ".join(f"@{mt[baseline][i]['per_user']:.1f} tok/s per user "
                                       f"(c={mt[baseline][i]['baseline_concurrency']})"
                                       for i in cols) + " |",
             "|---|" + "---|" * len(cols)]
    lines += [f"| {name} | " + " | ".join(cell(rows[i]) for i in cols) + " |"
              for name, rows in mt.items()]
    return lines + ["", ">=: the configuration never ran that slowly; its highest measured "
                    "throughput is a lower bound. -: it never served users that fast."]


def paired_ratios(results: dict, base: str = "no-spec", key: str = "throughput_tok_s") -> dict:
    """{config: {concurrency: [`key` / base's, one per server instance]}}. Instance i
    of every configuration is paired with the base's instance i: the servers that were up
    together when interleaved. The spread of these ratios for a second copy of the base
    (the A/A control) is what an A/B ratio has to clear."""
    if base not in results:
        return {}
    out = {}
    for name, r in results.items():
        if name == base:
            continue
        rows = {}
        for c, p in r["points"].items():
            b = results[base]["points"].get(c, {}).get(f"instance_{key}")
            mine = p.get(f"instance_{key}")
            if b and mine:
                rows[c] = [x / y for x, y in zip(mine, b) if y > 0]
        if rows:
            out[name] = rows
    return out


def _tok_s(row: dict | None) -> float | None:
    return row["generated_tokens"] / row["seconds"] if row and row["seconds"] else None


def gate_rows(results: dict) -> list[dict]:
    """The draft gate per server instance and load bucket: what its two readings said and
    what the step ledger saw. arms: the EWMA arms' drafted / undrafted tokens per second;
    paired: the bursts judged against the steps just before them (gain, its standard error
    in log units, pairs, verdict); ledger: clean drafted (verify + draft) and undrafted
    (neither) decode steps' tokens per second over the whole instance, and the drafted
    share of those steps (what the gate chose)."""
    rows = []
    for name, r in results.items():
        for i, st in enumerate(r.get("instance_status") or []):
            gate = (st or {}).get("gate")
            if not gate:
                continue
            arms, paired = gate.get("tokens_per_second_by_batch", {}), gate.get("paired_bursts_by_batch", {})
            loads = st.get("steps_by_load", {})
            for b in sorted(set(arms) | set(paired), key=int):
                a, pb, ld = arms.get(b, {}), paired.get(b), loads.get(b, {})
                on, off = ld.get("decode_verify_draft"), ld.get("decode_noverify_nodraft")
                clean = (on or {}).get("steps", 0) + (off or {}).get("steps", 0)
                rows.append({
                    "config": name, "instance": i + 1, "batch": int(b),
                    "arms_gain": (a["drafted_tok_s"] / a["undrafted_tok_s"]
                                  if a.get("drafted_tok_s") and a.get("undrafted_tok_s") else None),
                    "paired_gain": pb["gain"] if pb else None,
                    "paired_stderr": pb["log_gain_stderr"] if pb else None,
                    "pairs": pb["pairs"] if pb else 0, "paired_verdict": pb["verdict"] if pb else None,
                    "ledger_gain": (_tok_s(on) / _tok_s(off) if _tok_s(on) and _tok_s(off) else None),
                    "drafted_share": (on or {}).get("steps", 0) / clean if clean else None})
    return rows


def _git() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_report(out: Path, results: dict, poisson: float | None = None,
                 dtype: str = "float32") -> None:
    """sweep.md and the plots; `poisson`: the open loop's arrival rate per unit of `conc`;
    `dtype`: the servers' --dtype, named in the header."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                   if x.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [f"# Serving sweep ({datetime.date.today()}, commit {_git()}, {cpu}, "
             f"{len(__import__('os').sched_getaffinity(0))} cores, {dtype})", "",
             (f"Open loop: Poisson arrivals at {poisson:g} x conc requests per second."
              if poisson else "Closed loop: conc users, each sending its next request when "
              "the last one finishes."), "",
             "| config | conc | per-user tok/s | throughput tok/s | TTFT p50/p99 ms | "
             "TPOT p50/p99 ms | tau | verified drafts/step | steps drafted |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        for c, p in r["points"].items():
            m = p["median"]
            lines.append(
                f"| {name} | {c} | {m.get('per_user_tok_s', 0):.1f} | {m['throughput_tok_s']:.1f} | "
                f"{m.get('ttft_p50_ms', 0):.0f}/{m.get('ttft_p99_ms', 0):.0f} | "
                f"{m.get('tpot_p50_ms', 0):.0f}/{m.get('tpot_p99_ms', 0):.0f} | "
                f"{m['acceptance_length']:.2f} | {m['verified_drafts_per_request_step']:.2f} | "
                f"{100 * m.get('drafted_step_share', 0):.0f}% |")
    lines += ["", "tau: tokens per drafted round; verified drafts/step and steps drafted: per "
              "request-step, steps that drafted nothing included."]
    phases = [(name, c, p["median"]) for name, r in results.items()
              for c, p in r["points"].items() if "draft_seconds" in p["median"]]
    if phases:
        lines += ["", "## Where step time goes (load-aware budget; the engine's phase counters)", "",
                  "| config | conc | draft | schedule | verify (target step) |", "|---|---|---|---|---|"]
        for name, c, m in phases:
            tot = sum(m[f"{ph}_seconds"] for ph in PHASES) or 1.0
            lines.append(f"| {name} | {c} | " + " | ".join(
                f"{100 * m[f'{ph}_seconds'] / tot:.0f}%" for ph in PHASES) + " |")
    ledger = [(name, c, p["median"]) for name, r in results.items()
              for c, p in r["points"].items() if "ledger_overhead_ms" in p["median"]]
    if ledger:
        lines += ["", "## Where the engine's time goes (step ledger, warm-up included)", "",
                  "| config | conc | decode steps: tok per cycle-s | all steps: tok per cycle-s "
                  "| prefill steps' share of engine time | engine time around each model step "
                  "| engine busy, % of wall | prefill steps | model steps at full load: tok/s, "
                  "% of model time | off full load: tok/s |", "|---|---|---|---|---|---|---|---|---|---|"]

        def opt(m, key, fmt, scale=1.0):  # runs before these columns existed lack them
            return format(scale * m[key], fmt) if key in m else "-"

        for name, c, m in ledger:
            lines.append(f"| {name} | {c} | {m.get('ledger_decode_tok_s', 0):.1f} | "
                         f"{opt(m, 'ledger_engine_tok_s', '.1f')} | "
                         f"{100 * m['ledger_prefill_share']:.0f}% | "
                         f"{m['ledger_overhead_ms']:.1f} ms | "
                         f"{opt(m, 'ledger_busy_share', '.0f', 100)} | "
                         f"{opt(m, 'ledger_prefill_steps', '.0f')} | "
                         f"{opt(m, 'ledger_full_load_tok_s', '.1f')}, "
                         f"{opt(m, 'ledger_full_load_time_share', '.0f', 100)}% | "
                         f"{opt(m, 'ledger_part_load_tok_s', '.1f')} |")
    pr = paired_ratios(results)
    full = paired_ratios(results, key="full_concurrency_throughput_tok_s")
    if pr:
        lines += ["", "## Throughput vs no-spec, paired by server instance", "",
                  "| config | conc | per instance | median | while every user had a request "
                  "in flight: per instance | median |", "|---|---|---|---|---|---|"]
        for name, rows in pr.items():
            for c, ratios in rows.items():
                f = full.get(name, {}).get(c)
                lines.append(f"| {name} | {c} | " + " / ".join(f"{x:.2f}" for x in ratios) +
                             f" | {float(np.median(ratios)):.2f}x | " +
                             (" / ".join(f"{x:.2f}" for x in f) + f" | {float(np.median(f)):.2f}x |"
                              if f else "- | - |"))
        lines += ["", "Each ratio: median throughput over the instance's repeats, against the "
                  "no-spec server up at the same time (interleaved) or run in the same place "
                  "of the order (sequential). The first over each measured window (from the "
                  "first measured request's start to the last one's end, the drain included); "
                  "the second until the closed loop's users began to run out of requests "
                  "(load.full_concurrency_throughput)."]
    gr = gate_rows(results)
    if gr:
        f = lambda x, fmt: "-" if x is None else format(x, fmt)  # noqa: E731
        lines += ["", "## The draft gate per server instance and load", "",
                  "| config | instance | batch | arms: drafted / undrafted | paired bursts: gain "
                  "(± s.e., pairs) | ledger: clean drafted / undrafted | clean steps drafted, % |",
                  "|---|---|---|---|---|---|---|"]
        for g in gr:
            pb = (f"{g['paired_gain']:.2f}x (±{100 * g['paired_stderr']:.0f}%, {g['pairs']})"
                  if g["paired_gain"] else "-")
            lines.append(f"| {g['config']} | {g['instance']} | {g['batch']} | "
                         f"{f(g['arms_gain'], '.2f')} | {pb} | {f(g['ledger_gain'], '.2f')} | "
                         f"{f(g['drafted_share'] and 100 * g['drafted_share'], '.0f')} |")
        lines += ["", "Batch: the gate's load bucket (13-16 requests file under 16). The ledger "
                  "column is over the instance's whole life, every concurrency it served."]
        src = ("prediction", "verdict", "lean", "exploration", "arrivals")
        lines += ["", "What set each step's drafting state (steps drafted / undrafted; lean: a "
                  "busy load's unsure verdict, leaning; arrivals: planned drafting called off "
                  "because requests arrived past where it pays):", "",
                  "| config | instance | verdict by | " + " | ".join(src) + " |",
                  "|---" * (3 + len(src)) + "|"]
        for name, r in results.items():
            for i, st in enumerate(r.get("instance_status") or []):
                gate = (st or {}).get("gate") or {}
                d = gate.get("decided_by")
                if d:
                    lines.append(f"| {name} | {i + 1} | {gate.get('verdict_by', 'arms')} | " +
                                 " | ".join(f"{d.get(k, {}).get('drafted', 0)} / "
                                            f"{d.get(k, {}).get('undrafted', 0)}" for k in src) + " |")
    for table in (matched_table(results), speed_table(results)):
        if table:
            lines += [""] + table
    (out / "sweep.md").write_text("\n".join(lines) + "\n")
    _plots(out, results)


def _plots(out: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    color = {name: f"C{i}" for i, name in enumerate(results)}  # same colour in both plots
    fig, ax = plt.subplots(figsize=(7, 5))
    for name, r in results.items():
        t, u = _frontier(r["points"])
        ax.plot(t, u, marker="o", label=name, color=color[name])
    ax.set_xlabel("aggregate output throughput (tok/s)")
    ax.set_ylabel("per-user decode speed (tok/s, 1/TPOT)")
    cs = sorted({int(c) for r in results.values() for c in r["points"]})  # those that ran
    ran = f" (concurrency {', '.join(map(str, cs))})" if cs else ""
    ax.set_title(f"Per-user speed vs throughput{ran}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "frontier.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in results.items():
        if r["spec"] is None:
            continue
        cs = sorted(int(c) for c in r["points"])
        ax.plot(cs, [r["points"][str(c)]["median"]["verified_drafts_per_request_step"] for c in cs],
                marker="o", label=name, color=color[name])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("verified drafts per request per step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "verified.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """Print the matched-throughput and speed-target tables of a finished sweep
    (`python -m benchmarks.report DIR [--baseline NAME]`), leaving its sweep.md as written."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m benchmarks.report")
    p.add_argument("sweep_dir", type=Path)
    p.add_argument("--baseline", default=BASELINE)
    args = p.parse_args(argv)
    path = args.sweep_dir / "sweep.json"
    if not path.is_file():
        p.error(f"{path}: no sweep.json there (a --out directory of benchmarks.serving_sweep)")
    try:
        results = json.loads(path.read_text())["results"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        p.error(f"{path}: not a serving sweep's result ({type(e).__name__}: {e}); expected "
                "the JSON object with a 'results' key that benchmarks.serving_sweep writes")
    if args.baseline not in results:
        p.error(f"--baseline {args.baseline}: not in this sweep; it has {', '.join(results)}")
    print("\n".join(matched_table(results, args.baseline)) + "\n")
    print("\n".join(speed_table(results, args.baseline)))


if __name__ == "__main__":
    main()
