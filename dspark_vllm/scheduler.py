"""DSparkScheduler: vLLM's V1 Scheduler plus the load-aware verification budget.

Only the difference from LedgerScheduler (vLLM's Scheduler plus the step ledger) lives
here: after each step the drafts of every request
are trimmed to the budget the policy grants (budget.py) before they are scheduled for
verification, and the next step's draft length is set: the largest budget plus headroom,
or no draft pass at all (context K/V only) when drafting does not pay at this load;
outcomes feed the two cost models (step, draft pass), the fallback acceptance estimator
and the metrics. Selected automatically for method "dspark" with enable_adaptive_verification.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque

from .budget import (AcceptanceEstimator, ConfidenceDrift, SurvivalPool, admit_greedy,
                     admit_top, plan_from_mean, production_budget, survival)
from .config import DRIFT_ENV, GATE_ENV, PRICE_ENV, WARM_ENV
from .cost_model import DRAFT_PRIOR, CostModel, config_profile_key, profile_path
from .gate import (EXPLORE_MARGIN, LOSS_MIN_BATCH, PROVE_MIN_BATCH, TIE_MARGIN, WARM_BURSTS,
                   Explorer, PairedBursts, RealisedRates, bucket, leans)
from .ledger_scheduler import LedgerScheduler

log = logging.getLogger("vllm.dspark.scheduler")
POLICIES = ("greedy", "production")
DRAFT_HEADROOM = 1  # draft this many slots beyond the largest budget, so budgets can grow
GATE_POOL = 64  # recent drafted requests whose mean survival curve the draft gate reads


class DSparkScheduler(LedgerScheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        vc = self.vllm_config
        sc = vc.speculative_config
        self.max_drafts = sc.num_speculative_tokens
        self.policy = os.environ.get("DSPARK_BUDGET_POLICY", "greedy")
        if self.policy not in POLICIES:
            raise ValueError(f"DSPARK_BUDGET_POLICY={self.policy!r}: use one of {POLICIES}")
        key = config_profile_key(vc)
        self.cost_model = CostModel.load(profile_path(key))  # the step without drafting
        self.draft_cost = CostModel(prior=DRAFT_PRIOR)  # the draft pass, by drafted slots
        self.estimator = AcceptanceEstimator(self.max_drafts)
        # req_id -> (survivals, raw confidences or None) of the slots sent to verification
        self._admitted: dict[str, tuple[list[float], list[float] | None]] = {}
        # With DSPARK_CONFIDENCE_DRIFT=1 (validated in config.py): the confidences rescaled
        # to the acceptance served (budget.ConfidenceDrift), fed with each verified
        # request's raw confidences. Off by default: no served gain shown yet (README,
        # "The budget at one request").
        self.drift = (ConfidenceDrift(self.max_drafts)
                      if os.environ.get(DRIFT_ENV, "0") == "1" else None)
        self.hull = os.environ.get(PRICE_ENV, "hull") == "hull"  # budget.step_prices
        self._history: deque[list[list[float]]] = deque(maxlen=3)  # survivals per step
        self._pending: tuple[int, float, int] | None = None  # last step: tokens, s, slots
        self._pool = SurvivalPool(GATE_POOL)  # recent survivals of running requests
        self.rates = RealisedRates()  # measured tokens/s, drafted vs undrafted steps
        self.explorer = Explorer(  # DSPARK_GATE_WARM_BURSTS: validated in config.py
            warm_bursts=int(os.environ.get(WARM_ENV, WARM_BURSTS)))
        self.paired = PairedBursts()  # each burst vs the steps just before it
        # What the gate's measured verdict reads (validated in config.py): the arms, or
        # the paired bursts; the other is still kept and reported.
        self.measure = self.rates if os.environ.get(GATE_ENV) == "arms" else self.paired
        self.decided_by: dict[str, list[int]] = {}  # source -> [steps undrafted, drafted]
        self._burst_next = self._burst = False  # the next / running step is a burst's
        self._prev_slots = 0  # slots the previous step drafted (what this one verifies)
        self.draft_len = self.max_drafts  # slots drafted per request next step
        self._planned_for = 0  # the running requests the draft length was planned for
        self._source: str | None = None  # what set it, while its count stands (decided_by)
        self._plan: dict = {}  # the plan that set it, for the step trace (_trace_fields)
        log.info("DSpark load-aware budget: policy=%s, step price %s, cost %s (%s)", self.policy,
                 "hull" if self.hull else "envelope", self.cost_model.cost,
                 "profiled" if self.cost_model.profile else "prior")

    # ------------------------------------------------------------------ budget
    def _confidences(self, draft_token_ids) -> list[list[float] | None]:
        conf = getattr(draft_token_ids, "dspark_confidences", None)
        if conf is None:
            return [None] * len(draft_token_ids.req_ids)
        return conf

    def update_draft_token_ids(self, draft_token_ids) -> None:
        t0 = time.perf_counter()
        ids, surv, raws = [], [], []
        confidences = self._confidences(draft_token_ids)
        for i, (req_id, drafts) in enumerate(zip(draft_token_ids.req_ids,
                                                 draft_token_ids.draft_token_ids)):
            req = self.requests.get(req_id)
            if req is None or req.is_finished() or req.is_prefill_chunk or not drafts:
                continue
            conf, raw = confidences[i], None
            if conf is None or len(conf) < len(drafts):
                conf = self.estimator.rates(len(drafts))  # no confidence head: online estimate
            elif self.drift is not None:
                raw = conf[: len(drafts)]
                conf = self.drift.apply(raw)
            nan = sum(1 for c in conf[: len(drafts)] if c is None or not math.isfinite(c))
            if nan:
                self.stats.nan_confidences += nan
            ids.append(i)
            raws.append(raw)
            surv.append(survival(conf[: len(drafts)]))
        num_running = len(self.running)
        token_budget = self.max_num_scheduled_tokens
        counts: list[int] = []  # stays empty on a step that drafted nothing
        if surv:
            if self.policy == "production" and len(self._history) >= 2:
                total = production_budget(self._history[-2], num_running, num_running,
                                          self.cost_model.cost, token_budget, self.hull)
                counts = admit_top(surv, total)
            else:
                counts = admit_greedy(surv, num_running, self.cost_model.cost, token_budget,
                                      self.hull)
            self._history.append(surv)
        for i, s, raw, n in zip(ids, surv, raws, counts):
            drafts = draft_token_ids.draft_token_ids[i]
            self.stats.record_admission(len(drafts), n, s[:n])
            del drafts[n:]  # verify only the admitted prefix
            self._admitted[draft_token_ids.req_ids[i]] = (s[:n], None if raw is None else raw[:n])
        self.stats.record_budget(sum(counts), len(ids))
        self._plan_next_draft(surv, counts, num_running, token_budget,
                              [draft_token_ids.req_ids[i] for i in ids])
        self.stats.schedule_seconds += time.perf_counter() - t0
        draft_s = getattr(draft_token_ids, "dspark_draft_seconds", 0.0)
        rows = getattr(draft_token_ids, "dspark_context_rows", None)
        if rows is not None:
            self.stats.context_rows = dict(zip(("written", "dropped", "owed"), rows))
        self.stats.lookup_blocks = getattr(draft_token_ids, "dspark_lookup_blocks",
                                           self.stats.lookup_blocks)
        self.stats.draft_seconds += draft_s
        self.stats.verify_seconds -= draft_s  # the step time measured below includes drafting
        self._observe_costs(draft_s)
        super().update_draft_token_ids(draft_token_ids)

    def _gate_choice(self, counts, num_running: int, token_budget: int):
        """-> (draft length, predicted gain, verdict, what decided: "verdict", "lean" or
        "prediction", whether to draft) at `num_running`
        requests: the measured verdict (gate.PairedBursts, or the arms with
        DSPARK_GATE_VERDICT=arms) where the predicted gain (budget.plan_draft) is unsure,
        else the prediction. Measurement overrules the prediction only there: a rare batch
        size's few samples (first-shape warm-up, a closed loop's tail) must not switch
        drafting off for a quiet engine where it clearly pays. Where the measurement is
        unsure too (verdict None): from PROVE_MIN_BATCH requests up, do not draft until the
        measurement leans to a win (gate.LEAN_Z; exploration bursts measure it); below, the
        prediction must clear the tie margin: a drafting run pays transitions neither cost
        line sees. Under LOSS_MIN_BATCH requests a measured loss counts as unsure: only a
        win is taken."""
        length, gain = plan_from_mean(self._pool.mean(), counts, num_running,
                                      self.cost_model.cost, self.draft_cost.cost, token_budget,
                                      self.max_drafts, DRAFT_HEADROOM, self.hull)
        verdict = self.measure.verdict(num_running)
        load = bucket(num_running)
        if verdict is False and load < LOSS_MIN_BATCH:
            verdict = None  # a quiet engine: only the prediction turns drafting off (gate.py)
        busy = load >= PROVE_MIN_BATCH
        # No curve for any running request (gain inf: no evidence, draft to learn) says
        # nothing of a busy load the measurement has judged: at 16 requests, once drafting
        # is off the pool empties as its requests finish, and each time it did, the gate
        # drafted again on no evidence (README, 2026-12-05).
        unsure = gain < EXPLORE_MARGIN or (math.isinf(gain) and busy)
        if unsure and verdict is not None:
            return length, gain, verdict, "verdict", verdict
        if gain < EXPLORE_MARGIN and busy:  # an unsure gain must be measured first (gate.py)
            return length, gain, verdict, "lean", leans(self.measure, num_running)
        return length, gain, verdict, "prediction", gain > 1.0 + TIE_MARGIN

    def _plan_next_draft(self, surv, counts, num_running: int, token_budget: int,
                         req_ids=()) -> None:
        """The next step's draft length (_gate_choice); gate.Explorer spends short bursts on
        the other choice where neither the prediction nor the measurement is sure. Decided
        from finished steps only, before the next drafts exist."""
        self._pool.add(req_ids, surv)
        if not num_running:
            self._source = None  # the standing draft length was counted for an earlier step
            self._plan = {}
            return
        length, gain, verdict, decided, chosen = self._gate_choice(counts, num_running,
                                                                   token_budget)
        # A clear measured win is not re-checked either: each burst at one request costs
        # half its steps' tokens. Until a load is judged, its bursts come sooner.
        on = self.explorer.decide(chosen, gain, self.measure.gain(num_running), num_running,
                                  judged=verdict is not None)
        self.draft_len = self.stats.draft_len = length if on else 0
        self._planned_for = num_running
        # What set this state, counted per step (status, /metrics): where drafting ran on
        # a prediction the arms never confirmed, or on exploration alone, shows here.
        self._burst_next = self.explorer.probing
        source = "exploration" if self._burst_next else decided
        self._source = source
        self.decided_by.setdefault(source, [0, 0])[int(self.draft_len > 0)] += 1
        if self.trace is not None:
            self._plan = self._plan_row(gain, source, num_running, length)

    def _plan_row(self, gain: float, source: str, num_running: int, length: int) -> dict:
        mean = self._pool.mean()
        return {"gain": round(gain, 4) if math.isfinite(gain) else None, "source": source,
                "planned_for": num_running, "length": length,
                "step_s": round(self.cost_model.cost.seconds(num_running), 5),
                "draft_s": round(self.draft_cost.cost.seconds(num_running * length), 5),
                "mean": None if mean is None else [round(a, 3) for a in mean]}

    def _recheck_arrivals(self, batch: int) -> None:
        """The plan was made for the requests running after the last step; requests that
        arrived since (a closed loop's next wave, a burst of traffic) can lift the load past
        where drafting pays. Planned drafting is then decided again at the scheduled `batch`
        (_gate_choice, no exploration). Served at 16 requests, each wave arriving after the
        batch had drained made its prefill step draft for all 16, and the step after it
        verify them (a DSPARK_STEP_TRACE of the served sweep, README 2026-12-05). Reads the
        batch's size and past steps only, never a draft's outcome."""
        if not self.draft_len or self._burst_next or bucket(batch) <= bucket(self._planned_for):
            return
        _, gain, *_, chosen = self._gate_choice([], batch, self.max_num_scheduled_tokens)
        self._planned_for = batch
        if chosen:
            return
        if self.trace is not None:
            self._plan = self._plan_row(gain, "arrivals", batch, self.draft_len)
        self.draft_len = self.stats.draft_len = 0
        if self._source is not None:  # the plan counted this step as drafting
            self.decided_by[self._source][1] -= 1
            self._source = None
        self.decided_by.setdefault("arrivals", [0, 0])[0] += 1

    def _observe_costs(self, draft_seconds: float) -> None:
        """Feed the last step's time to the two cost models: the step without its draft
        pass (what verification costs) and the draft pass by drafted slots."""
        if self._pending is None:
            return
        tokens, seconds, slots = self._pending
        self._pending = None
        refit = self.cost_model.observe(tokens, max(seconds - draft_seconds, 1e-6))
        if slots and self.draft_cost.observe(slots, draft_seconds):
            refit = True
        self.stats.cost_refits += int(refit)

    # ---------------------------------------------------------------- feedback
    def _shape_step(self, out):
        self._recheck_arrivals(len(out.num_scheduled_tokens))
        out.num_spec_tokens_to_schedule = min(out.num_spec_tokens_to_schedule, self.draft_len)
        self._burst, self._burst_next = self._burst_next, False
        if out.num_scheduled_tokens and not out.num_spec_tokens_to_schedule:
            self.stats.skipped_drafts += 1
        return out

    def _observe_step(self, scheduler_output, sampled, seconds: float) -> None:
        self._pending = (self._step_tokens, seconds, self._step_slots)
        self.stats.verify_seconds += seconds
        self._observe_rate(scheduler_output, sampled, seconds)

    def update_from_output(self, scheduler_output, model_runner_output):
        sampled = model_runner_output.sampled_token_ids
        for req_id, spec in scheduler_output.scheduled_spec_decode_tokens.items():
            idx = model_runner_output.req_id_to_index.get(req_id)
            if not spec or idx is None or not sampled:
                continue
            accepted = max(len(sampled[idx]) - 1, 0)
            self.estimator.update(len(spec), accepted)
            survivals, raw = self._admitted.pop(req_id, ([], None))
            self.stats.record_outcome(survivals, accepted)
            if raw is not None:  # [: len(spec)]: slots vLLM itself trimmed were never verified
                self.drift.update(raw[: len(spec)], accepted)
        return super().update_from_output(scheduler_output, model_runner_output)  # + the ledger

    def _observe_rate(self, scheduler_output, sampled, seconds: float) -> None:
        """Feed every step to the ledger, and a pure-decode step to the gate's arms: drafted
        if it verified drafts and drafted again, undrafted if neither (between: transitions)."""
        drafted, prev, self._prev_slots = self._step_slots > 0, self._prev_slots > 0, self._step_slots
        prefill, tokens = self._file_step(scheduler_output, sampled, seconds, drafted)
        batch, clean = len(scheduler_output.num_scheduled_tokens), drafted == prev and not prefill
        self.paired.observe(self._burst, batch, drafted, tokens if clean else None, seconds)
        if clean:  # not a transition, no prefill tokens in the step
            self.rates.observe(batch, drafted, tokens, seconds)

    def _trace_fields(self) -> dict:
        """The plan that set this step's draft length: predicted gain (null: no evidence,
        infinite), what decided (`source`, as decided_by), the load it was planned for and
        the predicted seconds of an undrafted step and of the draft pass (`step_s`,
        `draft_s`) and the pool's mean survival curve it read."""
        return self._plan

    def _free_request(self, request, *args, **kwargs):
        self._admitted.pop(request.request_id, None)
        self._pool.forget(request.request_id)  # the gate's prediction is for running requests
        return super()._free_request(request, *args, **kwargs)

    def _status(self) -> dict:
        return {**super()._status(), "policy": self.policy,
                "step_price": "hull" if self.hull else "envelope", "cost_model": {
                    "alpha_s": self.cost_model.cost.alpha, "beta_s_per_token": self.cost_model.cost.beta,
                    "refits": self.cost_model.refits, "profiled_points": len(self.cost_model.profile),
                    "step_seconds_by_tokens": self.cost_model.table(),
                    # the profile's measured departures from the line (StepCost.dev)
                    "deviation_s_by_tokens": {str(t): d for t, d in self.cost_model.cost.dev}},
                "draft_cost": {"alpha_s": self.draft_cost.cost.alpha,
                               "beta_s_per_slot": self.draft_cost.cost.beta},
                "draft_len": self.draft_len,
                "gate": {"verdict_by": "paired" if self.measure is self.paired else "arms",
                         "tokens_per_second_by_batch": self.rates.table(),
                         "exploration_bursts": self.explorer.bursts,
                         "paired_bursts_by_batch": self.paired.table(),
                         "decided_by": {k: {"undrafted": v[0], "drafted": v[1]}
                                        for k, v in sorted(self.decided_by.items())},
                         "exploration_every": {str(b): n for b, n in
                                               sorted(self.explorer.interval.items())},
                         "warm_bursts_by_batch": {str(b): n for b, n in
                                                  sorted(self.explorer.warm.items())}},
                "fallback_acceptance": self.estimator.rates(self.max_drafts),
                "confidence_drift": None if self.drift is None else self.drift.ratios(),
                "tracked_requests": len(self._admitted)}
