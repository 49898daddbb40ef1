"""The draft gate's measured arms and its exploration schedule (gate.py), at tiny sizes."""

import math

from dspark_vllm.budget import StepCost, next_draft_len, plan_draft, survival
from dspark_vllm.gate import Explorer, PairedBursts, RealisedRates, bucket
from dspark_vllm.step_ledger import StepLedger

COST = StepCost(alpha=0.02, beta=0.0012)
DRAFT = StepCost(alpha=0.003, beta=0.0004)


def test_buckets_are_monotone_and_exact_at_low_load():
    assert [bucket(b) for b in (1, 2, 3, 4)] == [1, 2, 3, 4]
    assert bucket(5) == bucket(6) == 6 and bucket(7) == bucket(8) == 8
    assert bucket(13) == bucket(16) == 16 and bucket(17) == 20
    seq = [bucket(b) for b in range(1, 65)]
    assert seq == sorted(seq) and all(bucket(b) >= b for b in range(1, 65))


def test_verdict_needs_both_arms_then_compares_tokens_per_second():
    r = RealisedRates(weight=0.5, min_samples=2)
    assert r.verdict(16) is None
    for _ in range(3):
        r.observe(16, True, tokens=24, seconds=0.20)  # 120 tok/s drafting
    assert r.verdict(16) is None  # the undrafted arm is unmeasured
    r.observe(16, False, tokens=16, seconds=0.10)
    assert r.verdict(16) is None  # one sample is not enough
    r.observe(15, False, tokens=15, seconds=0.10)  # 15 shares 16's bucket
    # undrafted EWMA: tokens 16 -> 15.5, seconds 0.10 -> 150 tok/s > 120: do not draft
    assert math.isclose(r.rate(16, False), 155.0)
    assert r.verdict(16) is False
    assert r.verdict(8) is None  # another load is measured separately
    for _ in range(6):  # traffic drifts: drafting now accepts more
        r.observe(16, True, tokens=40, seconds=0.20)
    assert r.verdict(16) is True
    table = r.table()
    assert set(table) == {"16"} and table["16"]["drafted_tok_s"] > 190


def test_a_tie_goes_to_not_drafting_and_a_lucky_sample_proves_nothing():
    r = RealisedRates(min_samples=1, tie_margin=0.03)
    r.observe(16, True, 102, 1.0)
    r.observe(16, False, 100, 1.0)
    assert r.verdict(16) is False  # 2% is inside the margin
    r.observe(16, True, 150, 1.0)
    assert r.gain(16) > 1.03 and r.verdict(16) is None  # a win noise explains: unsure
    for _ in range(30):  # a steady 30% win
        r.observe(16, True, 130, 1.0)
        r.observe(16, False, 100, 1.0)
    assert r.verdict(16) is True


def test_noisy_arms_of_a_true_tie_rarely_claim_a_win_but_find_a_real_one():
    """Per-step rates at one load vary ~15% here. Drafted samples come in bursts of 3
    between runs of undrafted ones, as the explorer feeds them."""
    import random

    def claims(true_gain: float, seed: int) -> float:
        rng, r, wins, n = random.Random(seed), RealisedRates(), 0, 0
        for burst in range(300):
            for _ in range(3):
                r.observe(16, True, round(rng.gauss(100 * true_gain, 15)), 1.0)
            for _ in range(10):
                r.observe(16, False, round(rng.gauss(100, 15)), 1.0)
                n, wins = n + 1, wins + (r.verdict(16) is True)
        return wins / n

    assert claims(1.0, 1) < 0.03  # point estimates alone (z = 0): ~33-39% of decisions
    assert claims(1.3, 2) > 0.9


def test_bad_samples_are_ignored():
    r = RealisedRates(min_samples=1)
    r.observe(0, True, 5, 0.1)
    r.observe(4, True, 5, 0.0)
    assert r.arms == {}


def test_explorer_rechecks_off_always_and_on_only_when_unsure():
    ex = Explorer(every=4, burst=2, margin=1.3)
    # Sure drafting (gain 3x, nothing measured): never a burst.
    assert all(ex.decide(True, 3.0) for _ in range(50)) and ex.bursts == 0
    ex = Explorer(every=4, burst=2, margin=1.3)
    states = [ex.decide(False, 0.8) for _ in range(12)]
    # Off: the 4th step starts a 2-step drafting burst (then, still off, the interval grows).
    assert states == [False, False, False, True, True] + [False] * 7
    ex = Explorer(every=4, burst=2, margin=1.3)
    states = [ex.decide(True, 1.1) for _ in range(6)]  # on, but only just
    assert states == [True, True, True, False, False, True]


def test_bursts_back_off_while_they_confirm_the_choice_and_reset_when_it_changes():
    ex = Explorer(every=4, burst=2, margin=1.3, max_every=16)
    starts, prev = [], False
    for i in range(80):
        state = ex.decide(False, 0.8, batch=16)
        if state and not prev:
            starts.append(i)
        prev = state
    # Intervals 4, 8, 16, 16, ... steps (the first of them the burst's end): every burst
    # confirmed "off".
    assert starts == [3, 12, 29, 46, 63]
    # A burst after which the gate's choice changed resets its load's interval.
    ex = Explorer(every=4, burst=2, margin=1.3, max_every=16)
    for _ in range(5):
        ex.decide(False, 0.8, batch=16)  # 3 off, then a 2-step burst
    assert ex.interval == {}
    ex.decide(False, 0.8, batch=16)
    assert ex.interval == {16: 8}
    for _ in range(8):
        ex.decide(False, 0.8, batch=16)  # 6 off, the next burst's 2 steps
    assert ex.decide(True, 1.1, batch=16) is True  # the burst turned the choice on
    assert ex.interval == {16: 4}
    # Loads keep separate intervals: bursts confirmed at 16 do not stretch 4's.
    ex = Explorer(every=4, burst=2, margin=1.3, max_every=16)
    for _ in range(29):
        ex.decide(False, 0.8, batch=16)  # bursts at 3 and 12, the third due at 29
    assert ex.interval == {16: 16} and ex.streak == 15
    # At 4 requests the same 16 steps since the last burst are past 4's interval.
    assert [ex.decide(False, 0.8, batch=4) for _ in range(4)] == [True, True, False, False]
    assert ex.interval == {16: 16, 4: 8}


def test_bursts_come_sooner_until_the_load_is_judged_and_at_most_warm_bursts_times():
    def starts(ex, steps, judged, batch=16):
        out, prev = [], False
        for i in range(steps):
            state = ex.decide(True, 1.1, batch=batch, judged=judged(i))  # on, only just
            if not state and prev:
                out.append(i)
            prev = state
        return out

    # Judged: the usual interval (every = max_every = 20).
    def explorer():
        return Explorer(every=20, burst=2, max_every=20, warm_every=5, warm_bursts=3)

    assert starts(explorer(), 70, lambda i: True) == [19, 40, 61]
    # Not judged yet: every 5 steps after a burst, three times, then every 20.
    ex = explorer()
    assert starts(ex, 70, lambda i: False) == [4, 10, 16, 37, 58] and ex.warm == {16: 3}
    # Judged after the second warm burst: back to the usual interval at once.
    ex = explorer()
    assert starts(ex, 70, lambda i: i > 12) == [4, 10, 31, 52] and ex.warm == {16: 2}
    # Each load warms on its own: 4 requests, not judged, get their own warm bursts; below
    # warm_min_batch (4) none.
    starts(ex, 10, lambda i: False, batch=4)
    assert ex.warm == {16: 2, 4: 2}
    starts(ex, 30, lambda i: False, batch=2)
    assert 2 not in ex.warm


def test_an_unjudged_busy_load_keeps_its_bursts_coming():
    def starts(batch, judged):
        ex = Explorer(every=4, burst=2, margin=1.3, max_every=16, warm_bursts=0)
        out, prev = [], False
        for i in range(60):
            state = ex.decide(False, 0.8, batch=batch, judged=judged)
            if state and not prev:
                out.append(i)
            prev = state
        return out

    assert starts(16, judged=True) == [3, 12, 29, 46]  # confirmed "off": the interval grows
    assert starts(16, judged=False) == list(range(3, 60, 5))  # measuring: the interval stays 4
    assert starts(2, judged=False) == [3, 12, 29, 46]  # under warm_min_batch: as judged


def test_a_burst_keeps_its_arm_when_the_verdict_flips_mid_burst():
    ex = Explorer(every=2, burst=3)
    assert ex.decide(False, 0.5) is False
    assert ex.decide(False, 0.5) is True  # burst starts: drafting
    assert ex.decide(True, 0.5) is True  # verdict flipped to on: the burst still drafts
    assert ex.decide(True, 0.5) is True


def test_plan_draft_matches_next_draft_len():
    pool = [survival([0.9] * 7)] * 8
    length, gain = plan_draft(pool, [3], 1, COST, DRAFT, 10_000, 7)
    assert length == 4 and gain > 1.3  # quiet engine: drafting clearly pays
    assert next_draft_len(pool, [3], 1, COST, DRAFT, 10_000, 7) == 4
    doubtful = [survival([0.3] + [0.5] * 6)] * 8
    length, gain = plan_draft(doubtful, [1] * 16, 16, COST, DRAFT, 10_000, 7)
    assert gain < 1.0 and next_draft_len(doubtful, [1] * 16, 16, COST, DRAFT, 10_000, 7) == 0
    assert plan_draft([], [], 4, COST, DRAFT, 10_000, 7) == (7, math.inf)


def _step(batch: int, spec_per_req: int, prefill: int = 0):
    from types import SimpleNamespace

    ids = [f"r{i}" for i in range(batch)]
    chunk = {"p": prefill} if prefill else {}  # a request whose prompt chunk rides along
    return SimpleNamespace(
        num_scheduled_tokens={**{r: 1 + spec_per_req for r in ids}, **chunk},
        scheduled_spec_decode_tokens={r: [7] * spec_per_req for r in ids if spec_per_req},
        total_num_scheduled_tokens=batch * (1 + spec_per_req) + prefill)


def test_scheduler_feeds_only_clean_pure_decode_steps_to_the_arms():
    from types import SimpleNamespace

    from dspark_vllm.ledger_scheduler import LedgerScheduler
    from dspark_vllm.scheduler import DSparkScheduler

    fake = SimpleNamespace(rates=RealisedRates(min_samples=1), ledger=StepLedger(),
                           paired=PairedBursts(), _burst=False,
                           _prev_slots=0, _step_slots=0, running=[object()], trace=None)
    fake._file_step = lambda *a: LedgerScheduler._file_step(fake, *a)
    observe = DSparkScheduler._observe_rate
    fake._step_slots = 8  # off -> on: verifies nothing, drafts: a transition
    observe(fake, _step(4, 0), [[1]] * 4, 0.1)
    assert fake.rates.arms == {}
    observe(fake, _step(4, 2), [[1, 2, 3]] * 4, 0.2)  # on, steady: 12 tokens in 0.2 s
    assert fake.rates.rate(4, True) == 60.0
    observe(fake, _step(4, 2, prefill=30), [[1]] * 4, 0.5)  # a prefill chunk rode along
    assert fake.rates.arms[(4, True)][0] == 1
    fake._step_slots = 0  # on -> off: verifies, drafts nothing: a transition
    observe(fake, _step(4, 2), [[1, 2]] * 4, 0.2)
    observe(fake, _step(4, 0), [[1]] * 4, 0.1)  # off, steady: 40 tok/s
    assert fake.rates.rate(4, False) == 40.0 and fake.rates.verdict(4) is True
    # The paired tracker saw every step, and kept the clean ones' tokens and seconds.
    assert fake.paired.step == 5
    assert [(d, round(t), s) for _, d, (t, s) in fake.paired.recent[4]] == [(True, 12, 0.2),
                                                                           (False, 4, 0.1)]
    # The ledger saw every step, each under its kind, with its prefill tokens.
    ledger = fake.ledger.table()
    assert sum(row["steps"] for row in ledger.values()) == 5
    assert ledger["prefill_verify_draft"] == {"steps": 1, "seconds": 0.5, "generated_tokens": 4,
                                              "prefill_tokens": 30, "cycle_seconds": 0.0}
    assert ledger["decode_noverify_draft"]["steps"] == 1  # the off -> on transition
    assert ledger["decode_verify_nodraft"]["generated_tokens"] == 8  # the on -> off one
    assert ledger["decode_verify_draft"]["seconds"] == 0.2
    assert fake._last_kind == "decode_noverify_nodraft"  # its cycle ends at the next schedule()
    # The same steps by load: four scheduled 4 requests; the prefill chunk made a fifth.
    by_load = fake.ledger.by_load()
    assert list(by_load) == ["4", "6"] and by_load["4"]["decode_verify_draft"]["seconds"] == 0.2
    assert sum(r["steps"] for r in by_load["4"].values()) == 4
    assert by_load["6"] == {"prefill_verify_draft": {"steps": 1, "seconds": 0.5,
                                                     "generated_tokens": 4, "prefill_tokens": 30}}


def test_the_step_trace_writes_every_step_as_a_json_line(tmp_path, monkeypatch):
    import json
    import os
    from types import SimpleNamespace

    import pytest

    from dspark_vllm.ledger_scheduler import LedgerScheduler, StepTrace

    fake = SimpleNamespace(ledger=StepLedger(), running=[object()], waiting=[object()] * 3,
                           _step_slots=8, trace=StepTrace(str(tmp_path / "trace")),
                           _trace_fields=lambda: {"gain": 1.25})  # a subclass's fields
    LedgerScheduler._file_step(fake, _step(4, 2, prefill=30), [[1, 2, 3]] * 4, 0.25, True)
    LedgerScheduler._file_step(fake, _step(4, 0), [[1]] * 4, 0.1, False)
    rows = [json.loads(line) for line in
            (tmp_path / "trace" / f"steps-{os.getpid()}.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["prefill_verify_draft", "decode_noverify_nodraft"]
    assert {k: rows[0][k] for k in ("batch", "waiting", "tokens", "prefill", "verified",
                                    "slots", "generated", "seconds")} == {
        "batch": 5, "waiting": 3, "tokens": 42, "prefill": 30, "verified": 8, "slots": 8,
        "generated": 12, "seconds": 0.25}
    assert rows[0]["gain"] == rows[1]["gain"] == 1.25
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="DSPARK_STEP_TRACE=.*file.*writable directory"):
        StepTrace(str(tmp_path / "file"))


def test_a_failed_trace_write_stops_the_trace_not_the_engine(tmp_path):
    from dspark_vllm.ledger_scheduler import StepTrace

    class Full:
        def write(self, _):
            raise OSError(28, "No space left on device")

    trace = StepTrace(str(tmp_path))
    trace.file = Full()
    trace.write(batch=1)  # no exception: the trace stops
    assert trace.file is None
    trace.write(batch=2)


def test_the_ledger_files_steps_by_load_bucket():
    ledger = StepLedger()
    ledger.observe("decode_verify_draft", 0.14, 23, 0, batch=16)
    ledger.observe("decode_verify_draft", 0.07, 9, 0, batch=3)
    ledger.observe("decode_noverify_nodraft", 0.09, 15, 0, batch=15)  # 15 shares 16's bucket
    ledger.observe("prefill_noverify_nodraft", 0.3, 16, 200)  # no batch given: by kind only
    ledger.cycle("decode_verify_draft", 0.5)
    assert ledger.by_load() == {
        "3": {"decode_verify_draft": {"steps": 1, "seconds": 0.07, "generated_tokens": 9,
                                      "prefill_tokens": 0}},
        "16": {"decode_noverify_nodraft": {"steps": 1, "seconds": 0.09, "generated_tokens": 15,
                                           "prefill_tokens": 0},
               "decode_verify_draft": {"steps": 1, "seconds": 0.14, "generated_tokens": 23,
                                       "prefill_tokens": 0}}}
    assert ledger.table()["decode_verify_draft"]["steps"] == 2


def _fake_scheduler(pool):
    from types import SimpleNamespace

    from dspark_vllm.budget import SurvivalPool
    from dspark_vllm.cost_model import CostModel
    from dspark_vllm.scheduler import DSparkScheduler

    survivals = SurvivalPool(64)
    survivals.add([f"req-{i}" for i in range(len(pool))], pool)
    fake = SimpleNamespace(_pool=survivals, cost_model=CostModel(prior=COST),
                           draft_cost=CostModel(prior=DRAFT), max_drafts=7, hull=True,
                           rates=RealisedRates(min_samples=1), explorer=Explorer(every=10_000),
                           paired=PairedBursts(),
                           stats=SimpleNamespace(draft_len=7), draft_len=7, decided_by={},
                           trace=None, _plan={})
    fake.measure = fake.rates
    fake._plan_row = lambda *a: DSparkScheduler._plan_row(fake, *a)
    fake._gate_choice = lambda *a: DSparkScheduler._gate_choice(fake, *a)
    return fake


def test_a_traced_step_carries_the_plan_that_set_its_draft_length():
    from dspark_vllm.scheduler import DSparkScheduler

    pool = [survival([0.9] * 7)] * 8
    fake = _fake_scheduler(pool)
    DSparkScheduler._plan_next_draft(fake, [], [], 1, 10_000)
    assert DSparkScheduler._trace_fields(fake) == {}  # no trace: nothing is built
    fake.trace = object()
    DSparkScheduler._plan_next_draft(fake, [], [], 1, 10_000)
    row = DSparkScheduler._trace_fields(fake)
    length, gain = plan_draft(pool, [], 1, COST, DRAFT, 10_000, 7)
    assert row["gain"] == round(gain, 4) and row["length"] == length == fake.draft_len
    assert row["source"] == "prediction" and row["planned_for"] == 1
    assert row["step_s"] == round(COST.seconds(1), 5)
    assert row["draft_s"] == round(DRAFT.seconds(length), 5)
    assert row["mean"] == [round(a, 3) for a in survival([0.9] * 7)]
    DSparkScheduler._plan_next_draft(fake, [], [], 0, 10_000)  # idle: no plan stands
    assert DSparkScheduler._trace_fields(fake) == {}


def test_measurement_overrules_only_an_unsure_prediction():
    from dspark_vllm.scheduler import DSparkScheduler

    plan = DSparkScheduler._plan_next_draft
    sure = [survival([0.9] * 7)] * 8
    fake = _fake_scheduler(sure)
    assert plan_draft(sure, [], 1, COST, DRAFT, 10_000, 7)[1] > 1.3
    for _ in range(3):  # a few odd samples at one request say drafting loses
        fake.rates.observe(1, True, 2, 0.2)
        fake.rates.observe(1, False, 1, 0.02)
    plan(fake, [], [], 1, 10_000)
    assert fake.draft_len > 0  # the prediction is sure: keep drafting
    # A busy engine where the prediction only just favours drafting: measurement decides,
    # and until it does the tie goes to the cheaper path (gate.PROVE_MIN_BATCH).
    p = next(p / 100 for p in range(30, 100)
             if 1.05 < plan_draft([survival([p / 100] * 7)] * 8, [], 16, COST, DRAFT, 10_000,
                                  7)[1] < 1.3)
    unsure = [survival([p] * 7)] * 8
    fake = _fake_scheduler(unsure)
    plan(fake, [], [], 16, 10_000)
    assert fake.draft_len == 0  # nothing measured yet: not drafted on an unsure gain
    fake.rates.observe(16, True, 48, 0.2)  # measured: drafted steps 240 tok/s, undrafted 160
    fake.rates.observe(16, False, 16, 0.1)
    plan(fake, [], [], 16, 10_000)
    assert fake.draft_len > 0
    fake = _fake_scheduler(unsure)
    fake.rates.observe(16, True, 20, 0.2)
    fake.rates.observe(16, False, 16, 0.1)
    plan(fake, [], [], 16, 10_000)
    assert fake.draft_len == 0  # measured: undrafted steps produce more tokens per second


def test_the_ledger_reaches_prometheus_through_the_snapshot(tmp_path, monkeypatch):
    """Engine side publishes the ledger in its status; the API server's collector exports
    cycle seconds and steps per kind."""
    from dspark_vllm.metrics import METRICS_ENV, DSparkCollector, DSparkStats

    path = tmp_path / "stats.json"
    monkeypatch.setenv(METRICS_ENV, str(path))
    ledger = StepLedger()
    ledger.observe("decode_verify_draft", 0.10, 24, 0)
    ledger.cycle("decode_verify_draft", 0.12)
    ledger.observe("prefill_noverify_nodraft", 0.30, 16, 200)
    DSparkStats(7).maybe_publish(lambda: {"steps_by_kind": ledger.table()}, force=True)
    families = {f.name: f for f in DSparkCollector(path).collect()}
    cycle = {s.labels["kind"]: s.value for s in families["dspark_step_cycle_seconds"].samples
             if s.name.endswith("_total")}
    assert cycle == {"decode_verify_draft": 0.12, "prefill_noverify_nodraft": 0.0}
    steps = {s.labels["kind"]: s.value for s in families["dspark_steps"].samples
             if s.name.endswith("_total")}
    assert steps == {"decode_verify_draft": 1, "prefill_noverify_nodraft": 1}
    # A plain LedgerScheduler's snapshot (no budget policy) exports the ledger only; the
    # DSpark scheduler's (it names its policy) exports the budget's series too.
    assert "dspark_verify_budget_tokens" not in families
    DSparkStats(7).maybe_publish(lambda: {"policy": "greedy", "steps_by_kind": ledger.table()},
                                 force=True)
    families = {f.name: f for f in DSparkCollector(path).collect()}
    assert {"dspark_verify_budget_tokens", "dspark_steps"} <= set(families)


def test_a_clear_measured_win_is_not_re_checked():
    from dspark_vllm.scheduler import DSparkScheduler

    plan = DSparkScheduler._plan_next_draft
    # One request whose confidences only just favour drafting: the prediction is unsure.
    p = next(p / 100 for p in range(20, 100)
             if 1.0 < plan_draft([survival([p / 100] * 7)] * 8, [], 1, COST, DRAFT, 10_000,
                                 7)[1] < 1.3)
    unsure = [survival([p] * 7)] * 8

    def drafted_share(on_tok_s: float, off_tok_s: float) -> float:
        fake = _fake_scheduler(unsure)
        fake.explorer = Explorer(every=8, burst=4)
        fake.rates.observe(1, True, 1, 1 / on_tok_s)
        fake.rates.observe(1, False, 1, 1 / off_tok_s)
        states = []
        for _ in range(64):
            plan(fake, [], [], 1, 10_000)
            states.append(fake.draft_len > 0)
        return sum(states) / len(states)

    # Measured 37 vs 17 tok/s (one request on this CPU): every step drafts.
    assert drafted_share(37.0, 17.0) == 1.0
    # Measured 35% ahead (what the arms read at 16 requests where the ledger saw a tie):
    # still re-checked in bursts.
    assert drafted_share(23.0, 17.0) < 0.9


def test_the_scheduler_explores_sooner_where_a_busy_load_is_not_judged():
    from dspark_vllm.scheduler import DSparkScheduler

    plan = DSparkScheduler._plan_next_draft

    def bursts(batch: int, measured: bool) -> int:
        p = next(p / 100 for p in range(20, 100)  # confidences the prediction is unsure of
                 if 1.0 < plan_draft([survival([p / 100] * 7)] * 8, [], batch, COST, DRAFT,
                                     10_000, 7)[1] < 1.3)
        fake = _fake_scheduler([survival([p] * 7)] * 8)
        fake.explorer = Explorer(every=40, burst=2, warm_every=5, warm_bursts=3)
        if measured:  # a level reading: drafting does not pay here, and that is sure
            fake.rates.observe(batch, True, 17 * batch, 1.0)
            fake.rates.observe(batch, False, 17 * batch, 1.0)
            assert fake.rates.verdict(batch) is False
        for _ in range(30):
            plan(fake, [], [], batch, 10_000)
        return fake.explorer.bursts

    assert bursts(16, measured=False) == 3  # warm bursts, 5 steps apart
    assert bursts(16, measured=True) == 0  # judged: the first burst is 40 steps away
    assert bursts(1, measured=False) == 0  # one request: the prediction decides alone


def test_an_unmeasured_prediction_must_clear_the_tie_margin():
    """Nothing measured at 3 requests: a predicted gain inside the 3% tie margin does not
    draft (a drafting run pays transitions neither cost line sees); one above it does. At
    16 requests (a busy load, gate.PROVE_MIN_BATCH) neither drafts until measured; a sure
    predicted gain (above EXPLORE_MARGIN) drafts at any load."""
    from dspark_vllm.scheduler import DSparkScheduler

    plan = DSparkScheduler._plan_next_draft

    def drafts(p: float, batch: int) -> bool:
        fake = _fake_scheduler([survival([p] * 7)] * 8)
        plan(fake, [], [], batch, 10_000)
        return fake.draft_len > 0

    for batch, busy in ((3, False), (16, True)):
        gains = {p: plan_draft([survival([p / 10_000] * 7)] * 8, [], batch, COST, DRAFT,
                               10_000, 7)[1] for p in range(1_000, 10_000, 5)}
        tie = next(p for p, g in gains.items() if 1.0 < g < 1.03) / 10_000
        win = next(p for p, g in gains.items() if 1.05 < g < 1.3) / 10_000
        sure = next(p for p, g in gains.items() if 1.35 < g < 3.0) / 10_000
        assert not drafts(tie, batch)
        assert drafts(win, batch) is not busy
        assert drafts(sure, batch)
