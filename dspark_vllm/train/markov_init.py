"""Start the transition head from the training data's bigram statistics instead of zero.

The transition head adds B(x_{k-1}, .) = W1[x_{k-1}] W2^T to slot k's logits. Slot k is
trained without seeing x_{k-1} (its input is a mask), so it predicts p(x_k | context)
marginalised over the previous draft. Naive Bayes gives the correction once x_{k-1} is
known:

    p(x_k | context, x_{k-1})  ~  p(x_k | context) * p(x_k | x_{k-1}) / p(x_k)

so the bias the head should start from is the pointwise mutual information
PMI(a, b) = log p(b | a) / p(b) of consecutive response tokens, up to a per-row constant
(softmax ignores it). The head is rank r, so it starts from the best rank-r approximation
of the row-centred PMI (truncated SVD), split evenly between W1 and W2. Training then
corrects what naive Bayes gets wrong. `bigram_pmi` is the rule; `pmi_factors` factors it.
"""

from __future__ import annotations

import numpy as np
import torch

# Dirichlet pseudo-counts pulling each row's p(b | a) toward the unigram p(b): a previous
# token seen n times trusts its own row by n / (n + PRIOR_COUNTS), so a token seen twice does
# not claim that its two successors are the only possible ones.
PRIOR_COUNTS = 20.0
# A pair seen c times keeps c / (c + PAIR_COUNTS) of a positive PMI: PMI favours rare pairs
# (two sightings of "of flour" score above hundreds of "of the"), so a boost needs repeats.
# Negative PMI needs no such guard: it is only strong after a frequent previous token.
PAIR_COUNTS = 5.0
# Cap on |PMI| in nats. A frequent token's never-seen successors would otherwise get
# log(PRIOR_COUNTS / n), -6 and below, vetoing tokens that are merely rare.
PMI_CLIP = 4.0
# Previous tokens factored: the most frequent ones, each seen at least MIN_COUNT times. Bounds
# the dense matrices at MAX_ROWS x draft vocabulary floats (256 MB each at 8,192 x 8,192, a
# few alive at once); the other rows of W1 start at zero (no correction), as does every row
# when the data is empty.
MAX_ROWS = 8192
MIN_COUNT = 3


def response_bigrams(cache, seqs) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive (previous, next) target ids inside the responses of cache sequences
    `seqs` (the next token is a response token; its predecessor may end the prompt)."""
    prev, nxt = [], []
    for i in seqs:
        a, b = cache.info.offsets[i], cache.info.offsets[i + 1]
        tok = np.asarray(cache.tokens[a:b], dtype=np.int64)
        p = max(cache.info.prompt_lens[i], 1)
        prev.append(tok[p - 1:-1])
        nxt.append(tok[p:])
    if not prev:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(prev), np.concatenate(nxt)


def bigram_pmi(prev: np.ndarray, nxt_d: np.ndarray, rows: np.ndarray,
               draft_vocab_size: int) -> torch.Tensor:
    """prev: [N] target ids; nxt_d: [N] draft ids; rows: [R] the previous ids to keep ->
    [R, V_draft] clipped, row-centred PMI(a, b) = log p(b | a) / p(b), with p(b | a)
    smoothed toward p(b) by PRIOR_COUNTS pseudo-counts and positive values shrunk by the
    pair's count."""
    row_of = np.full(max(int(prev.max(initial=0)), int(rows.max(initial=0))) + 1, -1, np.int64)
    row_of[rows] = np.arange(len(rows))
    r_idx = row_of[prev]
    sel = r_idx >= 0
    counts = torch.zeros(len(rows), draft_vocab_size)
    counts.index_put_((torch.from_numpy(r_idx[sel]), torch.from_numpy(nxt_d[sel])),
                      torch.ones(int(sel.sum())), accumulate=True)
    uni = torch.from_numpy(np.bincount(nxt_d, minlength=draft_vocab_size)).float()
    uni = (uni + 1.0) / (uni.sum() + draft_vocab_size)  # add-one: never log(0)
    n = counts.sum(1, keepdim=True)
    cond = (counts + PRIOR_COUNTS * uni) / (n + PRIOR_COUNTS)
    pmi = (cond / uni).log().clamp(-PMI_CLIP, PMI_CLIP)
    pmi = torch.where(pmi > 0, pmi * counts / (counts + PAIR_COUNTS), pmi)
    return pmi - pmi.mean(1, keepdim=True)


def pmi_factors(prev: np.ndarray, nxt: np.ndarray, t2d: torch.Tensor | None, vocab_size: int,
                draft_vocab_size: int, rank: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Bigrams over target ids -> (W1 [vocab_size, rank], W2 [draft_vocab_size, rank]) with
    W1 W2^T the best rank-`rank` approximation of `bigram_pmi` on the kept rows, zero elsewhere.
    t2d: [vocab_size] target -> draft id (-1 outside the draft vocabulary), None = identity."""
    w1 = torch.zeros(vocab_size, rank)
    w2 = torch.zeros(draft_vocab_size, rank)
    nxt_d = nxt if t2d is None else t2d.numpy()[nxt]
    keep = nxt_d >= 0  # successors outside the draft vocabulary cannot be drafted
    prev, nxt_d = prev[keep], nxt_d[keep]
    freq = np.bincount(prev, minlength=vocab_size)
    rows = np.argsort(-freq, kind="stable")[:MAX_ROWS]
    rows = np.sort(rows[freq[rows] >= MIN_COUNT])
    if len(rows) == 0:
        return w1, w2
    pmi = bigram_pmi(prev, nxt_d, rows, draft_vocab_size)  # [R, V_draft]
    q = min(rank, *pmi.shape)
    if q == min(pmi.shape):  # small matrices: exact SVD
        u, s, vh = torch.linalg.svd(pmi, full_matrices=False)
        u, s, v = u[:, :q], s[:q], vh[:q].t()
    else:
        with torch.random.fork_rng():  # leave the caller's RNG stream untouched
            torch.manual_seed(seed)
            u, s, v = torch.svd_lowrank(pmi, q=q, niter=6)
    root = s.clamp(min=0).sqrt()
    w1[torch.from_numpy(rows)] = torch.nn.functional.pad(u * root, (0, rank - q))
    w2[:] = torch.nn.functional.pad(v * root, (0, rank - q))
    return w1, w2
