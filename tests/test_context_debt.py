"""The drafter's deferred context (context_debt.py): rows owed by steps that draft nothing,
written later in one pass, must leave every cache slot as the step-by-step writes would."""

import pytest
import torch

from dspark_vllm.context_debt import ContextDebt, Rows, latest_per_slot


def _step(slots: list[int], first_pos: int = 0, feat_dim: int = 3) -> Rows:
    n = len(slots)
    pos = torch.arange(first_pos, first_pos + n)
    # Row features encode (step-unique value) so the test can tell which write won.
    feats = torch.rand(n, feat_dim)
    return Rows(feats, pos, torch.tensor(slots, dtype=torch.int64))


def _replay(steps: list[Rows], cache_size: int = 64) -> torch.Tensor:
    """Step-by-step writes: what the cache holds when every step writes at once."""
    cache = torch.zeros(cache_size, steps[0].feats.shape[1])
    for r in steps:
        ok = r.slots >= 0
        cache[r.slots[ok]] = r.feats[ok]
    return cache


def _apply(rows: Rows | None, cache: torch.Tensor) -> torch.Tensor:
    if rows is not None:
        assert rows.slots.unique().numel() == rows.slots.numel(), "one row per slot"
        cache[rows.slots] = rows.feats
    return cache


def test_a_deferred_write_equals_the_step_by_step_writes():
    torch.manual_seed(0)
    debt = ContextDebt()
    steps = []
    # Two requests (slots 0-15 and 32-47); step 3 re-records request a's slots 5-6 (a
    # rejected draft's positions, verified again later) and has a padding row.
    layouts = [([0, 1, 2, 3], [32, 33]), ([4, 5, 6], [34]), ([7], [35, 36]),
               ([5, 6, -1], [37])]
    for a, b in layouts:
        r = _step(a + b)
        steps.append(r)
        debt.record(["a", "b"], [0, len(a), len(a) + len(b)], r)
    assert len(debt) == sum(len(a) + len(b) for a, b in layouts)
    got = _apply(debt.take(), torch.zeros(64, 3))
    assert torch.equal(got, _replay(steps))
    assert len(debt) == 0 and debt.take() is None


def test_taking_one_owner_leaves_the_others_in_step_order():
    torch.manual_seed(1)
    debt = ContextDebt()
    s1, s2 = _step([0, 1, 10]), _step([2, 1, 11])
    debt.record(["a", "b"], [0, 2, 3], s1)
    debt.record(["a", "b"], [0, 2, 3], s2)
    a = debt.take({"a", "gone-already"})
    assert a.slots.tolist() == [0, 2, 1]  # slot 1: the later row (step 2), order kept
    assert torch.equal(a.feats[2], s2.feats[1]) and torch.equal(a.feats[0], s1.feats[0])
    assert debt.owners() == {"b"} and len(debt) == 2
    debt.record(["c"], [0, 1], _step([12]))
    assert debt.discard({"c", "never-owed"}) == 1 and len(debt) == 2
    b = debt.take()
    assert b.slots.tolist() == [10, 11] and debt.owners() == set()
    assert debt.bytes == 0


def test_a_block_handed_to_a_new_owner_keeps_the_new_owners_rows():
    """Request a leaves; its slots go to request c. If a's rows are written (prefix cache on)
    when it departs, before c's rows, c's writes win, as they did step by step."""
    torch.manual_seed(2)
    debt = ContextDebt()
    old = _step([0, 1, 2])
    debt.record(["a"], [0, 3], old)
    cache = _apply(debt.take({"a"}), torch.zeros(8, 3))  # a departs
    new = _step([0, 1])
    debt.record(["c"], [0, 2], new)
    cache = _apply(debt.take(), cache)
    assert torch.equal(cache, _replay([old, new], cache_size=8))


def test_memory_is_counted_until_the_last_owner_and_compacted():
    """A step is kept whole while its owners owe most of it, and its bytes count until the
    last owner is gone; once under half its rows are owed (a long prefill whose owner left
    beside a decode) the rest is copied out, so the prefill's features are not kept alive."""
    debt = ContextDebt()
    debt.record(["a", "b"], [0, 2, 4], _step([0, 1, 2, 3]))
    held = debt.bytes
    assert held == 4 * (3 * 4 + 16)
    debt.take({"a"})  # half the step still owed: kept whole, counted whole
    assert len(debt) == 2 and debt.bytes == held
    step = _step(list(range(100)))
    debt = ContextDebt()
    debt.record(["big-prefill", "decode"], [0, 99, 100], step)
    debt.take({"big-prefill"})
    (left,) = debt._steps.values()
    assert left.rows.feats.untyped_storage().nbytes() == left.rows.feats.nbytes == 3 * 4
    assert debt.bytes == 3 * 4 + 16 and len(debt) == 1
    assert torch.equal(debt.take().feats, step.feats[99:])
    assert debt.bytes == 0


@pytest.mark.parametrize("compact_rows", [1, 64])  # 1: steps compacted at every chance
def test_random_operations_match_a_per_request_reference(monkeypatch, compact_rows):
    """Record, take, discard and drop in random order: every take returns what per-request
    bookkeeping (each request's rows kept apart, in step order) returns, and the counts
    agree; everything taken or dropped leaves nothing held."""
    from dspark_vllm import context_debt

    monkeypatch.setattr(context_debt, "COMPACT_ROWS", compact_rows)
    gen = torch.Generator().manual_seed(5)
    for trial in range(40):
        debt, ref = ContextDebt(), {}  # ref: req -> [(step, row)], rows as (pos, slot, feats)
        next_pos = {}
        for step_no in range(12):
            op = int(torch.randint(6, (1,), generator=gen))
            live = sorted(ref)
            if op < 3 or not live:  # a step: some requests, 1-4 rows each
                rids = [r for r in "abcde" if torch.rand(1, generator=gen) < 0.6] or ["a"]
                sizes = [int(torch.randint(1, 5, (1,), generator=gen)) for _ in rids]
                bounds = [0]
                for k in sizes:
                    bounds.append(bounds[-1] + k)
                pos = torch.cat([torch.arange(next_pos.get(r, 0), next_pos.get(r, 0) + k)
                                 for r, k in zip(rids, sizes)])
                slots = torch.cat([100 * (ord(r) - 96) + torch.arange(
                    next_pos.get(r, 0), next_pos.get(r, 0) + k) for r, k in zip(rids, sizes)])
                for r, k in zip(rids, sizes):
                    next_pos[r] = next_pos.get(r, 0) + k
                rows = Rows(torch.rand(bounds[-1], 3, generator=gen), pos, slots)
                debt.record(rids, bounds, rows)
                for r, a, b in zip(rids, bounds, bounds[1:]):
                    ref.setdefault(r, []).extend((step_no, i, rows.positions[i], rows.slots[i],
                                                  rows.feats[i]) for i in range(a, b))
            elif op == 3:
                who = {live[int(torch.randint(len(live), (1,), generator=gen))]}
                assert debt.discard(who) == sum(len(ref.pop(r)) for r in who)
            elif op == 4:
                who = live[int(torch.randint(len(live), (1,), generator=gen))]
                end = (max(int(x[2]) for x in ref[who]) + 1) // 4 * 4
                kept = [x for x in ref[who] if int(x[2]) < end]
                assert debt.drop_partial_blocks({who}, 4) == len(ref[who]) - len(kept)
                ref[who] = kept
                if not kept:
                    del ref[who]
            else:
                who = None if torch.rand(1, generator=gen) < 0.3 else set(live[:2])
                picked = sorted(x for r in (ref if who is None else who) for x in ref[r])
                for r in list(ref if who is None else who):
                    ref.pop(r, None)
                want = None if not picked else latest_per_slot(Rows(
                    torch.stack([x[4] for x in picked]), torch.stack([x[2] for x in picked]),
                    torch.stack([x[3] for x in picked])))
                got = debt.take(who)
                assert (got is None) == (want is None), trial
                if got is not None:
                    for f in ("feats", "positions", "slots"):
                        assert torch.equal(getattr(got, f), getattr(want, f)), (trial, f)
            assert len(debt) == sum(map(len, ref.values())) and debt.owners() == set(ref)
            assert debt.bytes == sum(context_debt._bytes(st.rows) for st in debt._steps.values())
        debt.take()
        assert len(debt) == 0 and debt.bytes == 0 and not debt._steps


def test_the_row_limit_and_bad_input():
    debt = ContextDebt(max_bytes=4 * (3 * 4 + 16))  # 4 rows of 3 float32 features
    debt.record(["a"], [0, 3], _step([0, 1, 2]))
    assert not debt.over_limit()
    debt.record(["a"], [0, 2], _step([3, 4]))
    assert debt.over_limit()
    with pytest.raises(ValueError, match="2 requests need 3 bounds"):
        debt.record(["a", "b"], [0, 1], _step([5]))
    with pytest.raises(ValueError, match="max_bytes 0"):
        ContextDebt(max_bytes=0)


def test_only_padding_owes_nothing():
    assert latest_per_slot(_step([-1, -1])) is None
    debt = ContextDebt()
    debt.record(["a"], [0, 2], _step([-1, -1]))
    assert debt.take() is None and len(debt) == 0


def _engine_run(defer: str, prefix_caching: str, handover: str = "1") -> dict:
    import json
    import subprocess
    import sys
    from pathlib import Path

    r = subprocess.run([sys.executable, "-m", "tests.context_debt_check", "--defer", defer,
                        "--prefix-caching", prefix_caching, "--handover", handover], capture_output=True, text=True,
                       timeout=900, cwd=Path(__file__).resolve().parent.parent)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    assert r.returncode == 0 and lines, (r.stdout[-2000:], r.stderr[-3000:])
    return json.loads(lines[-1])


def test_the_engine_drafts_the_same_with_deferred_context():
    """The bundled drafter in a real engine, drafting only when alone (phases in
    tests/context_debt_check.py): deferring the context K/V (prefix cache on: a departed
    request's rows are written for the cache, but for its partial last block; off: dropped)
    proposes and accepts exactly what writing it every step does, and computes fewer rows.
    The reference run is also vLLM's own draft hand-over (one RPC a step); the others hand
    the drafts over on each step's output (patches/draft_handover.py) and never ask."""
    every_step = _engine_run("0", "1", handover="0")
    deferred = _engine_run("1", "1")
    dropped = _engine_run("1", "0")
    assert every_step["drafts"] > 0 and every_step["accepted"] > 0
    assert every_step["draft_rpcs"] > 0
    for run in (every_step, deferred, dropped):  # the slots a step without drafts records
        assert run["context_slots"]["checked"] > 0 and run["context_slots"]["mismatched"] == 0
        # and the inputs it hands the proposer without vLLM's preparation
        assert run["undrafted_inputs"]["checked"] > 0
        assert run["undrafted_inputs"]["after_drafts"] > 0  # a step that verified drafts
        assert run["undrafted_inputs"]["mismatched"] == 0
    for run in (deferred, dropped):
        assert run["draft_rpcs"] == 0
        assert run["outputs"] == every_step["outputs"]
        assert (run["drafts"], run["accepted"]) == (every_step["drafts"], every_step["accepted"])
        assert run["still_owed"] == 0
    # Prefix cache on: every row the step-by-step run wrote is written once or dropped, but
    # for the rows of rejected drafts a deferred step recorded (the step D joins verifies
    # A's drafts and drafts nothing after): the real token's row replaces each before it is
    # written, at most K = 5 a step. Only B's and D's last, partial blocks are dropped when
    # they leave (C reads B's full blocks); off: all their owed rows are (C recomputes B's
    # prompt, so more rows are recorded in all).
    total = deferred["context_rows_written"] + deferred["context_rows_dropped"]
    superseded = every_step["context_rows_written"] - total
    assert 0 <= superseded <= 5 * deferred["undrafted_inputs"]["after_drafts"]
    assert 0 < deferred["context_rows_dropped"] < dropped["context_rows_dropped"]
    assert dropped["context_rows_written"] <= deferred["context_rows_written"]


def test_a_departed_request_keeps_only_its_full_blocks():
    """Only full blocks stay in the prefix cache, so rows past a departed request's last full
    block are dropped (block size 4 here); other requests' rows are untouched."""
    debt = ContextDebt()
    debt.record(["a", "b"], [0, 6, 9], Rows(torch.rand(9, 3), torch.tensor(
        [0, 1, 2, 3, 4, 5, 0, 1, 2]), torch.arange(9)))  # a: positions 0-5, b: 0-2
    debt.record(["a"], [0, 4], _step([20, 21, 22, 23], first_pos=6))  # a: 6-9
    before = debt.bytes
    assert debt.drop_partial_blocks({"a"}, block_size=4) == 2  # a's positions 8, 9
    assert len(debt) == 10 - 2 + 3 and debt.bytes == before  # half of a step 2 owed: kept
    rows = debt.take({"a"})
    assert rows.positions.tolist() == list(range(8))
    assert debt.drop_partial_blocks({"b"}, block_size=4) == 3  # b never filled a block
    assert debt.owners() == set() and len(debt) == 0 and debt.bytes == 0
    debt.record(["c"], [0, 8], _step(list(range(8))))
    assert debt.drop_partial_blocks({"c"}, block_size=4) == 0  # ends on a block boundary
