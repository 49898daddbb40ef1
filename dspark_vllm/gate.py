"""The draft gate's measured half: tokens per second the engine really produced.

budget.next_draft_len predicts whether drafting pays from confidences and two cost lines.
A prediction carries two biases a busy engine cannot afford: confidences run optimistic off
the training mix, and the cost lines miss what a drafted step spends outside the target
forward and the draft pass (rejection sampling, bookkeeping). So the gate also keeps two
arms per batch size: generated tokens / wall seconds of pure-decode steps that drafted and
verified, and of steps that did neither. Where the prediction is unsure (gain under
EXPLORE_MARGIN) and the arms are sure, their comparison is the verdict; elsewhere the
prediction decides. Sure means: drafting loses or ties and the arms' noise could not hide
a gain of EXPLORE_MARGIN (Z_SURE standard errors), or it wins by more than that noise.
A step's rate at one load varies 11-20% here (tokens accepted, prefill neighbours, the
machine), so point estimates of a few samples read a true tie as a 3-30% win: at 13-16
requests (a served step log, prefix cache on) the arms read 1.03-1.38x and kept drafting
on for runs of 56-160 steps, while the same run's clean steps were level (173.8 vs 173.7
tok/s) and each drafting run also paid its transitions.

Exploration: a short burst of the other arm every PROBE_EVERY steps (PROBE_WARM_EVERY at a
busy load the measurement has not judged yet), but only where drafting is off or neither the
prediction nor the arms say it clearly pays, so a quiet engine, where
drafting clearly pays, never spends a step finding that out again. A burst that leaves the
gate's choice at its load unchanged doubles that load's interval (up to PROBE_MAX_EVERY); one
that changes it resets the interval: a steady busy engine, where bursts keep confirming
"do not draft", stops paying for them (11% of its steps at 16 requests before, each burst's
first step a draft pass nothing verifies).

Which measurement gives the verdict: PairedBursts (below) by default, RealisedRates' arms
with DSPARK_GATE_VERDICT=arms. At one request a step's rate is that request's acceptance,
which moves with the prompt; the arms, each fed at its own moments, read drafting behind
after a run of hard prompts and switched it off where it paid (served: 0.92x the best fixed
draft length against 1.00x with the paired verdict, README).

Causality: the arms read finished steps only; no draft is admitted or dropped because of
how it turned out (admission stays budget.admit_greedy's), only the next step's draft length.
"""

from __future__ import annotations

import math

# Tuning constants, each with its reason.
PROBE_EVERY = 32  # steps in one state before a burst of the other: ~1/9 of steps at the margin
PROBE_BURST = 4  # steps per burst; the first is a transition (not sampled), 3 clean samples
PROBE_MAX_EVERY = 512  # the interval's ceiling after confirming bursts: ~40 s at 16 requests
                       # here, so a change in the traffic's predictability is still found
PROBE_WARM_EVERY = 10  # steps between bursts at a load the measurement has not judged yet:
                       # 1 transition + PAIR_NEIGHBOURS clean steps before each burst, a
                       # margin of 3. At PROBE_EVERY a verdict needs 3+ bursts, ~110+ steps,
                       # run on the prediction alone (at 16 requests: drafting at a loss for
                       # 200+ steps of each new server, 0.87-0.92x plain in its first minute)
EXPLORE_MARGIN = 1.3  # predicted gains above this are not worth re-checking (c=1: ~2-3x)
MEASURED_SURE = 1.5  # nor measured ones above this (c=1 on this CPU: 37 vs 17 tok/s). Higher
                     # than EXPLORE_MARGIN: at 16 requests the arms read 1.35x where the
                     # ledger's totals of the same run were level, so the EWMAs carry ~15% noise
ARM_WEIGHT = 0.1  # EWMA weight of a new sample: ~19 samples (~6 bursts of 3) of memory, so
                  # a drafted arm fed only by bursts is not one burst's luck; still follows drift
MIN_SAMPLES = 2  # clean samples an arm needs before its rate is trusted
TIE_MARGIN = 0.03  # drafting must win by this much: a tie goes to the cheaper, steadier path
                   # (the arms leave out prefill steps and bursts, where drafting costs more);
                   # the prediction must clear it too (DSparkScheduler._plan_next_draft)
Z_SURE = 2.0  # standard errors a measured win must clear to overrule the prediction
RATE_CV_FLOOR = 0.05  # least noise assumed per step's rate: two equal samples prove nothing
PAIR_NEIGHBOURS = 6  # the gate's own clean steps just before a burst that it is judged against
PAIR_FRESH = 48  # steps: older neighbours are stale (the batch's mix has moved on)
PAIRS_KEPT = 16  # recent paired bursts per load: ~16 x 4 burst steps, still follows drift
MIN_PAIRS = 3  # paired bursts before their mean is trusted
WARM_BURSTS = 8  # PROBE_WARM_EVERY bursts per load at most until its verdict is in, then
    # PROBE_EVERY. A loss is judged in 3-5 pairs (float32, 16 requests); a modest win needs
    # more: in bfloat16 on an AMX CPU, 16 requests read 1.19x +- 10% on 3 pairs (unsure, so
    # the load stayed undrafted; 4 bursts, one unpaired) and +- 6% on 5 (a sure win). At most
    # ~110 steps (PROBE_WARM_EVERY + PROBE_BURST a burst). DSPARK_GATE_WARM_BURSTS=4: the
    # earlier cap (config.WARM_CAPS)
WARM_MIN_BATCH = 4  # no warm bursts below this load: at one request a pair reads one
    # request's acceptance (~25% noise), so early pairs settle nothing, or settle it wrong.
    # Served with warm bursts at one request, eight per instance never gave a verdict (24-36
    # undrafted burst steps against 16), and four gave one instance a false "do not draft"
    # for 431 steps (0.78x K = 3; README, 2026-12-04). There drafting pays ~1.5x and the
    # prediction is what should decide
LOSS_MIN_BATCH = WARM_MIN_BATCH  # below this load a measured loss does not switch drafting
    # off; the prediction decides (a measured win still counts). Served compiled (2026-12-06),
    # three pairs that happened to agree gave sure losses at one request (0.96x +- 13%) and at
    # two (1.03x +- 8%) while the same servers' arms read drafted steps at 1.5-2.6x undrafted
    # ones there; each left 40% of those steps undrafted (0.93x K = 3 at one request). A
    # false "do not draft" at low load costs a third of a user's speed; a false "draft" is
    # bounded by the prediction, which already reads the drafter's confidences
PROVE_MIN_BATCH = 9  # from this load up, drafting the prediction is unsure of (gain under
    # EXPLORE_MARGIN) waits for the measurement to lean to a win (LEAN_Z): unmeasured, the
    # tie goes to the cheaper path.
    # Served at 9-14 requests (16-request windows draining, 2026-12-05) drafted steps made
    # 0.92-1.05x plain's tokens per second at the same batch while the prediction read
    # 1.11-1.22x at 12 (step traces, README), and one instance whose pairs stayed unsure (1.04x +- 7%,
    # 4 pairs) drafted on the prediction at 16 for 294 steps and read 0.87x plain. Not lower:
    # at 5-8 drafting made 1.10-1.48x, and from 4 requests up (tried first) the pairs' noise
    # at 4 left the verdict unsure and drafting off (0.12 verified drafts a request-step at 4
    # requests, 1.91 in the 2026-12-04 sweep)
LEAN_Z = 1.0  # from PROVE_MIN_BATCH up, while the verdict is unsure: draft if the measured
    # win clears the tie margin by this many standard errors (about 5 in 6 one-sided). At
    # PAIRS_KEPT pairs of this noise Z_SURE proves no win under ~1.14x: served at 16 requests
    # (bf16, AMX, 2026-12-06) the pairs read 1.12x +- 5% (11 pairs), unsure, and drafting
    # stayed off for 78% of the steps that the step trace measured drafted at 1.17x undrafted
    # (0.93x K = 2's throughput). The instance above that drafted at a loss (1.04x +- 7%)
    # stays off: 1.04x is within one standard error of the tie margin


# Student's t at 97.5% by degrees of freedom (1-15: PAIRS_KEPT pairs at most); 1.96 beyond.
# A few pairs' spread is itself a guess: 3 pairs that happen to agree are not 16.
_T975 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13)


def t_widen(dof: int) -> float:
    """How much wider a standard error read off dof + 1 samples must be taken than a known
    one, at the same confidence (Student's t against the normal)."""
    return _T975[dof - 1] / 1.96 if 1 <= dof <= len(_T975) else 1.0


def judge(excess: float, noise: float, z: float = Z_SURE,
          headroom: float = math.inf) -> bool | None:
    """The measured verdict's rule, shared by both readings. `excess`: drafting's measured
    advantage beyond the tie margin; `noise`: its standard error; `headroom`: how far above
    the tie line the gains lie that the verdict is asked about (the caller consults it only
    where the predicted gain is under EXPLORE_MARGIN), in the same units.
    A loss or tie (excess <= 0) is sure, do not draft, when the reading also rules out such a
    gain by z standard errors: a tie goes to the cheaper path, but a noisy reading of a loss
    can hide a real win. At one request a burst's steps read that request's acceptance, so
    3-4 pairs carry ~25% noise, and they read drafting that the step ledger measured at 1.55x
    as a loss often enough to switch it off for most of a run (README, 2026-12-04).
    A win is sure only beyond z standard errors: draft. Between: None, unsure (the caller
    falls back on its prediction)."""
    if excess <= 0:
        return False if excess + z * noise < headroom else None
    return True if excess > z * noise else None


def leans(measure, batch: int) -> bool:
    """An unsure verdict's lean at this load: drafting wins beyond LEAN_Z standard errors
    (by the same rule, judge, as the verdict; `measure`: RealisedRates or PairedBursts)."""
    return measure.verdict(batch, LEAN_Z) is True


def bucket(batch: int) -> int:
    """Batch sizes that share arms: exact up to 4, then 2-wide to 8, then 4-wide.
    (Closed-loop load wanders by a few requests; exact keys would starve the arms.)"""
    if batch <= 4:
        return batch
    if batch <= 8:
        return 2 * ((batch + 1) // 2)
    return 4 * ((batch + 3) // 4)


class RealisedRates:
    """Exponentially weighted mean and variance of each step's tokens per second, per
    (batch bucket, drafted) arm."""

    def __init__(self, weight: float = ARM_WEIGHT, min_samples: int = MIN_SAMPLES,
                 tie_margin: float = TIE_MARGIN, z: float = Z_SURE,
                 margin: float = EXPLORE_MARGIN) -> None:
        self.weight, self.min_samples, self.tie_margin, self.z = weight, min_samples, tie_margin, z
        self.margin = margin  # the largest gain the verdict is asked about (judge's headroom)
        self.arms: dict[tuple[int, bool], list[float]] = {}  # -> [samples, mean, variance]

    def observe(self, batch: int, drafted: bool, tokens: int, seconds: float) -> None:
        if batch <= 0 or seconds <= 0:
            return
        x = tokens / seconds
        arm = self.arms.setdefault((bucket(batch), drafted), [0, x, 0.0])
        w, d = self.weight, x - arm[1]
        arm[0] += 1
        arm[1] += w * d
        arm[2] = (1.0 - w) * (arm[2] + w * d * d)  # West's incremental EW variance

    def rate(self, batch: int, drafted: bool) -> float | None:
        """Generated tokens per second of the arm, None until it has MIN_SAMPLES."""
        arm = self.arms.get((bucket(batch), drafted))
        if arm is None or arm[0] < self.min_samples:
            return None
        return arm[1]

    def _stderr(self, batch: int, drafted: bool) -> float:
        """Standard error of the arm's mean: an EWMA averages ~(2 - w) / w samples, fewer
        while the arm is young; the variance is floored at RATE_CV_FLOOR of the mean."""
        n, mean, var = self.arms[(bucket(batch), drafted)]
        var = max(var, (RATE_CV_FLOOR * mean) ** 2)
        return math.sqrt(var * max(self.weight / (2.0 - self.weight), 1.0 / n))

    def verdict(self, batch: int, z: float | None = None) -> bool | None:
        """Does drafting produce more tokens per second at this load? False: it does not
        win by the tie margin; True: it wins by more than Z_SURE (or `z`) standard errors
        beyond the margin; None: not measured, or a win the arms' noise could explain (the
        caller falls back on its prediction)."""
        on, off = self.rate(batch, True), self.rate(batch, False)
        if on is None or off is None:
            return None
        noise = math.hypot(self._stderr(batch, True),
                           (1.0 + self.tie_margin) * self._stderr(batch, False))
        return judge(on - off * (1.0 + self.tie_margin), noise, self.z if z is None else z,
                     off * (self.margin - 1.0 - self.tie_margin))

    def gain(self, batch: int) -> float | None:
        """Measured tokens per second drafting over not drafting at this load; None until
        both arms hold MIN_SAMPLES."""
        on, off = self.rate(batch, True), self.rate(batch, False)
        return None if on is None or off is None or off <= 0 else on / off

    def table(self) -> dict[str, dict[str, float | None]]:
        keys = sorted({b for b, _ in self.arms})
        return {str(b): {"drafted_tok_s": self.rate(b, True),
                         "undrafted_tok_s": self.rate(b, False)} for b in keys}


class Explorer:
    """When to spend a burst of steps on the arm the gate would not choose."""

    def __init__(self, every: int = PROBE_EVERY, burst: int = PROBE_BURST,
                 margin: float = EXPLORE_MARGIN, measured_margin: float = MEASURED_SURE,
                 max_every: int = PROBE_MAX_EVERY, warm_every: int = PROBE_WARM_EVERY,
                 warm_bursts: int = WARM_BURSTS, warm_min_batch: int = WARM_MIN_BATCH) -> None:
        self.every, self.burst, self.max_every = every, burst, max(max_every, every)
        self.warm_every, self.warm_bursts = min(warm_every, every), warm_bursts
        self.warm_min_batch = warm_min_batch
        self.warm: dict[int, int] = {}  # load bucket -> bursts it had before being judged
        self.margin, self.measured_margin = margin, measured_margin
        self.streak = 0  # steps since the last burst ended
        self.left = 0  # steps left in the current burst
        self.arm = False  # the state a burst runs in
        self.bursts = 0
        self.probing = False  # the last decision was a burst's (not the gate's choice)
        self.interval: dict[int, int] = {}  # load bucket -> steps between its bursts
        self._probe: tuple[int, bool] | None = None  # the running burst: (bucket, choice before)

    def decide(self, on: bool, gain: float, measured: float | None = None,
               batch: int = 0, judged: bool = True) -> bool:
        """The state the next step runs in: `on` (the gate's choice) or, in a burst, not on.
        Drafting off is always re-checked; drafting on only where neither the predicted
        `gain` (< margin) nor the `measured` one (< measured_margin, None: unmeasured) is
        sure. `batch`: the running requests, whose bucket keeps its own interval.
        `judged`: whether the measured verdict at this load is in (False, at warm_min_batch
        requests or more: bursts come every warm_every steps, up to warm_bursts of them, so
        it comes in sooner, then every `every` steps, the interval not growing, until it is).
        Served at 16 requests (2026-12-06) the interval grew to 512 steps while the verdict
        was unsure, and the pairs reached 9 only by the end of the run."""
        self.probing = bool(self.left)
        if self.left:
            self.left -= 1
            return self.arm
        key = bucket(batch) if batch > 0 else 0
        measuring = not judged and key >= self.warm_min_batch  # a busy load, unjudged
        if self._probe is not None:  # the first decision after a burst: did it change ours?
            probed, before = self._probe
            self._probe = None
            if probed == key:
                # An unjudged busy load's bursts confirm nothing: they are its measurement
                # (gate.LEAN_Z reads them), so they keep coming every `every` steps.
                grown = min(2 * self.interval.get(key, self.every), self.max_every)
                self.interval[key] = grown if on == before and not measuring else self.every
        self.streak += 1
        sure = gain >= self.margin or (measured is not None and measured >= self.measured_margin)
        unsure = not on or not sure
        warming = measuring and self.warm.get(key, 0) < self.warm_bursts
        if unsure and self.streak >= (self.warm_every if warming else
                                      self.interval.get(key, self.every)):
            self.streak, self.left, self.arm = 0, self.burst - 1, not on
            self.bursts += 1
            if warming:
                self.warm[key] = self.warm.get(key, 0) + 1
            self._probe = (key, on)
            self.probing = True
            return self.arm
        return on


class PairedBursts:
    """Each exploration burst judged against the gate's own arm just before it, at one load.

    RealisedRates compares two EWMAs fed at different times: one arm from long runs, the
    other from bursts minutes apart. Whatever drifts between them (the batch's context
    lengths and prefill neighbours, 13 vs 16 requests inside one bucket) reads as a gain or
    a loss. Here a burst's clean steps are compared with the (up to PAIR_NEIGHBOURS) clean
    steps of the other arm that ran just before it at the same load, one log-ratio
    log(drafted / undrafted tokens per second) per burst; the drift they share cancels.
    Each side's rate is its steps' tokens over their seconds (a ratio of sums, what the
    engine produced), never a mean of per-step rates: at one request a drafted step makes
    1 to 8 tokens, and the mean of log rates (a geometric mean) reads such an arm ~16% low
    (tests/test_gate_paired.py), enough to read a real win as a loss.
    Bursts start on the explorer's timer, not on how steps turned out, so their pairs are
    an unbiased sample; the gate's own switches are left out (they follow a verdict, so the
    steps before them are selected). The verdict reads the mean of the recent pairs and
    its standard error, with RealisedRates' rule (judge): a loss or tie (mean under the tie margin)
    is sure if it also rules out EXPLORE_MARGIN's gain by Z_SURE standard errors; a win must
    clear Z_SURE standard errors beyond the tie margin.
    """

    def __init__(self, neighbours: int = PAIR_NEIGHBOURS, fresh: int = PAIR_FRESH,
                 kept: int = PAIRS_KEPT, min_pairs: int = MIN_PAIRS,
                 tie_margin: float = TIE_MARGIN, z: float = Z_SURE,
                 sd_floor: float = RATE_CV_FLOOR, margin: float = EXPLORE_MARGIN) -> None:
        self.neighbours, self.fresh, self.kept, self.min_pairs = neighbours, fresh, kept, min_pairs
        self.tie, self.z, self.sd_floor = math.log1p(tie_margin), z, sd_floor
        self.headroom = math.log(margin) - self.tie  # judge's, in log gain
        self.step = 0
        # bucket -> (step, drafted, (tokens, seconds)) of recent clean steps
        self.recent: dict[int, list[tuple[int, bool, tuple[float, float]]]] = {}
        self.pairs: dict[int, list[float]] = {}  # bucket -> log(drafted / undrafted), per burst
        self._open: tuple[int, bool, list, list] | None = None  # the running burst: (bucket,
        # its arm, the neighbours' (tokens, seconds), its own clean steps' (tokens, seconds))

    @staticmethod
    def _log_rate(steps: list[tuple[float, float]]) -> float:
        """log(tokens / seconds) over the steps together."""
        return math.log(sum(t for t, _ in steps) / sum(s for _, s in steps))

    def observe(self, burst: bool, batch: int, drafted: bool, tokens: float | None,
                seconds: float = 1.0) -> None:
        """One finished step: `burst`, whether the explorer ran it; `drafted`, its arm;
        `tokens`, what it generated if it was a clean pure-decode step, else None;
        `seconds`, its length."""
        self.step += 1
        key = bucket(batch) if batch > 0 else 0
        ts = (tokens, seconds) if tokens is not None and tokens > 0 and seconds > 0 else None
        if burst:
            if self._open is None:  # its first step: take the neighbours now
                before = [x for s, d, x in self.recent.get(key, ())
                          if d != drafted and self.step - s <= self.fresh][-self.neighbours:]
                self._open = (key, drafted, before, [])
            k, arm, _, own = self._open
            if ts is not None and key == k and drafted == arm:
                own.append(ts)
            return
        if self._open is not None:  # the burst is over: one pair, if both sides were seen
            k, arm, before, own = self._open
            self._open = None
            if before and own:
                d = self._log_rate(own) - self._log_rate(before)
                pairs = self.pairs.setdefault(k, [])
                pairs.append(d if arm else -d)
                del pairs[:-self.kept]
        if ts is not None:
            recent = self.recent.setdefault(key, [])
            recent.append((self.step, drafted, ts))
            del recent[:-2 * self.neighbours]

    def summary(self, batch: int) -> tuple[int, float, float] | None:
        """(pairs, log of the mean gain, its standard error, widened for few pairs by
        t_widen) at this load; None before MIN_PAIRS. The pairs' gains are averaged as
        ratios, not as logs: a pair's drafted side is a few steps of 1-8 tokens each, and
        the mean of log ratios reads such noise as a loss (Jensen: ~6% in the one-request
        test); the mean of the ratios is unbiased where the noisy side is the numerator, as
        it is there. The error is the ratios' relative one (the delta method's, in log
        units)."""
        d = self.pairs.get(bucket(batch), ())
        n = len(d)
        if n < self.min_pairs:
            return None
        g = [math.exp(x) for x in d]
        mean = sum(g) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in g) / (n - 1)) / mean
        return n, math.log(mean), max(sd, self.sd_floor) / math.sqrt(n) * t_widen(n - 1)

    def verdict(self, batch: int, z: float | None = None) -> bool | None:
        """Does drafting produce more tokens per second at this load, burst by burst?
        False: the mean gain is under the tie margin and their spread rules out
        EXPLORE_MARGIN's gain; True: over it by Z_SURE (or `z`) standard errors; None: too
        few pairs, or a loss or win their spread could explain."""
        s = self.summary(batch)
        return None if s is None else judge(s[1] - self.tie, s[2], self.z if z is None else z,
                                            self.headroom)

    def gain(self, batch: int) -> float | None:
        s = self.summary(batch)
        return None if s is None else math.exp(s[1])

    def table(self) -> dict[str, dict[str, float]]:
        out = {}
        for b in sorted(self.pairs):
            s = self.summary(b)
            if s is not None:
                out[str(b)] = {"pairs": s[0], "gain": round(math.exp(s[1]), 4),
                               "log_gain_stderr": round(s[2], 4),
                               "verdict": judge(s[1] - self.tie, s[2], self.z, self.headroom)}
        return out
