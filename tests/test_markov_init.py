"""Transition-head start from bigram statistics: the PMI rule against a slow reference,
and its rank-reduced factors."""

import math

import numpy as np
import torch

from dspark_vllm.train.markov_init import (MIN_COUNT, PAIR_COUNTS, PMI_CLIP, PRIOR_COUNTS,
                                           bigram_pmi, pmi_factors)


def _pmi_ref(prev, nxt, rows, vd):
    """The rule, one cell at a time."""
    total = len(nxt)
    out = np.zeros((len(rows), vd))
    for r, a in enumerate(rows):
        n = sum(1 for p in prev if p == a)
        for b in range(vd):
            uni = (sum(1 for x in nxt if x == b) + 1) / (total + vd)
            c = sum(1 for p, x in zip(prev, nxt) if p == a and x == b)
            v = math.log((c + PRIOR_COUNTS * uni) / (n + PRIOR_COUNTS) / uni)
            v = min(max(v, -PMI_CLIP), PMI_CLIP)
            out[r, b] = v * c / (c + PAIR_COUNTS) if v > 0 else v
        out[r] -= out[r].mean()
    return out


def test_pmi_matches_the_cell_by_cell_rule():
    rng = np.random.default_rng(0)
    prev = rng.integers(0, 6, 300)
    nxt = np.where(prev == 2, 4, rng.integers(0, 5, 300))  # 2 is always followed by 4
    rows = np.array([0, 2, 5])
    got = bigram_pmi(prev, nxt, rows, 5).double().numpy()
    np.testing.assert_allclose(got, _pmi_ref(prev.tolist(), nxt.tolist(), rows, 5), atol=1e-5)
    assert got[1].argmax() == 4


def test_full_rank_factors_reproduce_the_pmi_and_leave_other_rows_at_zero():
    rng = np.random.default_rng(1)
    prev = rng.integers(0, 8, 400)
    prev[prev == 7] = 6  # token 7 never precedes anything
    prev[:2] = 7  # ... except twice: below MIN_COUNT, so its row is not factored
    assert MIN_COUNT > 2
    nxt = (prev + 1) % 5
    w1, w2 = pmi_factors(prev, nxt, None, vocab_size=10, draft_vocab_size=5, rank=8)
    assert w1.shape == (10, 8) and w2.shape == (5, 8)
    rows = np.array([0, 1, 2, 3, 4, 5, 6])
    want = bigram_pmi(prev, nxt, rows, 5)
    torch.testing.assert_close(w1[rows] @ w2.t(), want, atol=1e-4, rtol=1e-4)
    assert w1[7:].abs().sum() == 0  # rare (7) and unseen (8, 9) previous tokens: no bias
    for a in rows:
        assert int((w1[a] @ w2.t()).argmax()) == (a + 1) % 5


def test_successors_outside_the_draft_vocabulary_are_dropped():
    # target ids 0..5; the draft vocabulary is {1, 3, 4} -> draft ids 0, 1, 2.
    t2d = torch.tensor([-1, 0, -1, 1, 2, -1])
    prev = np.array([1] * 10 + [3] * 10)
    nxt = np.array([3] * 10 + [5] * 10)  # 3's successors (5) are not draftable
    w1, w2 = pmi_factors(prev, nxt, t2d, vocab_size=6, draft_vocab_size=3, rank=2)
    assert int((w1[1] @ w2.t()).argmax()) == 1  # 1 -> target 3 = draft 1
    assert w1[3].abs().sum() == 0


def test_low_rank_factors_keep_the_strongest_structure():
    # 40 previous tokens, each followed by its own successor: rank 8 cannot hold all 40,
    # but the factors are the best rank-8 approximation (Eckart-Young) of the PMI.
    prev = np.repeat(np.arange(40), 30)
    nxt = (prev * 7 + 3) % 40
    w1, w2 = pmi_factors(prev, nxt, None, vocab_size=40, draft_vocab_size=40, rank=8)
    want = bigram_pmi(prev, nxt, np.arange(40), 40)
    s = torch.linalg.svdvals(want)
    err = torch.linalg.matrix_norm(w1 @ w2.t() - want)
    assert abs(float(err) - float(s[8:].norm())) < 1e-2 * float(s[8:].norm())


def test_no_data_gives_the_zero_start():
    w1, w2 = pmi_factors(np.zeros(0, np.int64), np.zeros(0, np.int64), None, 7, 5, 3)
    assert w1.abs().sum() == 0 and w2.abs().sum() == 0
