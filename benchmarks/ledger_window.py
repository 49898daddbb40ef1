"""A server's step ledger (its `/dspark/status`: `steps_by_kind`, `steps_by_load`) read over
one load window of the serving sweep: the rows after it minus the rows before it, summed into
the columns of sweep.md's ledger table."""

from __future__ import annotations

from dspark_vllm.gate import bucket


def _delta(before: dict, after: dict) -> dict:
    """Ledger rows {kind: {field: value}} over one window: after minus before."""
    return {k: {f: v - before.get(k, {}).get(f, 0) for f, v in r.items()} for k, r in after.items()}


def ledger_summary(before: dict, after: dict, wall: float | None = None) -> dict:
    """The step ledger over one load window (warm-up included; servers with a ledger only):
    generated tokens per engine-cycle second of pure-decode steps, the share of engine time
    spent in steps carrying prefill, and the engine's own time around each model step.
    With the window's `wall` seconds also the share of it the engine spent in step cycles
    (the rest it sat idle, no request running: between a request's end and the next one's
    arrival) and generated tokens per cycle second over every step: what the clients would
    see from an engine never left idle."""
    rows = _delta(before, after)
    if not rows:
        return {}
    dec = [r for k, r in rows.items() if k.startswith("decode")]
    cycle = sum(r["cycle_seconds"] for r in rows.values())
    steps = sum(r["steps"] for r in rows.values())
    dec_cycle = sum(r["cycle_seconds"] for r in dec)
    out = {"ledger_prefill_share": sum(r["cycle_seconds"] for k, r in rows.items()
                                       if k.startswith("prefill")) / cycle if cycle else 0.0,
           "ledger_prefill_steps": sum(r["steps"] for k, r in rows.items()
                                       if k.startswith("prefill")),
           "ledger_overhead_ms": 1e3 * (cycle - sum(r["seconds"] for r in rows.values())) / steps
           if steps else 0.0}
    if dec_cycle:
        out["ledger_decode_tok_s"] = sum(r["generated_tokens"] for r in dec) / dec_cycle
    if wall and cycle:
        out["ledger_busy_share"] = cycle / wall
        out["ledger_engine_tok_s"] = sum(r["generated_tokens"] for r in rows.values()) / cycle
    return out


def load_split(before: dict, after: dict, conc: int) -> dict:
    """The window's model steps parted by load (the ledger's `steps_by_load`): those at the
    point's full load (the batch bucket of `conc` requests) and the rest (the ramp up from
    the warm-up, the drain at the end, gaps while a finished request's successor is
    prefilled). Generated tokens per model-step second of each part, and the share of
    model-step time spent at full load: a server slower at a load point is slower in its
    steady steps, or spends more of its time off full load."""
    full = str(bucket(conc))
    parts = {True: [0.0, 0.0], False: [0.0, 0.0]}  # at full load? -> [seconds, tokens]
    for b, kinds in after.items():
        for r in _delta(before.get(b, {}), kinds).values():
            parts[b == full][0] += r["seconds"]
            parts[b == full][1] += r["generated_tokens"]
    (fs, ft), (rs, rt) = parts[True], parts[False]
    if fs + rs <= 0:
        return {}
    out = {"ledger_full_load_time_share": fs / (fs + rs)}
    if fs > 0:
        out["ledger_full_load_tok_s"] = ft / fs
    if rs > 0:
        out["ledger_part_load_tok_s"] = rt / rs
    return out
