"""Exactness of speculative sampling, and the causality wall (DSpark Appendix A)."""

import itertools

import pytest
import torch
from scipy.stats import chisquare

from dspark_vllm.spec_sampling import one_hot_probs, speculative_sample

V, K, N = 3, 3, 60_000


def _chain(seed, sharp=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharp * torch.randn(V, V, generator=g), -1)  # row x: P(next | x)


def _run(P, Q, rounds, num_verify_fn, seed):
    """N independent sequences, `rounds` speculative rounds each; returns emitted tokens."""
    g = torch.Generator().manual_seed(seed)
    anchor = torch.zeros(N, dtype=torch.long)
    emitted = [[] for _ in range(N)]
    for _ in range(rounds):
        drafts, prev = [], anchor
        for _ in range(K):  # the drafter's own Markov chain
            prev = torch.multinomial(Q[prev], 1, generator=g).squeeze(-1)
            drafts.append(prev)
        draft = torch.stack(drafts, 1)
        slots = torch.cat([anchor[:, None], draft], 1)  # p at slot k conditions on x_{k-1}
        p, q = P[slots], Q[slots[:, :K]]
        n_acc, nxt = speculative_sample(p, q, draft, num_verify_fn(anchor, draft), g)
        for i in range(N):
            emitted[i] += draft[i, : n_acc[i]].tolist() + [int(nxt[i])]
        anchor = nxt
    return emitted


def _joint_pvalue(P, emitted, length=3):
    cells = list(itertools.product(range(V), repeat=length))
    counts = torch.zeros(len(cells))
    index = {c: i for i, c in enumerate(cells)}
    for seq in emitted:
        counts[index[tuple(seq[:length])]] += 1
    expected = []
    for c in cells:  # the target alone: x1 ~ P[x0 = 0], x2 ~ P[x1], ...
        prob, prev = 1.0, 0
        for x in c:
            prob *= float(P[prev, x])
            prev = x
        expected.append(prob * len(emitted))
    return chisquare(counts.numpy(), torch.tensor(expected).numpy()).pvalue


# False alarms: each exactness test fails by chance with probability 1e-4 (fixed seeds make
# the outcome reproducible); the broken rule below gives p-values far below that.
ALPHA = 1e-4


def test_emitted_sequences_follow_the_target():
    P, Q = _chain(0), _chain(1, sharp=2.0)
    emitted = _run(P, Q, rounds=3, num_verify_fn=lambda a, d: None, seed=0)
    assert _joint_pvalue(P, emitted) > ALPHA


def test_a_budget_decided_before_the_drafts_keeps_exactness():
    P, Q = _chain(2), _chain(3, sharp=2.0)
    # Depends on the anchor only (known before drafting): a stopping time.
    rule = lambda anchor, draft: torch.where(anchor == 1, 1, 2)  # noqa: E731
    assert _joint_pvalue(P, _run(P, Q, 3, rule, seed=1)) > ALPHA


def test_a_budget_that_peeks_at_the_draft_breaks_exactness():
    P, Q = _chain(2), _chain(3, sharp=2.0)
    # Admits x_1 only when x_1 is token 0: x_1 decides its own admission.
    peek = lambda anchor, draft: (draft[:, 0] == 0).long()  # noqa: E731
    assert _joint_pvalue(P, _run(P, Q, 3, peek, seed=1)) < 1e-12


def test_greedy_is_the_one_hot_case():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, K + 1, 50, generator=g)
    p = one_hot_probs(logits)
    draft = logits[:, :K].argmax(-1)
    draft[::2, 1] = (draft[::2, 1] + 1) % 50  # every other row: second draft is wrong
    q = one_hot_probs(torch.nn.functional.one_hot(draft, 50).float())
    n_acc, nxt = speculative_sample(p, q, draft, generator=g)
    assert n_acc[::2].tolist() == [1] * 32 and n_acc[1::2].tolist() == [K] * 32
    assert nxt[::2].tolist() == logits[::2, 1].argmax(-1).tolist()
    assert nxt[1::2].tolist() == logits[1::2, K].argmax(-1).tolist()


@pytest.mark.parametrize("n", [0, 2])
def test_unverified_drafts_are_never_accepted(n):
    g = torch.Generator().manual_seed(0)
    p = torch.full((8, K + 1, 4), 0.25)
    draft = torch.zeros(8, K, dtype=torch.long)
    q = one_hot_probs(torch.nn.functional.one_hot(draft, 4).float())
    n_acc, _ = speculative_sample(p, q, draft, torch.full((8,), n), g)
    assert (n_acc <= n).all()
