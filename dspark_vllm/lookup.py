"""Prompt lookup beside the drafter: when the context already holds what comes next, copy it.

A DSpark drafter reads the target's features of its context, yet it does not copy spans out
of that context: a block slot cannot address "the token k places after where the anchor last
occurred". The target copies a great deal (a translation prompt's German, a passage's
sentences, a function's names), and prompt lookup (vLLM's `ngram` method) proposes exactly
that: the tokens that followed the latest earlier occurrence of the context's last n tokens.

Per request and step, verify the block with the larger expected accepted length:

    E_drafter = sum_k prod_{j<=k} c_j                 (the drafter's calibrated confidences)
    E_lookup  = sum_k prod_{j<=k} a_n[j], k < m       (a_n: acceptance table, n = match length,
                                                       m = tokens the match has to offer)

The choice reads neither the target's verdict nor any token the drafter *sampled*: with
temperature > 0 the confidences c_j of the sampled block read its tokens, and choosing by
them would let those tokens decide whether they are verified (the causality wall; measured
to break exactness in tests/test_lookup.py). E_drafter is therefore read off the greedy
chain's confidences, a function of the drafter's parallel pass and the anchor alone. A
lookup token is a deterministic proposal (draft distribution one-hot on it), so the exact
verification rule keeps the output distributed as the target alone would produce it.
The table a_n[j] (acceptance at slot j given slots < j accepted, for a longest match of
length n) is measured by `dspark calibrate` (measure_table): on held-out greedy answers, and a
second one for requests that sample on answers sampled at temperature > 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

MAX_NGRAM = 6  # longest suffix matched; longer matches predict better (README, prompt lookup)
# Pseudo-trials counted as rejections in every cell of the table: a match length seen a
# handful of times is not trusted over a calibrated drafter on that little evidence.
TABLE_PRIOR = 5.0


def match(tokens: np.ndarray, max_n: int = MAX_NGRAM) -> tuple[int, int]:
    """tokens: [L] ids, the context up to and including the anchor -> (n, start).

    n: the longest n <= max_n whose last-n-token suffix occurred earlier in `tokens`;
    start: the index just after its latest earlier occurrence (what would come next).
    (0, L) when not even the anchor occurred before."""
    L = len(tokens)
    for n in range(min(max_n, L - 1), 0, -1):
        # hit[i]: the n-gram ending at i (i in n-1 .. L-2) equals the suffix.
        hit = tokens[n - 1:L - 1] == tokens[L - 1]
        for t in range(1, n):
            hit &= tokens[n - 1 - t:L - 1 - t] == tokens[L - 1 - t]
        idx = np.flatnonzero(hit)
        if idx.size:
            return n, int(idx[-1]) + n
    return 0, L


def propose(tokens: np.ndarray, k: int, max_n: int = MAX_NGRAM) -> tuple[np.ndarray, int]:
    """-> (draft [m <= k] token ids, n): what followed the longest earlier match."""
    n, start = match(tokens, max_n)
    return tokens[start:start + k], n


def expected_length(conf: np.ndarray) -> np.ndarray:
    """conf: [..., K] per-slot conditional acceptance -> [...] expected accepted drafts
    (the survival sum: slot k is accepted only if every slot before it was)."""
    return np.cumprod(conf, axis=-1).sum(-1)


def slot_acceptance(table: list[list[float]], n: int, m: int, k: int) -> np.ndarray:
    """The lookup block's per-slot confidences [k]: a_n[:m], then 0 where it has no token."""
    out = np.zeros(k)
    if n >= 1 and m >= 1:
        row = table[min(n, len(table)) - 1]
        out[:min(m, k)] = row[:min(m, k)]
    return out


def prefer_lookup(drafter_conf: np.ndarray, lookup_conf: np.ndarray) -> bool:
    """Verify the lookup block only when it is expected to be accepted further."""
    return float(expected_length(lookup_conf)) > float(expected_length(drafter_conf))


def splice_block(
    drafts: torch.Tensor,  # [B, K] the drafter's tokens (target ids), rewritten in place
    conf: torch.Tensor,  # [B, K] their calibrated confidences, rewritten in place
    probs: torch.Tensor | None,  # [B, K, V] draft distributions (sampled drafting) or None
    contexts: Sequence[np.ndarray | None],  # per request: its tokens up to the anchor; None: skip
    table: list[list[float]],
    max_n: int = MAX_NGRAM,
    min_n: int = 1,
    decide: torch.Tensor | None = None,  # [B, K] confidences that read no sampled token
    sampled_rows: Sequence[bool] | None = None,  # [B] requests sampling at temperature > 0
    sampled_table: list[list[float]] | None = None,  # their table (None: no lookup for them)
) -> int:
    """Per request, the lookup block where it is expected to be accepted further (its
    slots past the match keep the drafter's tokens at confidence 0) -> requests spliced.
    `decide` (default `conf`, right for greedy blocks only) are the drafter's confidences
    the choice reads: for sampled blocks, the greedy chain's (module docstring). Requests
    sampling at temperature > 0 read `sampled_table`, measured on sampled answers: a copied
    token is accepted with the target's probability of it there, not when it is the argmax.
    Exactness: a lookup token's draft distribution is one-hot on it; the drafter's tokens
    left behind it were drawn from their own distributions, which they keep."""
    k = drafts.shape[1]
    decide = conf if decide is None else decide
    spliced = 0
    for i, ctx in enumerate(contexts):
        tbl = sampled_table if sampled_rows is not None and sampled_rows[i] else table
        if ctx is None or tbl is None:
            continue
        draft, n = propose(ctx, k, max_n)
        m = len(draft)
        if n < min_n or m == 0:
            continue
        lc = slot_acceptance(tbl, n, m, k)
        if not prefer_lookup(decide[i].double().cpu().numpy(), lc):
            continue
        ids = torch.from_numpy(np.ascontiguousarray(draft)).to(drafts.device, drafts.dtype)
        drafts[i, :m] = ids
        conf[i] = torch.from_numpy(lc).to(conf.device, conf.dtype)
        if probs is not None:
            probs[i, :m] = 0
            probs[i, torch.arange(m, device=probs.device), ids.long()] = 1
        spliced += 1
    return spliced


def measure_table(sequences: Iterable[tuple[np.ndarray, int]], k: int,
                  max_n: int = MAX_NGRAM) -> tuple[list[list[float]], list[int]]:
    """Answers (tokens [L], prompt length) -> (table [max_n][k], blocks per n). On greedy
    answers the greedy table; on sampled ones the sampled table (a copied token matches a
    sampled continuation as often as it would be accepted there).

    At every answer position the longest match proposes its block; against the answer's
    own continuation, slot j counts a trial when slots < j were accepted and the block has a
    slot j, a hit when it is accepted too. a_n[j] = hits / (trials + TABLE_PRIOR)."""
    hits = np.zeros((max_n, k))
    trials = np.zeros((max_n, k))
    blocks = [0] * max_n
    for tokens, prompt_len in sequences:
        tokens = np.asarray(tokens)
        for a in range(prompt_len, len(tokens) - 1):  # anchor a: tokens[a] just emitted
            draft, n = propose(tokens[:a + 1], k, max_n)
            if n == 0:
                continue
            blocks[n - 1] += 1
            truth = tokens[a + 1:a + 1 + k]
            for j in range(min(len(draft), len(truth))):
                trials[n - 1, j] += 1
                if draft[j] != truth[j]:
                    break
                hits[n - 1, j] += 1
    table = hits / (trials + TABLE_PRIOR)
    return [[round(float(x), 4) for x in row] for row in table], blocks
