"""Prompt lookup beside the drafter (dspark_vllm/lookup.py): the match against a slow
reference, the table's counting, the choice rule, and exactness through the evaluator."""

import json

import numpy as np
import pytest
import torch

from dspark_vllm import lookup
from tests.conftest import make_drafter


def slow_match(tokens: list[int], max_n: int) -> tuple[int, int]:
    """Every n from the longest down, every earlier end position from the latest back."""
    L = len(tokens)
    for n in range(min(max_n, L - 1), 0, -1):
        for end in range(L - 2, n - 2, -1):
            if tokens[end - n + 1:end + 1] == tokens[L - n:]:
                return n, end + 1
    return 0, L


def test_match_hand_cases():
    # The longest suffix wins over a later, shorter one; the latest occurrence wins.
    assert lookup.match(np.array([1, 2, 3, 9, 1, 2, 3])) == (3, 3)
    assert lookup.match(np.array([5, 1, 2, 7, 1, 2, 8, 1, 2])) == (2, 6)
    assert lookup.match(np.array([1, 2, 3])) == (0, 3)
    assert lookup.match(np.array([4])) == (0, 1)
    draft, n = lookup.propose(np.array([1, 2, 3, 9, 8, 1, 2, 3]), k=7)
    assert n == 3 and draft.tolist() == [9, 8, 1, 2, 3]  # stops where the context ends


@pytest.mark.parametrize("seed", range(6))
def test_match_equals_slow_reference(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        tokens = rng.integers(0, 3 + seed, size=int(rng.integers(1, 60)))
        for max_n in (1, 3, 6):
            assert lookup.match(tokens, max_n) == slow_match(tokens.tolist(), max_n)


def test_expected_length_is_the_survival_sum():
    assert lookup.expected_length(np.array([0.5, 0.5, 0.0, 1.0])) == pytest.approx(0.75)
    assert lookup.expected_length(np.ones((2, 7))).tolist() == [7.0, 7.0]


def test_slot_acceptance_stops_where_the_match_has_no_tokens():
    table = [[0.1] * 4, [0.5] * 4]
    assert lookup.slot_acceptance(table, 2, 3, 4).tolist() == [0.5, 0.5, 0.5, 0.0]
    assert lookup.slot_acceptance(table, 6, 9, 4).tolist() == [0.5] * 4  # longest row
    assert lookup.slot_acceptance(table, 0, 0, 4).tolist() == [0.0] * 4
    assert not lookup.prefer_lookup(np.array([0.9, 0.9, 0, 0]), np.array([0.5] * 3 + [0]))
    assert lookup.prefer_lookup(np.array([0.3, 0.3, 0, 0]), np.array([0.5] * 3 + [0]))


def test_measure_table_counts_conditional_trials():
    # Prompt [1], answer [7, 8, 9, 7, 8, 9]. Anchor index 4 (the second 7): the 1-gram [7]
    # last occurred at 1, so lookup proposes [8, 9, 7]; the answer goes on [8, 9] and ends:
    # slots 0 and 1 are trials and hits, slot 2 has nothing to be checked against. Anchor
    # index 5: the 2-gram [7, 8] proposes [9, 7, 8]; the answer has [9] left: one hit.
    seq = np.array([1, 7, 8, 9, 7, 8, 9])
    table, blocks = lookup.measure_table([(seq, 1)], k=3, max_n=3)
    p = lookup.TABLE_PRIOR
    assert blocks == [1, 1, 0]
    assert table[0] == pytest.approx([1 / (1 + p), 1 / (1 + p), 0.0], abs=1e-4)
    assert table[1] == pytest.approx([1 / (1 + p), 0.0, 0.0], abs=1e-4)
    assert table[2] == [0.0, 0.0, 0.0]
    # A miss stops the block: [0, 5, 6, 5, 9] at the second 5 proposes [6, 5]; 6 != 9 is
    # one trial, no hit, and slot 1 is never tried.
    t2, b2 = lookup.measure_table([(np.array([0, 5, 6, 5, 9]), 1)], k=3, max_n=1)
    assert b2 == [1] and t2 == [[0.0, 0.0, 0.0]]


def test_splice_block_takes_the_block_expected_further_and_keeps_it_exact():
    drafts = torch.tensor([[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]])
    conf = torch.tensor([[0.9, 0.9, 0.9, 0.9], [0.2, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2, 0.2]])
    probs = torch.softmax(torch.randn(3, 4, 50), -1)
    before = probs.clone()
    table = [[0.5] * 4, [0.8] * 4]
    contexts = [np.array([1, 2, 7, 8, 1, 2]),  # a 2-gram match, but the drafter is surer
                np.array([1, 2, 7, 8, 1, 2]),  # the same match against a doubtful drafter
                None]  # no context (a partial prefill): left alone
    assert lookup.splice_block(drafts, conf, probs, contexts, table) == 1
    assert drafts[0].tolist() == [11, 12, 13, 14] and drafts[2].tolist() == [31, 32, 33, 34]
    # Request 1: [7, 8, 1, 2] copied from after the earlier [1, 2], the table's 2-gram row.
    assert drafts[1].tolist() == [7, 8, 1, 2]
    assert conf[1].tolist() == pytest.approx([0.8] * 4)
    # Its draft distributions are one-hot on the copied tokens; the others are untouched.
    assert torch.equal(probs[1], torch.nn.functional.one_hot(drafts[1], 50).float())
    assert torch.equal(probs[0], before[0]) and torch.equal(probs[2], before[2])


def test_splice_block_keeps_the_drafter_past_a_short_match_at_zero_confidence():
    drafts = torch.tensor([[11, 12, 13, 14]])
    conf = torch.full((1, 4), 0.1)
    n = lookup.splice_block(drafts, conf, None, [np.array([5, 6, 9, 5, 6])], [[1.0] * 4] * 2)
    assert n == 1 and drafts.tolist() == [[9, 5, 6, 14]]  # three tokens to copy, then drafts
    assert conf.tolist() == [[1.0, 1.0, 1.0, 0.0]]
    # A minimum match length above the one found leaves the drafter's block.
    drafts2 = torch.tensor([[11, 12, 13, 14]])
    assert lookup.splice_block(drafts2, torch.full((1, 4), 0.1), None,
                               [np.array([5, 6, 9, 5, 6])], [[1.0] * 4] * 2, min_n=3) == 0


def test_requests_that_sample_read_the_sampled_table():
    ctx = [np.array([5, 6, 9, 5, 6])] * 3
    greedy, sampled = [[0.9] * 4] * 2, [[0.3] * 4] * 2
    drafts = torch.tensor([[11, 12, 13, 14]] * 3)
    conf = torch.full((3, 4), 0.2)
    rows = [False, True, True]
    # Row 0 greedy: the greedy table wins; row 1 samples and, with no sampled table, keeps
    # the drafter's block; row 2 likewise without one.
    assert lookup.splice_block(drafts.clone(), conf.clone(), None, ctx, greedy,
                               sampled_rows=rows) == 1
    d, c = drafts.clone(), conf.clone()
    assert lookup.splice_block(d, c, None, ctx, greedy, sampled_rows=rows,
                               sampled_table=sampled) == 3
    assert c[0].tolist()[:3] == pytest.approx([0.9] * 3)
    assert c[1].tolist()[:3] == pytest.approx([0.3] * 3)


def test_the_evaluator_with_lookup_decodes_greedy_exactly(tiny_target):
    from dspark_vllm.evaluate import DSparkAdapter, SpecDecoder

    drafter = make_drafter(tiny_target, block=4)
    drafter.cfg.dspark_lookup_acceptance = [[1.0] * 4] * 3  # lookup wherever it matches long
    adapter = DSparkAdapter(drafter, prompt_lookup=True)
    dec = SpecDecoder(tiny_target, adapter, set(), 0.0, 4, torch.Generator().manual_seed(0))
    prompt = [5, 17, 33, 8, 5, 17, 33, 8, 5, 17]  # a loop lookup will copy
    r = dec.generate(prompt, 40)
    assert adapter.lookup_rounds > 0
    out = tiny_target.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False,
                               pad_token_id=0, eos_token_id=None)
    assert r["tokens"] == out[0, len(prompt):].tolist()


def _sampled_with_lookup(by_sampled: bool):
    """Temperature 1 on a 3-token Markov target: per round the drafter samples its block,
    lookup copies from each sequence's own history, and splice_block chooses by the
    drafter's confidences: those of its greedy chain (a function of the anchor alone), or,
    `by_sampled`, those of the tokens it drew -> (target, first emitted tokens, spliced)."""
    from dspark_vllm.spec_sampling import speculative_sample
    from tests.test_spec_sampling import _chain

    P, Q = _chain(4), _chain(5, sharp=2.0)
    n, k = 30_000, 3
    g = torch.Generator().manual_seed(0)
    prompt = [1, 2, 0, 1, 0]  # the target alone: x1 ~ P[0], x2 ~ P[x1], ...
    hist = [list(prompt) for _ in range(n)]
    emitted = [[] for _ in range(n)]
    anchor = torch.zeros(n, dtype=torch.long)
    spliced = 0
    for _ in range(3):
        drafts, conf, greedy, prev, gprev = [], [], [], anchor, anchor
        for _ in range(k):
            x = torch.multinomial(Q[prev], 1, generator=g).squeeze(-1)
            conf.append(Q[prev, x])  # the drafter's confidence in the token it drew
            drafts.append(x)
            prev = x
            gx = Q[gprev].argmax(-1)
            greedy.append(Q[gprev, gx])  # ... in its greedy chain's token
            gprev = gx
        draft, conf, greedy = (torch.stack(x, 1) for x in (drafts, conf, greedy))
        q = Q[torch.cat([anchor[:, None], draft[:, :-1]], 1)]  # [n, k, V]
        spliced += lookup.splice_block(draft, conf, q, [np.array(h) for h in hist],
                                       [[0.6] * k] * 3, decide=None if by_sampled else greedy)
        p = P[torch.cat([anchor[:, None], draft], 1)]  # slot j conditions on x_{j-1}
        n_acc, nxt = speculative_sample(p, q, draft, None, g)
        for i in range(n):
            new = draft[i, : n_acc[i]].tolist() + [int(nxt[i])]
            emitted[i] += new
            hist[i] += new
        anchor = nxt
    return P, emitted, spliced


def test_sampled_decoding_with_lookup_follows_the_target():
    from tests.test_spec_sampling import ALPHA, _joint_pvalue

    P, emitted, spliced = _sampled_with_lookup(by_sampled=False)
    assert spliced > len(emitted) // 4  # lookup took part in many rounds
    assert _joint_pvalue(P, emitted) > ALPHA


def test_choosing_by_the_sampled_tokens_confidences_breaks_exactness():
    """The causality wall: the sampled block's confidences read its tokens."""
    from tests.test_spec_sampling import _joint_pvalue

    P, emitted, _ = _sampled_with_lookup(by_sampled=True)
    assert _joint_pvalue(P, emitted) < 1e-12


def test_lookup_needs_a_table_and_a_confidence_head(tiny_target):
    from dspark_vllm.evaluate import DSparkAdapter

    with pytest.raises(ValueError, match="calibrate --lookup-only"):
        DSparkAdapter(make_drafter(tiny_target, block=4), prompt_lookup=True)
    with pytest.raises(ValueError, match="calibrate --lookup-only"):
        DSparkAdapter(make_drafter(tiny_target, block=4, conf=False), prompt_lookup=True)


def test_calibrate_lookup_measures_the_cache_answers_and_keeps_the_temperatures(tiny_target,
                                                                               tmp_path):
    """`dspark calibrate --lookup-only`: the table measure_table gives on the cache's
    greedy answers goes into config.json (the confidence temperatures untouched) and
    calibration.json (what was there kept); the drafter still loads."""
    from dspark_vllm.drafter.checkpoint import load_drafter, save_drafter
    from dspark_vllm.drafter.config import DSparkDrafterConfig
    from dspark_vllm.train.cache import build_cache, open_cache
    from dspark_vllm.train.calibrate import _calibration_seqs, calibrate_lookup
    from dspark_vllm.train.make_data import _write_shard

    tiny_target.save_pretrained(tmp_path / "target")
    rng = np.random.default_rng(0)
    seqs, plens = [], []
    for _ in range(12):  # answers that repeat a short phrase: lookup has something to copy
        prompt = rng.integers(4, 90, size=5)
        phrase = rng.integers(50, 60, size=4)
        seqs.append(np.concatenate([prompt, np.tile(phrase, 4)]).astype(np.int32))
        plens.append(5)
    (tmp_path / "data").mkdir()
    _write_shard(tmp_path / "data" / "shard-00000.npz", seqs, plens,
                 [{"temperature": 0.0}] * len(seqs))
    build_cache(tmp_path / "data", tmp_path / "cache", str(tmp_path / "target"),
                layer_ids=[1, 2, 3])
    drafter = make_drafter(tiny_target, block=4)
    drafter.cfg.dspark_confidence_temperatures = [0.5, 1.0, 1.5, 2.0]
    out = save_drafter(drafter, tmp_path / "drafter")
    (out / "calibration.json").write_text('{"auc_mean": 0.9}')

    rep = calibrate_lookup(out, tmp_path / "cache")
    cache = open_cache(tmp_path / "cache")
    answers = [(np.asarray(cache.tokens[cache.info.offsets[i]:cache.info.offsets[i + 1]]),
                cache.info.prompt_lens[i]) for i in _calibration_seqs(cache, 0.05)]
    want, blocks = lookup.measure_table(answers, 4)
    assert rep["lookup"]["table"] == want and rep["lookup"]["blocks_per_match_length"] == blocks
    assert max(max(r) for r in want) > 0.5  # the repeated phrases were copied
    cfg = DSparkDrafterConfig.load(out)
    assert cfg.dspark_lookup_acceptance == want
    assert cfg.dspark_confidence_temperatures == [0.5, 1.0, 1.5, 2.0]
    assert cfg.dspark_lookup_acceptance_sampled is None  # every answer here was greedy
    saved = json.loads((out / "calibration.json").read_text())
    assert saved["auc_mean"] == 0.9 and saved["lookup"]["table"] == want
    load_drafter(out, tiny_target.get_input_embeddings().weight,
                 tiny_target.get_output_embeddings().weight, target_num_layers=6)


def test_a_bad_lookup_table_is_refused_by_name(tiny_target):
    from dspark_vllm.drafter.config import DrafterConfigError

    cfg = make_drafter(tiny_target, block=4).cfg
    for table in ([], [[0.5] * 3], [[0.5, 0.5, 1.5, 0.5]], "0.5"):
        cfg.dspark_lookup_acceptance = table
        with pytest.raises(DrafterConfigError, match="dspark_lookup_acceptance"):
            cfg.validate()
