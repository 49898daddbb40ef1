"""The step ledger: where an engine's wall time went, by step kind and by load.

Kept by LedgerScheduler (every step of any server that runs it, plain decoding included)
and read by the status view, /metrics and the benchmarks. The draft gate's arms (gate.py)
see only clean pure-decode steps; the ledger sees every step.
"""

from __future__ import annotations

from .gate import bucket


def step_kind(prefill: bool, verified: bool, drafted: bool) -> str:
    """A step's kind for the ledger: carries prefill or only decodes; verified drafts or not;
    ran the draft pass (for the next step) or only the drafter's context pass."""
    return (f"{'prefill' if prefill else 'decode'}_{'verify' if verified else 'noverify'}"
            f"_{'draft' if drafted else 'nodraft'}")


class StepLedger:
    """Where the engine's wall time went, by step kind: steps, seconds, generated tokens and
    prefill tokens. The gate's arms see only clean pure-decode steps; this sees every step,
    so the steps they leave out (prefill, transitions, bursts) can be priced too. The same
    rows by load (the gate's batch buckets) say at which batch sizes drafting ran and what
    its steps cost there: the view that showed the gate drafting at 16 requests on noise."""

    def __init__(self) -> None:
        # kind -> [steps, seconds, tokens, prefill tokens, cycle seconds]
        self.kinds: dict[str, list[float]] = {}
        self.loads: dict[tuple[int, str], list[float]] = {}  # (bucket, kind) -> same row

    def observe(self, kind: str, seconds: float, tokens: int, prefill_tokens: int,
                batch: int = 0) -> None:
        """One finished step; `batch`: the requests it scheduled (0: not filed by load)."""
        row = (1, seconds, tokens, prefill_tokens, 0.0)
        self._add(self.kinds, kind, row)
        if batch > 0:
            self._add(self.loads, (bucket(batch), kind), row)

    def cycle(self, kind: str, seconds: float) -> None:
        """The step's whole engine cycle, schedule() to the next schedule(): the model
        step plus what the engine does around it (output processing, draft hand-over)."""
        self._add(self.kinds, kind, (0, 0.0, 0, 0, seconds))

    @staticmethod
    def _add(table: dict, key, values: tuple) -> None:
        row = table.setdefault(key, [0, 0.0, 0, 0, 0.0])
        for i, v in enumerate(values):
            row[i] += v

    @staticmethod
    def _row(r: list[float], cycles: bool = True) -> dict[str, float]:
        row = {"steps": r[0], "seconds": round(r[1], 4), "generated_tokens": r[2],
               "prefill_tokens": r[3]}
        if cycles:
            row["cycle_seconds"] = round(r[4], 4)
        return row

    def table(self) -> dict[str, dict[str, float]]:
        return {k: self._row(r) for k, r in sorted(self.kinds.items())}

    def by_load(self) -> dict[str, dict[str, dict[str, float]]]:
        """{batch bucket: {kind: steps, seconds, generated and prefill tokens}} (the model
        step only: cycles are filed by kind)."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for (b, kind), r in sorted(self.loads.items()):
            out.setdefault(str(b), {})[kind] = self._row(r, cycles=False)
        return out
