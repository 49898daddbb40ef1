"""LedgerScheduler: vLLM's V1 Scheduler plus the step ledger (step_ledger.StepLedger).

The base of DSparkScheduler, and on its own the same measurement for any other server:

    vllm serve MODEL --scheduler-cls dspark_vllm.ledger_scheduler.LedgerScheduler

files every step of plain decoding (or of MTP-1, or of a fixed draft length) under its
kind, with the model step's seconds and the whole engine cycle, in `/dspark/status`
(`steps_by_kind`; by batch size too, `steps_by_load`) and on `/metrics` (`dspark_steps_total`,
`dspark_step_cycle_seconds_total`), so a plain server's step costs can be read beside a
DSpark one's. Scheduling is untouched.

With DSPARK_STEP_TRACE=DIR each engine process also appends every step to
DIR/steps-<pid>.jsonl, one JSON object a line (StepTrace): what the totals above cannot
show, such as when prefill chunks ran and how long new requests waited for them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from vllm.v1.core.sched.scheduler import Scheduler

from .config import TRACE_ENV
from .metrics import DSparkStats
from .step_ledger import StepLedger, step_kind

log = logging.getLogger("vllm.dspark.ledger")


class StepTrace:
    """Every finished step as one JSON line: `t` (wall clock at its end), `kind`, `batch`
    (requests scheduled), `waiting` (requests queued behind them), `tokens` (scheduled),
    `prefill` (tokens of prefill chunks), `verified` (draft tokens sent to verification),
    `slots` (draft slots the step drafted), `generated` and `seconds` (the model step),
    and what a subclass adds (LedgerScheduler._trace_fields).
    Line-buffered: a trace read while the server runs is whole up to its last step."""

    def __init__(self, directory: str) -> None:
        path = Path(directory)
        try:
            path.mkdir(parents=True, exist_ok=True)
            self.file = open(path / f"steps-{os.getpid()}.jsonl", "a", buffering=1)
        except OSError as e:
            raise ValueError(f"{TRACE_ENV}={directory!r}: cannot write a step trace there "
                             f"({e}); give a writable directory, or unset it") from e

    def write(self, **row) -> None:
        """Append one step; a failed write (disk full, the directory removed) stops the
        trace with a warning and never the engine."""
        if self.file is None:
            return
        try:
            self.file.write(json.dumps(row) + "\n")
        except OSError as e:
            log.warning("%s: step trace stopped, a write failed (%s)", TRACE_ENV, e)
            self.file = None


class LedgerScheduler(Scheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        sc = self.vllm_config.speculative_config
        self.stats = DSparkStats(sc.num_speculative_tokens if sc else 0)
        self.ledger = StepLedger()  # wall time by step kind (prefill / verify / draft)
        self._last_kind: str | None = None  # the last step's kind, until its cycle ends
        self._cycle_start = 0.0
        self._step_start: float | None = None
        self._step_tokens = self._step_slots = 0  # this step: scheduled tokens, draft slots
        trace = os.environ.get(TRACE_ENV)
        self.trace = StepTrace(trace) if trace else None

    def schedule(self, *args, **kwargs):
        now = time.perf_counter()
        if self._last_kind is not None:
            self.ledger.cycle(self._last_kind, now - self._cycle_start)  # the last step's cycle
        self._last_kind, self._cycle_start = None, now
        out = self._shape_step(super().schedule(*args, **kwargs))
        self._step_start = time.perf_counter()
        self._step_tokens = out.total_num_scheduled_tokens
        self._step_slots = len(out.num_scheduled_tokens) * out.num_spec_tokens_to_schedule
        return out

    def _shape_step(self, out):
        """Hook on the step vLLM scheduled, before it runs (DSparkScheduler sets its draft
        length here)."""
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        if self._step_start is not None and self._step_tokens:
            self._observe_step(scheduler_output, model_runner_output.sampled_token_ids,
                               time.perf_counter() - self._step_start)
        out = super().update_from_output(scheduler_output, model_runner_output)
        # Publish at most every PUBLISH_INTERVAL, and always when the engine falls idle, so
        # a client reading the status between two loads sees every step of the first.
        self.stats.maybe_publish(self._status, force=not self.get_num_unfinished_requests())
        return out

    def _observe_step(self, scheduler_output, sampled, seconds: float) -> None:
        self._file_step(scheduler_output, sampled, seconds, self._step_slots > 0)

    def _file_step(self, scheduler_output, sampled, seconds: float,
                   drafted: bool) -> tuple[int, int]:
        """File one finished step in the ledger -> (its prefill tokens, generated tokens)."""
        specs = scheduler_output.scheduled_spec_decode_tokens
        prefill = sum(n for r, n in scheduler_output.num_scheduled_tokens.items()
                      if n != 1 + len(specs.get(r, ())))  # tokens of prefill chunks
        verified = any(len(v) for v in specs.values())
        tokens = sum(len(t) for t in sampled or ())
        kind = step_kind(prefill > 0, verified, drafted)
        batch = len(scheduler_output.num_scheduled_tokens)
        self.ledger.observe(kind, seconds, tokens, prefill, batch=batch)
        self._last_kind = kind if self.running else None  # idle time is no step's cycle
        if self.trace is not None:
            self.trace.write(t=round(time.time(), 4), kind=kind, batch=batch,
                             waiting=len(self.waiting),
                             tokens=scheduler_output.total_num_scheduled_tokens,
                             prefill=prefill, verified=sum(len(v) for v in specs.values()),
                             slots=self._step_slots, generated=tokens, seconds=round(seconds, 5),
                             **self._trace_fields())
        return prefill, tokens

    def _trace_fields(self) -> dict:
        """Hook: more fields for this step's trace row (DSparkScheduler: the plan that set
        its draft length)."""
        return {}

    def _status(self) -> dict:
        return {"steps_by_kind": self.ledger.table(), "steps_by_load": self.ledger.by_load(),
                "running": len(self.running)}
