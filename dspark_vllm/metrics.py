"""DSpark metrics: counted in the engine process, served on vLLM's own /metrics.

The scheduler (EngineCore process) keeps the numbers and publishes a small JSON snapshot
at most every PUBLISH_INTERVAL seconds; the API server process registers a Prometheus
collector that reads the snapshot at scrape time. The same snapshot backs the JSON status
view (`/dspark/status`, endpoint plugin).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import deque
from pathlib import Path

PUBLISH_INTERVAL = 0.5  # seconds: scrapes see data at most this stale, writes stay cheap
CALIBRATION_WINDOW = 2000  # recent verified slots per position in the calibration error
ECE_BINS = 10
BUDGET_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)
METRICS_ENV = "DSPARK_METRICS_FILE"


def metrics_file() -> Path:
    """The snapshot path shared by the API server and its engine (set before it starts)."""
    if METRICS_ENV not in os.environ:
        os.environ[METRICS_ENV] = str(Path(tempfile.mkdtemp(prefix="dspark-metrics-")) / "stats.json")
    return Path(os.environ[METRICS_ENV])


class RollingECE:
    """Expected calibration error of the last `window` (confidence, hit) pairs over ECE_BINS
    equal-width bins: the sum over bins of |sum of confidences - hits|, over the pairs.
    Kept as per-bin sums that each pair adds to on arrival and takes back on leaving: O(1)
    a pair and O(ECE_BINS) a read. (Recomputing 7 windows of 2,000 pairs took ~6 ms of the
    engine loop at every metrics publish; tests/test_metrics.py keeps that slow reference.)"""

    def __init__(self, window: int = CALIBRATION_WINDOW) -> None:
        self.pairs: deque[tuple[float, float]] = deque()
        self.window = window
        self.conf = [0.0] * ECE_BINS  # sum of confidences per bin
        self.hits = [0] * ECE_BINS  # hits per bin (integers: no drift)
        self.count = [0] * ECE_BINS

    def append(self, conf: float, hit: float) -> None:
        if len(self.pairs) == self.window:
            self._move(*self.pairs.popleft(), -1)
        self.pairs.append((conf, hit))
        self._move(conf, hit, 1)  # (rounding drift in the float sums: ~1e-9 after 1e8 pairs)

    def _move(self, conf: float, hit: float, sign: int) -> None:
        b = min(int(conf * ECE_BINS), ECE_BINS - 1)
        self.conf[b] += sign * conf
        self.hits[b] += sign * int(hit)
        self.count[b] += sign

    def __len__(self) -> int:
        return len(self.pairs)

    def value(self) -> float | None:
        if not self.pairs:
            return None
        return sum(abs(c - h) for c, h, n in zip(self.conf, self.hits, self.count)
                   if n) / len(self.pairs)


class DSparkStats:
    def __init__(self, max_positions: int) -> None:
        self.k = max_positions
        self.drafted = self.admitted = self.dropped = 0
        self.expected_accepted = 0.0
        self.accepted = 0
        self.verified_requests = 0
        self.nan_confidences = 0
        self.cost_refits = 0
        self.steps = 0
        self.skipped_drafts = 0  # steps that drafted nothing (context K/V deferred)
        self.lookup_blocks = 0  # requests that verified prompt lookup's block (lookup.py)
        self.context_rows = {"written": 0, "dropped": 0, "owed": 0}  # the drafter's context
        self.draft_seconds = self.schedule_seconds = self.verify_seconds = 0.0
        self.budget_buckets = [0] * (len(BUDGET_BUCKETS) + 1)
        self.budget_sum = 0
        self.last_budget = 0
        self.last_per_request = 0.0
        self.draft_len = max_positions
        self.calibration = [RollingECE() for _ in range(max_positions)]
        self._last_publish = 0.0
        self.path = Path(os.environ[METRICS_ENV]) if METRICS_ENV in os.environ else None

    def record_admission(self, drafted: int, admitted: int, survivals: list[float]) -> None:
        self.drafted += drafted
        self.admitted += admitted
        self.dropped += drafted - admitted
        self.expected_accepted += sum(survivals)

    def record_budget(self, total: int, requests: int) -> None:
        self.steps += 1
        self.last_budget = total
        self.budget_sum += total
        self.last_per_request = total / requests if requests else 0.0
        self.budget_buckets[next((i for i, b in enumerate(BUDGET_BUCKETS) if total <= b),
                                 len(BUDGET_BUCKETS))] += 1

    def record_outcome(self, survivals: list[float], accepted: int) -> None:
        """One request's verification: its admitted survivals and the drafts accepted."""
        self.accepted += min(accepted, len(survivals))
        self.verified_requests += 1
        prev = 1.0
        for k, a in enumerate(survivals):
            if k > accepted:  # slot k was never reached (an earlier draft was rejected)
                break
            cond = a / prev if prev > 0 else 0.0  # c_k, the conditional confidence
            self.calibration[k].append(min(max(cond, 0.0), 1.0), float(k < accepted))
            prev = a

    def snapshot(self) -> dict:
        return {
            "time": time.time(), "steps": self.steps, "drafted": self.drafted,
            "admitted": self.admitted, "dropped": self.dropped,
            "expected_accepted": self.expected_accepted, "accepted": self.accepted,
            "verified_requests": self.verified_requests, "nan_confidences": self.nan_confidences,
            "cost_refits": self.cost_refits, "skipped_drafts": self.skipped_drafts,
            "lookup_blocks": self.lookup_blocks,
            "context_rows": dict(self.context_rows),
            "phase_seconds": {"draft": self.draft_seconds, "schedule": self.schedule_seconds,
                              "verify": self.verify_seconds},
            "budget": {"buckets": list(BUDGET_BUCKETS), "counts": self.budget_buckets,
                       "sum": self.budget_sum, "last": self.last_budget,
                       "last_per_request": self.last_per_request, "draft_len": self.draft_len},
            "calibration_error": [d.value() for d in self.calibration],
        }

    def maybe_publish(self, status_fn=None, force: bool = False) -> None:
        now = time.time()
        if self.path is None or (not force and now - self._last_publish < PUBLISH_INTERVAL):
            return
        self._last_publish = now
        snap = self.snapshot()
        if status_fn is not None:
            snap["status"] = status_fn()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(snap))
        tmp.replace(self.path)


class DSparkCollector:
    """Prometheus collector (API server process) over the engine's snapshot."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def collect(self):
        try:
            s = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        st = s.get("status") or {}
        if "policy" in st or not st:  # a plain LedgerScheduler has no budget to report
            yield from self._budget(s)
        yield from self._ledger(st)

    def _budget(self, s: dict):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)

        for name, key, doc in (
                ("dspark_draft_tokens_drafted", "drafted", "Draft tokens proposed."),
                ("dspark_draft_tokens_admitted", "admitted", "Draft tokens admitted for verification."),
                ("dspark_draft_tokens_dropped", "dropped", "Draft tokens trimmed by the budget."),
                ("dspark_accepted_tokens_expected", "expected_accepted",
                 "Sum of survival products of admitted drafts (expected accepted)."),
                ("dspark_accepted_tokens_actual", "accepted", "Admitted drafts accepted."),
                ("dspark_confidence_nan", "nan_confidences", "Missing or NaN confidences."),
                ("dspark_cost_model_refits", "cost_refits", "Online refits of the cost model."),
                ("dspark_budget_steps", "steps", "Steps the budget policy ran."),
                ("dspark_draft_passes_skipped", "skipped_drafts",
                 "Steps that drafted nothing (context K/V deferred): drafting did not pay."),
                ("dspark_prompt_lookup_blocks", "lookup_blocks",
                 "Request-steps that verified prompt lookup's block instead of the drafter's.")):
            yield CounterMetricFamily(name, doc, value=s.get(key, 0))
        ctx = s.get("context_rows") or {}
        rows = CounterMetricFamily("dspark_context_rows",
                                   "Drafter context K/V rows: computed, or dropped unread "
                                   "(a departed request's, prefix cache off).", labels=["fate"])
        for fate in ("written", "dropped"):
            rows.add_metric([fate], ctx.get(fate, 0))
        yield rows
        yield GaugeMetricFamily("dspark_context_rows_owed",
                                "Context rows deferred by steps that drafted nothing, not yet "
                                "written (bounded).", value=ctx.get("owed", 0))
        phases = CounterMetricFamily("dspark_phase_seconds", "Time spent per phase.",
                                     labels=["phase"])
        for phase, v in s["phase_seconds"].items():
            phases.add_metric([phase], v)
        yield phases
        b = s["budget"]
        acc, buckets = 0, []
        for edge, n in zip(b["buckets"] + ["+Inf"], b["counts"]):
            acc += n
            buckets.append((str(float(edge)) if edge != "+Inf" else edge, acc))
        yield HistogramMetricFamily("dspark_verify_budget_tokens",
                                    "Draft tokens admitted for verification per step.",
                                    buckets=buckets, sum_value=b["sum"])
        yield GaugeMetricFamily("dspark_draft_length", "Slots drafted per request next step.",
                                value=b.get("draft_len", 0))
        yield GaugeMetricFamily("dspark_verified_drafts_per_request",
                                "Mean drafts verified per request in the last step.",
                                value=b["last_per_request"])
        cal = GaugeMetricFamily("dspark_confidence_calibration_error",
                                "ECE of the conditional confidence per draft position.",
                                labels=["position"])
        for k, e in enumerate(s["calibration_error"]):
            if e is not None:
                cal.add_metric([str(k)], e)
        yield cal
        st = s.get("status") or {}
        if "tracked_requests" in st:
            yield GaugeMetricFamily("dspark_tracked_requests",
                                    "Requests with budget state in the scheduler (0 when idle).",
                                    value=st["tracked_requests"])
        decided = (st.get("gate") or {}).get("decided_by")
        if decided:
            fam = CounterMetricFamily("dspark_gate_decisions",
                                      "Steps by what set their drafting state: the predicted "
                                      "gain, the measured verdict, its lean where a busy load's "
                                      "verdict is unsure, an exploration burst, or arrivals "
                                      "(planned drafting called off as the load rose).",
                                      labels=["source", "state"])
            for source, states in decided.items():
                for state, n in states.items():
                    fam.add_metric([source, state], n)
            yield fam
        cm = st.get("cost_model")
        if cm:
            yield GaugeMetricFamily("dspark_cost_model_alpha_seconds", "Fixed step cost.",
                                    value=cm["alpha_s"])
            yield GaugeMetricFamily("dspark_cost_model_beta_seconds",
                                    "Step cost per scheduled token.", value=cm["beta_s_per_token"])

    def _ledger(self, st: dict):
        from prometheus_client.core import CounterMetricFamily

        kinds = st.get("steps_by_kind")
        if kinds:  # where the engine's time went: prefill / verify / draft steps
            cycle = CounterMetricFamily("dspark_step_cycle_seconds",
                                        "Engine cycle time by step kind.", labels=["kind"])
            steps = CounterMetricFamily("dspark_steps", "Engine steps by kind.", labels=["kind"])
            for kind, row in kinds.items():
                cycle.add_metric([kind], row["cycle_seconds"])
                steps.add_metric([kind], row["steps"])
            yield cycle
            yield steps


_registered = {"done": False}


def register_collector() -> Path:
    """In the API server process: expose the engine's DSpark numbers on /metrics."""
    path = metrics_file()
    if not _registered["done"]:
        from prometheus_client import REGISTRY

        REGISTRY.register(DSparkCollector(path))
        _registered["done"] = True
    return path
