"""The draft side's token choices, read from the training responses: how often each
token occurs, the reduced draft vocabulary, and the mask slots' input token."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from .cache import FeatureCache


def response_counts(cache: FeatureCache, seqs: list[int]) -> np.ndarray:
    """How often each token id occurs in the responses of `seqs` [max id + 1]."""
    counts = np.zeros(cache.info.num_tokens and int(cache.tokens.max()) + 1, dtype=np.int64)
    for i in seqs:
        a, b = cache.info.offsets[i], cache.info.offsets[i + 1]
        counts += np.bincount(cache.tokens[a + cache.info.prompt_lens[i]:b], minlength=len(counts))
    return counts


def pick_mask_token(target: str, counts: np.ndarray) -> int:
    """The target tokenizer's highest-id added special token that is not BOS/EOS/PAD and
    never occurs in the training responses (SmolLM2-135M-Instruct: 16, <empty_output>),
    so a mask slot's input can never be mistaken for a drafted token."""
    from transformers import AutoTokenizer

    from ..target import resolve_target

    try:
        tok = AutoTokenizer.from_pretrained(str(resolve_target(target)))
    except (OSError, ValueError) as e:
        raise ValueError(f"target {target}: no tokenizer to pick the mask token from ({e}); "
                         "give --mask-token-id") from None
    skip = set(np.flatnonzero(counts).tolist()) | {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}
    added = tok.added_tokens_decoder  # id -> AddedToken
    for special in (True, False):
        ids = [i for i, t in added.items() if t.special == special and i not in skip]
        if ids:
            return max(ids)
    raise ValueError(f"target {target}: every added token is BOS/EOS/PAD or occurs in the "
                     "responses; give --mask-token-id (a token the target never generates)")


def build_draft_vocab(counts: np.ndarray, size: int,
                      keep: tuple[int, ...] = ()) -> tuple[torch.Tensor, float]:
    """The `size` most frequent response tokens (plus `keep`), sorted; and their coverage."""
    order = [int(t) for t in np.argsort(-counts, kind="stable") if t not in keep]
    ids = sorted(set(keep) | set(order[:size - len(set(keep))]))
    coverage = float(counts[ids].sum() / max(counts.sum(), 1))
    return torch.tensor(ids), coverage
