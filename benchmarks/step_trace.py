"""Read the step traces servers write with DSPARK_STEP_TRACE=DIR (ledger_scheduler.StepTrace).

    DSPARK_STEP_TRACE=runs/trace python -m benchmarks.serving_sweep ...   # every server traces
    python -m benchmarks.step_trace runs/trace [more trace directories, pooled]
    python -m benchmarks.step_trace --by-kind [--min-batch 14] runs/trace   # per file, by kind

Each trace file is one engine process. A file whose steps never drafted nor verified is a
plain server's; the rest are speculative ones. For each batch size the table sets the plain
servers' decode steps beside the speculative servers' decode steps that verified drafts and
drafted again (the steady drafting state) and those that did neither: milliseconds a step,
tokens a step and tokens per second, summed over the files of each side. Prefill steps are
left out (their cost is the prompt's, not the decoding's). This is the view that showed
drafting level with plain decoding at 9-14 requests while the gate's prediction read a gain
(README, 2026-12-05).

`--by-kind` reads each file alone, over steps of at least `--min-batch` requests, by step
kind (prefill or decode, drafted, verified): model milliseconds a step, the engine's time
around it (from the previous step's end to this one's start), scheduled and generated tokens
a step and generated tokens per cycle-second. Gzipped traces (`*.jsonl.gz`, as the results
folders keep them) are read too. A trace directory's `servers.txt` (written by the serving
sweep: each file's server, from the engine pid in that server's log) names each file's server.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

SIDES = ("plain", "drafted", "undrafted")
SERVERS = "servers.txt"  # in a trace directory: "<trace file> <server>" a line
ENGINE_PID = re.compile(r"EngineCore(?:_DP\d+)? pid=(\d+)")  # vLLM's log prefix, engine process
IDLE_GAP_S = 0.05  # longer between two steps: the engine waited for requests (not a cycle)


def read(path: Path) -> list[dict]:
    try:
        with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:  # gzip.BadGzipFile is an OSError
        raise SystemExit(f"{path}: not a readable step trace ({type(e).__name__}: {e}); "
                         "give the directories DSPARK_STEP_TRACE wrote") from e


def name_servers(log_dir: Path, trace_dir: Path) -> dict[str, str]:
    """Which server wrote each trace file: a server's log (`<name>.log` in `log_dir`, as the
    serving sweep writes them) names its engine process's pid, and the trace file is
    steps-<pid>.jsonl. Merged into `trace_dir`/servers.txt -> {file: server}."""
    names = read_servers(trace_dir)
    for log in sorted(log_dir.glob("*.log")):
        for pid in set(ENGINE_PID.findall(log.read_text(errors="replace"))):
            if (trace_dir / f"steps-{pid}.jsonl").is_file():
                names[f"steps-{pid}.jsonl"] = log.stem
    if names:
        (trace_dir / SERVERS).write_text("".join(f"{f} {n}\n" for f, n in sorted(names.items())))
    return names


def read_servers(trace_dir: Path) -> dict[str, str]:
    """servers.txt of a trace directory -> {trace file: server} (a gzipped copy of a file
    answers to its name too); empty without one."""
    path = trace_dir / SERVERS
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        pair = line.split(maxsplit=1)
        if len(pair) != 2:
            raise SystemExit(f"{path}: {line!r} is not '<trace file> <server>'; mend or "
                             "remove the line")
        out[pair[0].removesuffix(".gz")] = pair[1].strip()
    return out


def speculative(rows: list[dict]) -> bool:
    return any(r["slots"] or r["verified"] for r in rows)


def by_batch(files: list[list[dict]]) -> dict[int, dict[str, list[float]]]:
    """{batch: {side: [steps, seconds, generated tokens]}} over decode steps only."""
    table: dict[int, dict[str, list[float]]] = defaultdict(lambda: {s: [0, 0.0, 0] for s in SIDES})
    for rows in files:
        spec = speculative(rows)
        for r in rows:
            if r["prefill"]:
                continue
            if not spec:
                side = "plain"
            elif r["verified"] and r["slots"]:
                side = "drafted"
            elif not r["verified"] and not r["slots"]:
                side = "undrafted"
            else:
                continue  # a transition between the two states
            row = table[r["batch"]][side]
            row[0] += 1
            row[1] += r["seconds"]
            row[2] += r["generated"]
    return dict(sorted(table.items()))


def kind(r: dict) -> str:
    return (("prefill" if r["prefill"] else "decode") + ("+draft" if r["slots"] else "")
            + ("+verify" if r["verified"] else ""))


def by_kind(rows: list[dict], min_batch: int) -> dict[str, list[float]]:
    """{kind: [steps, model seconds, generated tokens, engine seconds around them, scheduled
    tokens]} over one file's steps of at least `min_batch` requests; a step after an idle
    gap (IDLE_GAP_S) is left out."""
    table: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0.0, 0])
    for prev, r in zip(rows, rows[1:]):
        gap = r["t"] - prev["t"] - r["seconds"]
        if r["batch"] < min_batch or gap > IDLE_GAP_S:
            continue
        row = table[kind(r)]
        for i, v in enumerate((1, r["seconds"], r["generated"], gap, r["tokens"])):
            row[i] += v
    return dict(sorted(table.items()))


def kind_lines(name: str, table: dict[str, list[float]]) -> list[str]:
    n, s, g, gap, _ = (sum(row[i] for row in table.values()) for i in range(5))
    out = [f"== {name}: steps {n} model {s:.1f}s gaps {gap:.2f}s tok {g} -> "
           f"{g / (s + gap) if s + gap else 0:.1f} tok/cycle-s"]
    for k, (n, s, g, gap, tk) in table.items():
        out.append(f"   {k:22s} steps {n:5d} model ms {1e3 * s / n:6.1f} gap ms "
                   f"{1e3 * gap / n:5.2f} sched tok {tk / n:6.1f} gen tok/step {g / n:5.2f} "
                   f"tok/cycle-s {g / (s + gap):6.1f}")
    return out


def markdown(table: dict[int, dict[str, list[float]]]) -> list[str]:
    def cell(row):
        n, s, t = row
        return f"{n} | {1e3 * s / n:.1f} | {t / n:.2f} | {t / s:.1f}" if n and s else "- | - | - | -"

    head = " | ".join(f"{side}: steps | ms | tok/step | tok/s" for side in SIDES)
    lines = [f"| batch | {head} | drafted / plain tok/s |",
             "|---" * (2 + 4 * len(SIDES)) + "|"]
    for b, sides in table.items():
        p, d = sides["plain"], sides["drafted"]
        ratio = (f"{(d[2] / d[1]) / (p[2] / p[1]):.2f}x" if p[0] and d[0] and p[1] and d[1]
                 else "-")
        lines.append(f"| {b} | " + " | ".join(cell(sides[s]) for s in SIDES) + f" | {ratio} |")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace_dir", nargs="+", help="directories given as DSPARK_STEP_TRACE")
    ap.add_argument("--by-kind", action="store_true", help="each file alone, by step kind")
    ap.add_argument("--min-batch", type=int, default=14,
                    help="with --by-kind: steps of at least this many requests")
    args = ap.parse_args(argv)
    paths = []
    for d in args.trace_dir:
        found = sorted([*Path(d).glob("steps-*.jsonl"), *Path(d).glob("*.jsonl.gz")])
        if not found:
            raise SystemExit(f"{d}: no steps-*.jsonl here; serve with DSPARK_STEP_TRACE={d} "
                             "first")
        paths += found
    if args.by_kind:
        servers = {d: read_servers(d) for d in {path.parent for path in paths}}
        for path in paths:
            rows = read(path)
            name = servers[path.parent].get(path.name.removesuffix(".gz")) or (
                "budget" if any("source" in r for r in rows) else
                "speculative" if speculative(rows) else "plain")
            print("\n".join(kind_lines(f"{name} {path.name}", by_kind(rows, args.min_batch))))
        return
    files = [rows for rows in map(read, paths) if rows]
    kinds = sum(map(speculative, files))
    print(f"{len(files)} traces: {len(files) - kinds} plain, {kinds} speculative\n")
    print("\n".join(markdown(by_batch(files))))


if __name__ == "__main__":
    main()
