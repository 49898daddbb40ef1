"""Load-aware verification budget (DSpark paper, Algorithm 1), as small pure functions.

The causality wall: whether draft x_j of a request is verified may depend on its survival
a_j = c_1 ... c_j, where c_k reads x_{k-1} but never x_k; admission therefore never looks at
the token it admits (a stopping time, Appendix A), and speculative sampling stays exact.
Never admit x_j because of anything computed from x_j or later (e.g. c_{j+1}).
"""

from __future__ import annotations

import bisect
import functools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

# Tuning constants, each with its reason.
MIN_SURVIVAL = 1e-3  # slots this unlikely are never worth a verification token
FALLBACK_PRIOR = 0.5  # conditional acceptance assumed per position before any evidence
ESTIMATOR_DECAY = 0.995  # online acceptance estimate forgets with a ~200-round half-life
DRIFT_PRIOR = 8.0  # confidence units (~13 slots at c = 0.6) before a position's own drift
                   # outweighs the one before it: deep slots are reached rarely


@dataclass(frozen=True)
class StepCost:
    """Seconds of one engine step as a function of the tokens it processes:
    t(T) = alpha + beta * T + dev(T); steps-per-second SPS(T) = 1 / t(T).

    dev is what a start-up profile measured off its own line, as knots (T, seconds)
    interpolated linearly and held flat past the last: small batches need not follow the
    line. On the 2-core CPU with vLLM's oneDNN GEMMs a 2-token step of the bundled target
    costs more than a 4-token one, and a 1-token step does too (`engine_profile shapes`:
    38.0, 32.5 and 34.7 ms; README, "The budget at one request"). Empty: the line alone."""

    alpha: float
    beta: float
    dev: tuple[tuple[int, float], ...] = ()  # (T, measured - line), T ascending

    def seconds(self, tokens: int) -> float:
        return self.alpha + self.beta * tokens + self.deviation(tokens)

    def deviation(self, tokens: int) -> float:
        d = self.dev
        if not d:
            return 0.0
        i = bisect.bisect_left(d, tokens, key=lambda k: k[0])
        if i == len(d):
            return d[-1][1]
        if i == 0 or d[i][0] == tokens:
            return d[i][1]
        (t0, d0), (t1, d1) = d[i - 1], d[i]
        return d0 + (d1 - d0) * (tokens - t0) / (t1 - t0)


def survival(conf: Sequence[float]) -> list[float]:
    """a_j = prod_{k<=j} c_k. A missing or NaN confidence ends the chain (a = 0 onwards)."""
    out, a = [], 1.0
    for c in conf:
        ok = c is not None and math.isfinite(c)
        a = a * min(max(c, 0.0), 1.0) if ok else 0.0
        out.append(a)
    return out


def step_prices(cost: StepCost, base: int, top: int, hull: bool = True) -> list[float]:
    """Seconds Algorithm 1 charges for a step of T tokens, T = base..top (list index T - base).

    The envelope: the cheapest step of T or more tokens the slots on offer reach,
    min over T' in [T, top] of t(T'). Verifying more drafts, whatever they hold, reaches it,
    so a dearer small size (StepCost.dev: on the 2-core CPU 2 tokens cost more than 4) is
    stepped over rather than stopped at.
    The hull (default): the envelope's lower convex hull. The first stop of a greedy scan is
    the best prefix of the sorted slots only when the price is convex (expected tokens grow
    concavely, as survivals fall; their ratio to a convex price is then unimodal); on a
    measured table with a step up (on this CPU 6 -> 7 tokens at 4 requests, 39.9 -> 45.4 ms,
    then nearly flat to 16) the envelope's first stop halts at the step (2 drafts for 4
    requests) although, by the model, two drafts a request make ~29% more goodput. Served
    (README, "Pricing a step by its hull") speed was level with the envelope's at 1-8
    requests, and verified drafts fell with load where the envelope's did not.
    Between two hull corners a step is priced below what it costs (the convex mix of the
    corners' times): admission is optimistic there, as the envelope already is below a
    dearer small size."""
    t = [cost.seconds(T) for T in range(base, top + 1)]
    for i in range(len(t) - 2, -1, -1):
        t[i] = min(t[i], t[i + 1])
    if not hull or len(t) < 3:
        return t
    corners: list[int] = []  # monotone chain: indices of the lower hull, left to right
    for i in range(len(t)):
        while len(corners) >= 2:
            a, b = corners[-2], corners[-1]
            if (t[b] - t[a]) * (i - a) >= (t[i] - t[a]) * (b - a):  # b on or above a..i
                corners.pop()
            else:
                break
        corners.append(i)
    out = []
    for a, b in zip(corners, corners[1:]):
        out += [t[a] + (t[b] - t[a]) * (i - a) / (b - a) for i in range(a, b)]
    return out + [t[corners[-1]]]


def admit_greedy(
    survivals: Sequence[Sequence[float]],  # per request: a_{r,1..K_r}, non-increasing
    base_tokens: int,  # tokens the step runs anyway (one per request, plus prefill chunks)
    cost: StepCost,
    token_budget: int,  # the engine's cap on scheduled tokens
    hull: bool = True,  # price steps by step_prices' convex hull
) -> list[int]:
    """Algorithm 1: number of drafts to verify per request.

    Sort all slots (r, j) by a_{r,j}; admit greedily while the goodput Theta (expected
    accepted tokens per step x steps per second) improves; stop at the first admission
    that does not. Every request emits at least one token per step.
    Whether x_{r,j} is admitted reads a_{r,j} and larger survivals only, never a later
    slot of its own request (whose confidence reads x_{r,j}): a stopping time. A search
    for the best prefix would not be one (it admits x_j because c_{j+1} is high, and c_{j+1}
    reads x_j: audit.peeking_policy, the paper's Appendix A).

    A step of T tokens is priced by step_prices (read only from counts, so the rule stays
    a stopping time): with hull, the lower convex hull of the cheapest step of T or more
    tokens; without, that envelope alone. Where t is convex and rising (a line) both are t
    itself and this is the paper's rule as written.
    """
    slots = sorted(((a, j, r) for r, surv in enumerate(survivals) for j, a in enumerate(surv)),
                   key=lambda s: (-s[0], s[1], s[2]))
    top = max(min(base_tokens + len(slots), token_budget), base_tokens)  # most tokens reachable
    price = step_prices(cost, base_tokens, top, hull)  # price[T - base]
    n = [0] * len(survivals)
    expected, tokens = float(len(survivals)), base_tokens
    theta = expected / price[0]
    for a, j, r in slots:
        if tokens >= token_budget or a < MIN_SURVIVAL:
            break
        # a_{r,j} <= a_{r,j-1}: the sort reaches each request's slots in prefix order.
        assert j == n[r], "survivals must be non-increasing per request"
        new = (expected + a) / price[tokens + 1 - base_tokens]
        if new <= theta:  # the first admission that does not improve goodput: stop
            break
        n[r], expected, tokens, theta = n[r] + 1, expected + a, tokens + 1, new
    return n


def draft_gain(
    survivals: Sequence[Sequence[float]],  # per request: a_{r,1..K_r}
    counts: Sequence[int],  # drafts admitted per request (Algorithm 1)
    base_tokens: int,
    cost: StepCost,  # the step without its draft pass
    draft_cost: StepCost,  # the draft pass, as a function of drafted slots (B x L)
    draft_len: int,  # slots per request the next draft pass would run
) -> float:
    """Beyond the paper: predicted tokens/s with drafting over tokens/s without.

    Algorithm 1 treats drafts as free (they already exist when it runs). They are not: on
    a compute-bound engine the draft pass is a real share of the step. Speculating pays
    when expected tokens per second, with the admitted drafts and the pass that drafts
    them, beat plain decoding: (B + sum a) / (t(T) + d(B L)) > B / t(B). Decided from
    confidences already seen, before the next drafts exist: the causality wall holds.
    0 when nothing is admitted.
    """
    b = len(counts)
    if b == 0 or sum(counts) == 0:
        return 0.0
    expected = b + sum(sum(s[:n]) for s, n in zip(survivals, counts))
    on = expected / (cost.seconds(base_tokens + sum(counts)) + draft_cost.seconds(b * draft_len))
    return on / (b / cost.seconds(base_tokens))


def drafting_pays(survivals, counts, base_tokens, cost, draft_cost, draft_len) -> bool:
    """Does the next step's draft pass pay for itself? (draft_gain > 1)"""
    return draft_gain(survivals, counts, base_tokens, cost, draft_cost, draft_len) > 1.0


def plan_draft(
    pool: Sequence[Sequence[float]],  # survivals of recently drafted requests
    counts: Sequence[int],  # this step's admissions ([] when it drafted nothing)
    num_running: int,
    cost: StepCost,
    draft_cost: StepCost,
    token_budget: int,
    max_drafts: int,
    headroom: int = 1,
    hull: bool = True,
) -> tuple[int, float]:
    """(slots to draft per request if drafting, predicted gain of drafting at all).

    The on/off question is one of load, so the gain reads the pool's mean survival curve
    replicated over today's batch (one doubtful draft must not switch drafting off for a
    quiet engine). The length comes from this step's own admissions (largest budget +
    headroom, so budgets can grow), as in the paper, or from the pool after an off step.
    """
    mean = mean_curve(pool) if pool else None
    return plan_from_mean(mean, counts, num_running, cost, draft_cost, token_budget,
                          max_drafts, headroom, hull)


def mean_curve(pool: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """The pool's mean survival per position; a curve shorter than the longest counts 0
    past its end (nothing was drafted there)."""
    k = max(len(a) for a in pool)
    return tuple(sum(a[j] for a in pool if j < len(a)) / len(pool) for j in range(k))


def plan_from_mean(mean: tuple[float, ...] | None, counts, num_running, cost, draft_cost,
                   token_budget, max_drafts, headroom=1, hull=True) -> tuple[int, float]:
    """plan_draft from the pool's mean curve (None: an empty pool)."""
    if mean is None or num_running <= 0:
        return max_drafts, math.inf  # no evidence yet: draft everything
    length, gain = _plan_at_load(mean, num_running, cost, draft_cost, token_budget,
                                 max_drafts, headroom, hull)
    if counts:
        length = min(max_drafts, max(counts) + headroom)
    return length, gain


@functools.lru_cache(maxsize=256)
def _plan_at_load(mean, num_running, cost, draft_cost, token_budget, max_drafts, headroom,
                  hull) -> tuple[int, float]:
    """Algorithm 1 and the draft gain over `num_running` copies of the mean curve. Pure and
    cached: a step that drafted nothing leaves the pool, and so the mean, as it was, and
    the cost lines change only at a refit; ~0.17 ms a call at 16 requests on this CPU, paid
    every step (one plan a step, a second when requests arrive)."""
    batch = [mean] * num_running
    n = admit_greedy(batch, num_running, cost, token_budget, hull)
    length = min(max_drafts, max(n, default=0) + headroom)
    return length, draft_gain(batch, n, num_running, cost, draft_cost, length)


class SurvivalPool:
    """The survival curves plan_draft reads: the last `size` drafted request-steps, each
    tagged with its request. A request's curves leave with it (`forget`): while the gate
    drafts nothing no new curves arrive, and a pool frozen on a finished request's hard
    prompt kept the next, easy one undrafted until an exploration burst (served at one
    request on 2026-12-04: 35% of request-steps drafted in one repeat before, 98-99% in
    every repeat after; README).
    Once no running request has a curve, the pool is empty: no evidence, draft, and the
    next step's confidences are fresh."""

    def __init__(self, size: int) -> None:
        self._items: deque[tuple[str, Sequence[float]]] = deque(maxlen=size)
        self._mean: tuple[float, ...] | None = None  # mean_curve, until the pool changes

    def add(self, req_ids: Sequence[str], curves: Sequence[Sequence[float]]) -> None:
        if req_ids or curves:
            self._items.extend(zip(req_ids, curves, strict=True))
            self._mean = None

    def forget(self, req_id: str) -> None:
        """Drop a finished request's curves."""
        if any(r == req_id for r, _ in self._items):
            self._items = deque(((r, c) for r, c in self._items if r != req_id),
                                maxlen=self._items.maxlen)
            self._mean = None

    def mean(self) -> tuple[float, ...] | None:
        """mean_curve of the pool; None when it is empty."""
        if self._mean is None and self._items:
            self._mean = mean_curve(self.curves())
        return self._mean

    def curves(self) -> list[Sequence[float]]:
        return [c for _, c in self._items]

    def __len__(self) -> int:
        return len(self._items)


def next_draft_len(pool, counts, num_running, cost, draft_cost, token_budget, max_drafts,
                   headroom: int = 1) -> int:
    """Slots the next step drafts per request from the prediction alone; 0 = no draft
    pass (context K/V only)."""
    length, gain = plan_draft(pool, counts, num_running, cost, draft_cost, token_budget,
                              max_drafts, headroom)
    return length if gain > 1.0 else 0


def admit_top(survivals: Sequence[Sequence[float]], total: int) -> list[int]:
    """Production variant, second half: rank the current step's slots by fresh survival
    and admit the top `total` (prefix order per request is kept by the sort)."""
    slots = sorted(((a, j, r) for r, surv in enumerate(survivals) for j, a in enumerate(surv)),
                   key=lambda s: (-s[0], s[1], s[2]))
    n = [0] * len(survivals)
    for a, j, r in slots[:max(total, 0)]:
        if a < MIN_SURVIVAL:
            break
        n[r] = j + 1
    return n


def production_budget(stale: Sequence[Sequence[float]], num_requests: int, base_tokens: int,
                      cost: StepCost, token_budget: int, hull: bool = True) -> int:
    """Production variant, first half: the batch's total budget from confidences two
    steps old (known before this step's drafts exist, so the scheduler never waits), at
    today's load: the stale requests' Algorithm-1 admissions, scaled to the live batch."""
    if not stale:
        return 0
    per_request = sum(admit_greedy(stale, base_tokens, cost, token_budget, hull)) / len(stale)
    return min(int(round(per_request * num_requests)), max(token_budget - base_tokens, 0))


class AcceptanceEstimator:
    """Online per-position conditional acceptance rates, the confidence of drafters
    without a confidence head. Fed only with verification outcomes already observed."""

    def __init__(self, max_positions: int, decay: float = ESTIMATOR_DECAY,
                 prior: float = FALLBACK_PRIOR) -> None:
        self.decay = decay
        self.reached = [2.0] * max_positions  # a weak prior of two pseudo-observations
        self.accepted = [2.0 * prior] * max_positions

    def update(self, num_verified: int, num_accepted: int) -> None:
        for k in range(min(num_accepted + 1, num_verified)):
            self.reached[k] = self.reached[k] * self.decay + 1.0
            self.accepted[k] = self.accepted[k] * self.decay + float(k < num_accepted)

    def rates(self, k: int) -> list[float]:
        return [a / r for a, r in zip(self.accepted[:k], self.reached[:k])]


class ConfidenceDrift:
    """Beyond the paper, experimental (DSPARK_CONFIDENCE_DRIFT=1): the drafter's confidences
    rescaled, per position, to the acceptance the served traffic really gets. A confidence
    head is calibrated offline on held-out blocks of its training mix; served prompts are
    accepted less often (at one request on 2026-12-04 the conditional acceptance per position
    was 0.47-0.67, the calibration set's 0.70-0.73; the learnt ratios 0.72-0.95), so
    survivals read high and Algorithm 1 admits deep drafts that cost more than they return
    (README, "The budget at one request").

    r_k = realised acceptances / predicted conditional confidences over the verified slots
    that reached position k, forgetting as AcceptanceEstimator does; a position with little
    evidence leans on the one before (DRIFT_PRIOR pseudo-units at r_{k-1}; r_1's prior is 1,
    no drift). c'_k = c_k r_k (survival() clips to [0, 1]). Causal: fed only outcomes already
    verified; no draft's admission reads its own outcome."""

    def __init__(self, max_positions: int, decay: float = ESTIMATOR_DECAY,
                 prior: float = DRIFT_PRIOR) -> None:
        self.decay, self.prior = decay, prior
        self.predicted = [0.0] * max_positions  # decayed sums of c_k over reached slots
        self.realised = [0.0] * max_positions  # decayed counts of accepted ones among them
        self._ratios: list[float] | None = None  # ratios() until the next update

    def update(self, conf: Sequence[float], num_accepted: int) -> None:
        """conf: the raw conditional confidences of one request's verified slots."""
        self._ratios = None
        for k in range(min(num_accepted + 1, len(conf), len(self.predicted))):
            c = conf[k]
            if c is None or not math.isfinite(c):
                break
            self.predicted[k] = self.predicted[k] * self.decay + min(max(c, 0.0), 1.0)
            self.realised[k] = self.realised[k] * self.decay + float(k < num_accepted)

    def ratios(self) -> list[float]:
        """r_1..r_K, computed once per update: apply() reads them for every request a step."""
        if self._ratios is None:
            out, prev = [], 1.0
            for p, a in zip(self.predicted, self.realised):
                prev = (a + self.prior * prev) / (p + self.prior)
                out.append(prev)
            self._ratios = out
        return self._ratios

    def apply(self, conf: Sequence[float]) -> list[float]:
        r = self.ratios()
        return [c * r[k] if k < len(r) and c is not None and math.isfinite(c) else c
                for k, c in enumerate(conf)]
