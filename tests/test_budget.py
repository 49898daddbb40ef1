"""Load-aware verification budget: Algorithm 1 properties, on tiny synthetic inputs."""

import itertools
import math
import random

import pytest

from dspark_vllm.budget import (AcceptanceEstimator, ConfidenceDrift, StepCost, admit_greedy,
                                admit_top, drafting_pays, next_draft_len, production_budget,
                                step_prices, survival)

COST = StepCost(alpha=0.060, beta=0.0012)  # the shape measured on CPU engines


def _random_survivals(rng, n, k=7):
    return [survival([rng.uniform(0.3, 1.0) for _ in range(k)]) for _ in range(n)]


def test_survival_is_a_cumulative_product_and_stops_at_nan():
    assert survival([0.5, 0.5, 1.0]) == [0.5, 0.25, 0.25]
    assert survival([0.9, float("nan"), 0.9]) == [0.9, 0.0, 0.0]
    assert survival([0.9, None, 0.9])[1:] == [0.0, 0.0]


@pytest.mark.parametrize("seed", range(20))
def test_admission_is_a_prefix_and_within_the_token_budget(seed):
    rng = random.Random(seed)
    surv = _random_survivals(rng, rng.randint(1, 40))
    budget = rng.randint(len(surv), len(surv) + 60)
    n = admit_greedy(surv, len(surv), COST, budget)
    assert all(0 <= x <= 7 for x in n)  # a count is a prefix: drafts 1..n
    assert len(surv) + sum(n) <= budget


@pytest.mark.parametrize("seed", range(20))
def test_higher_load_never_raises_the_budget(seed):
    rng = random.Random(seed)
    surv = _random_survivals(rng, 4)
    budgets = []
    for extra in range(0, 64, 4):  # more requests in the batch without drafts
        n = admit_greedy(surv + [[] for _ in range(extra)], 4 + extra, COST, 10_000)
        budgets.append(n[:4])
    for lo, hi in zip(budgets, budgets[1:]):
        assert all(b <= a for a, b in zip(lo, hi))


def test_quiet_engine_verifies_confident_drafts_busy_engine_fewer():
    surv = [survival([0.9] * 7)]
    quiet = admit_greedy(surv, 1, COST, 10_000)[0]
    busy = admit_greedy(surv * 32, 32, COST, 10_000)[0]
    assert quiet >= 4 and busy < quiet


def test_greedy_stops_at_the_first_non_improving_admission():
    # Two requests: one sure, one hopeless; goodput stops before the hopeless ones.
    n = admit_greedy([[0.99, 0.98], [0.01, 0.001]], 2, COST, 100)
    assert n == [2, 0]


def _first_stop(survivals, base_tokens, cost, token_budget):
    """Slow reference: the paper's rule as written (stop at the first admission that does
    not improve the goodput)."""
    slots = sorted(((a, j, r) for r, surv in enumerate(survivals) for j, a in enumerate(surv)),
                   key=lambda s: (-s[0], s[1], s[2]))
    n, expected, tokens = [0] * len(survivals), float(len(survivals)), base_tokens
    theta = expected / cost.seconds(tokens)
    for a, _, r in slots:
        if tokens >= token_budget or a < 1e-3:
            break
        new = (expected + a) / cost.seconds(tokens + 1)
        if new <= theta:
            break
        n[r], expected, tokens, theta = n[r] + 1, expected + a, tokens + 1, new
    return n


class _Table:
    """A measured step-time table (seconds by batch tokens, 1-based; flat past its end)."""

    def __init__(self, seconds):
        self.t = list(seconds)

    def seconds(self, tokens):
        return self.t[min(tokens, len(self.t)) - 1]


@pytest.mark.parametrize("seed", range(30))
def test_where_the_cost_rises_with_tokens_it_is_the_papers_rule_as_written(seed):
    rng = random.Random(seed)
    surv = [survival([rng.uniform(0.0, 1.0) for _ in range(rng.randint(0, 7))])
            for _ in range(rng.randint(1, 20))]
    budget = rng.randint(len(surv), len(surv) + 80)
    line = StepCost(alpha=rng.uniform(0.01, 0.1), beta=rng.uniform(0.0002, 0.01))
    convex = _Table(itertools.accumulate(sorted(rng.uniform(0.0, 0.01) for _ in range(200))))
    rising = _Table(itertools.accumulate(rng.uniform(0.0, 0.01) for _ in range(200)))
    for cost in (line, convex):
        for hull in (True, False):
            assert admit_greedy(surv, len(surv), cost, budget, hull) == _first_stop(
                surv, len(surv), cost, budget)
    # rising: concave and convex stretches, as measured tables are; the envelope is t itself
    assert admit_greedy(surv, len(surv), rising, budget, hull=False) == _first_stop(
        surv, len(surv), rising, budget)


def _hull_prices(cost, base, top):
    """Slow reference: the largest convex function under the envelope min_{T' >= T} t(T'),
    by the best chord over every pair of points around T."""
    env = [min(cost.seconds(u) for u in range(T, top + 1)) for T in range(base, top + 1)]
    return [min(env[a] + (env[b] - env[a]) * (i - a) / (b - a) if b > a else env[i]
                for a in range(i + 1) for b in range(i, len(env)))
            for i in range(len(env))]


@pytest.mark.parametrize("seed", range(30))
def test_hull_prices_are_the_convex_envelope_below_every_reachable_step(seed):
    rng = random.Random(seed)
    cost = _Table([rng.uniform(0.02, 0.06) for _ in range(60)])
    base = rng.randint(1, 20)
    top = rng.randint(base, 60)
    got = step_prices(cost, base, top)
    assert got == pytest.approx(_hull_prices(cost, base, top), rel=1e-9)
    env = step_prices(cost, base, top, hull=False)
    assert all(h <= e + 1e-12 for h, e in zip(got, env))
    assert all(b - a <= c - b + 1e-12 for a, b, c in zip(got, got[1:], got[2:]))  # convex


@pytest.mark.parametrize("seed", range(30))
def test_on_a_measured_table_the_first_stop_is_the_best_prefix_at_hull_prices(seed):
    """With the hull, stopping at the first admission that does not raise the goodput
    finds the best of all prefixes of the sorted slots: expected tokens are concave in the
    prefix, the price convex, so the goodput has one peak and nothing need be searched."""
    rng = random.Random(seed)
    surv = [survival([rng.uniform(0.0, 1.0) for _ in range(rng.randint(0, 7))])
            for _ in range(rng.randint(1, 8))]
    budget = rng.randint(len(surv), len(surv) + 40)
    cost = _Table(itertools.accumulate(rng.uniform(0.0, 0.01) for _ in range(200)))
    b = len(surv)
    n = admit_greedy(surv, b, cost, budget)
    slots = sorted((a for s in surv for a in s if a >= 1e-3), reverse=True)
    top = max(min(b + sum(len(s) for s in surv), budget), b)
    price = _hull_prices(cost, b, top)
    goodput = [(b + sum(slots[:m])) / price[m] for m in range(min(len(slots), top - b) + 1)]
    assert (b + sum(sum(s[:k]) for s, k in zip(surv, n))) / price[sum(n)] == pytest.approx(
        max(goodput), rel=1e-9)


def test_a_step_up_in_the_table_does_not_stop_admission_short_of_the_flat_beyond():
    # 4 requests on this CPU's profile (ms): 4-6 tokens 40, 7 tokens 45.4, then ~0.6 ms a
    # token to 16. The envelope stops at 6 tokens, two requests with one draft each.
    table = _Table([0.040] * 6 + [0.0454 + 0.0006 * i for i in range(40)])
    surv = [survival([0.7, 0.65, 0.6])] * 4
    assert admit_greedy(surv, 4, table, 10_000, hull=False) == [1, 1, 0, 0]
    n = admit_greedy(surv, 4, table, 10_000)
    assert min(n) >= 2
    real = [(4 + sum(sum(s[:k]) for s, k in zip(surv, m))) / table.seconds(4 + sum(m))
            for m in (n, [1, 1, 0, 0])]
    assert real[0] > 1.2 * real[1]  # priced or not, the real goodput is higher


@pytest.mark.parametrize("seed", range(30))
def test_admission_never_reads_a_later_slot_of_its_own_request(seed):
    """The causality wall as a property: whether x_{r,j} is verified may not change when the
    survivals after it (whose confidences read x_{r,j}) change, dear small sizes included."""
    rng = random.Random(seed)
    cost = _Table([0.0245, 0.029, 0.0235, 0.024, 0.0262, 0.0275, 0.030, 0.031] +
                  [0.031 + 0.0015 * i for i in range(1, 120)])
    surv = [survival([rng.uniform(0.0, 1.0) for _ in range(7)]) for _ in range(rng.randint(1, 4))]
    n = admit_greedy(surv, len(surv), cost, 10_000)
    for r in range(len(surv)):
        for j in range(7):
            changed = [list(s) for s in surv]
            cap = changed[r][j]  # later slots stay at or below slot j's survival
            changed[r][j + 1:] = sorted((rng.uniform(0.0, cap) for _ in range(6 - j)), reverse=True)
            m = admit_greedy(changed, len(surv), cost, 10_000)
            assert (m[r] > j) == (n[r] > j), (r, j, surv, changed)


# A quiet CPU engine's measured shape (cost_model.deviations): 2 tokens dearer than 3 or 4.
HUMP = StepCost(alpha=0.022, beta=0.0005, dev=((1, 0.002), (2, 0.006), (3, 0.0)))


def test_deviations_interpolate_between_knots_and_hold_past_the_last():
    assert HUMP.deviation(2) == 0.006 and HUMP.deviation(3) == 0.0 and HUMP.deviation(9) == 0.0
    assert HUMP.seconds(2) == pytest.approx(0.022 + 0.001 + 0.006)
    c = StepCost(0.02, 0.001, dev=((1, 0.0), (4, 0.003), (16, -0.004)))
    assert c.deviation(2) == pytest.approx(0.001) and c.deviation(64) == -0.004
    assert StepCost(0.02, 0.001).deviation(5) == 0.0


def test_a_dearer_small_batch_is_stepped_over_not_stopped_at():
    # t(1) = 24.5 ms, t(2) = 29 ms, t(3) = 23.5 ms, t(4) = 24 ms: one doubtful draft does not
    # pay for the 2-token step, three drafts do. Priced by t alone, the first stop admits
    # none; priced by the cheapest step the slots can reach, it goes on to 3.
    surv = [survival([0.15, 0.66, 0.8])]
    assert _first_stop(surv, 1, HUMP, 100) == [0]
    assert admit_greedy(surv, 1, HUMP, 100) == [3]
    assert admit_greedy(surv, 1, HUMP, 3) == [2]  # within the engine's token budget


DRAFT = StepCost(alpha=0.003, beta=0.0004)


def test_drafting_pays_for_confident_quiet_batches_not_for_doubtful_busy_ones():
    sure = [survival([0.9] * 7)]
    n = admit_greedy(sure, 1, COST, 10_000)
    assert drafting_pays(sure, n, 1, COST, DRAFT, max(n) + 1)
    doubtful = [survival([0.3] + [0.5] * 6)] * 16
    n = admit_greedy(doubtful, 16, COST, 10_000)
    assert sum(n) > 0  # Algorithm 1 alone would verify them: the drafts look free to it
    assert not drafting_pays(doubtful, n, 16, COST, DRAFT, max(n) + 1)
    assert not drafting_pays(sure, [0], 1, COST, DRAFT, 1)  # nothing admitted: never


def test_drafting_pays_hand_computed():
    # B=2, one slot each with a=0.5: on = 3 / (t(4) + d(2*2)), off = 2 / t(2).
    cost, draft = StepCost(0.1, 0.01), StepCost(0.0, 0.005)
    on, off = 3 / (0.14 + 0.02), 2 / 0.12  # 18.75 vs 16.67
    assert (on > off) == drafting_pays([[0.5], [0.5]], [1, 1], 2, cost, draft, 2)
    assert not drafting_pays([[0.5], [0.5]], [1, 1], 2, cost, StepCost(0.0, 0.01), 2)


@pytest.mark.parametrize("seed", range(10))
def test_higher_load_never_turns_drafting_on(seed):
    rng = random.Random(seed)
    surv = _random_survivals(rng, 1)
    on = []
    for b in (1, 2, 4, 8, 16, 32, 64):
        batch = surv * b
        n = admit_greedy(batch, b, COST, 10_000)
        on.append(drafting_pays(batch, n, b, COST, DRAFT, min(max(n) + 1, 7)))
    assert on == sorted(on, reverse=True)  # once off as load rises, it stays off


def test_next_draft_len_reads_the_pool_not_one_doubtful_draft():
    pool = [survival([0.9] * 7)] * 63 + [survival([0.05] * 7)]  # one doubtful request
    # Quiet engine, this step admitted nothing for its one (doubtful) request: keep drafting.
    assert next_draft_len(pool, [0], 1, COST, DRAFT, 10_000, 7) == 1
    assert next_draft_len(pool, [3], 1, COST, DRAFT, 10_000, 7) == 4  # budget + headroom
    assert next_draft_len(pool, [], 1, COST, DRAFT, 10_000, 7) >= 4  # after an off step
    doubtful = [survival([0.3] + [0.5] * 6)] * 64
    assert next_draft_len(doubtful, [1] * 16, 16, COST, DRAFT, 10_000, 7) == 0  # busy: off
    assert next_draft_len([], [], 4, COST, DRAFT, 10_000, 7) == 7  # no evidence yet


def test_survival_pool_keeps_only_running_requests_and_its_size():
    from dspark_vllm.budget import SurvivalPool

    from dspark_vllm.budget import mean_curve

    pool = SurvivalPool(4)
    pool.add(["a", "b"], [[0.9], [0.2]])
    pool.add(["a", "c", "c"], [[0.8], [0.3], [0.4]])
    assert len(pool) == 4 and pool.curves() == [[0.2], [0.8], [0.3], [0.4]]  # newest 4
    assert pool.mean() == mean_curve(pool.curves())
    pool.forget("c")
    assert pool.curves() == [[0.2], [0.8]] and pool.mean() == mean_curve([[0.2], [0.8]])
    pool.add([], [])  # a step that drafted nothing: the kept mean still holds
    pool.add(["d"] * 3, [[0.5]] * 3)  # still bounded after pruning
    assert len(pool) == 4 and pool.curves()[0] == [0.8]
    assert pool.mean() == mean_curve([[0.8], [0.5], [0.5], [0.5]])
    for req in "abd":
        pool.forget(req)
    assert pool.curves() == [] and pool.mean() is None
    assert mean_curve([[0.9, 0.5], [0.3]]) == (0.6, 0.25)  # shorter curves count 0 past the end


def test_a_finished_hard_request_does_not_keep_the_next_one_undrafted():
    """One request at a time, drafting off on a hard prompt: no new curves arrive, so the
    pool must not go on speaking for that prompt once it has finished."""
    from dspark_vllm.scheduler import DSparkScheduler
    from tests.test_gate import _fake_scheduler

    plan = DSparkScheduler._plan_next_draft
    hard = [survival([0.05] * 7)] * 8
    fake = _fake_scheduler(hard)
    plan(fake, [], [], 1, 10_000)
    assert fake.draft_len == 0  # the hard request runs: do not draft
    for i in range(len(hard)):  # it finished (DSparkScheduler._free_request); a new one came
        fake._pool.forget(f"req-{i}")
    plan(fake, [], [], 1, 10_000)
    assert fake.draft_len == 7  # no evidence for the running request: draft, and learn
    easy = [survival([0.9] * 7)]
    plan(fake, easy, [6], 1, 10_000, ["next"])
    assert fake.draft_len == 7 and fake._pool.curves() == easy


def test_admit_top_keeps_prefixes_and_total():
    surv = [[0.9, 0.5], [0.8, 0.7]]
    assert admit_top(surv, 3) == [1, 2]
    assert admit_top(surv, 0) == [0, 0]


def test_production_budget_reads_only_the_stale_confidences():
    stale = [survival([0.9] * 7)] * 4
    total = production_budget(stale, 4, 4, COST, 10_000)
    # Fresh confidences only rank the slots; the total does not change with them.
    fresh_a = admit_top([survival([0.99] * 7)] * 4, total)
    fresh_b = admit_top([survival([0.2] * 7)] * 4, total)
    assert sum(fresh_a) == total
    assert sum(fresh_b) <= total
    assert production_budget(stale, 4, 4, COST, 10_000) == total


def test_estimator_learns_conditional_rates():
    est = AcceptanceEstimator(3, decay=1.0, prior=0.5)
    for _ in range(200):
        est.update(3, 3)  # always all accepted
    assert all(r > 0.95 for r in est.rates(3))
    est2 = AcceptanceEstimator(3, decay=1.0)
    for _ in range(200):
        est2.update(3, 0)  # first always rejected: later positions never reached
    r = est2.rates(3)
    assert r[0] < 0.05 and math.isclose(r[1], 0.5) and math.isclose(r[2], 0.5)


def _served(drift, rng, conf, true, rounds):
    """Verify `rounds` blocks whose slot k the head rates conf[k] but is accepted with
    conditional probability true[k]; feed the outcomes to the drift."""
    for _ in range(rounds):
        accepted = 0
        while accepted < len(true) and rng.random() < true[accepted]:
            accepted += 1
        drift.update(conf, accepted)


def test_drift_learns_how_far_served_acceptance_falls_below_the_confidences():
    rng, conf, true = random.Random(0), [0.8, 0.8, 0.8], [0.4, 0.6, 0.8]
    drift = ConfidenceDrift(3, decay=1.0)
    assert drift.ratios() == [1.0, 1.0, 1.0]  # no evidence: the confidences as they are
    _served(drift, rng, conf, true, 4000)
    for got, want in zip(drift.apply(conf), true):
        assert abs(got - want) < 0.05
    # The budget then admits fewer drafts: survivals fall.
    assert survival(drift.apply(conf))[-1] < 0.5 * survival(conf)[-1]


def test_drift_leans_on_the_position_before_where_it_has_little_evidence():
    rng = random.Random(1)
    drift = ConfidenceDrift(4, decay=1.0)
    _served(drift, rng, [0.9, 0.9, 0.9, 0.9], [0.45, 0.0, 0.0, 0.0], 400)  # slot 3 never reached
    r = drift.ratios()
    assert abs(r[0] - 0.5) < 0.1 and r[1] < 0.1  # slot 2: reached and always rejected
    assert r[2] == r[1] and r[3] == r[1]  # never reached: the shallower slot's ratio


def test_drift_keeps_missing_confidences_missing_and_survival_clipped():
    drift = ConfidenceDrift(3, decay=1.0)
    for _ in range(200):
        drift.update([0.5, 0.5, 0.5], 3)  # accepted twice as often as rated
    out = drift.apply([0.9, float("nan"), None])
    assert out[0] > 1.0 and math.isnan(out[1]) and out[2] is None
    assert survival(out) == [1.0, 0.0, 0.0]
    before = drift.ratios()
    drift.update([float("nan"), 0.5], 2)  # a NaN confidence ends what the update reads
    assert drift.ratios() == before
