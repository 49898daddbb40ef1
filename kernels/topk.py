"""Top-k transition step: the transition bias only on each row's k best base-logit candidates
(upstream vLLM's `dspark_draft_topk` for very large vocabularies).

One program per row: the candidates differ between rows, so the W2 rows are gathered per
request (k x r values) instead of streamed once for the batch.  The choice is the dense
step's, restricted to the candidate set: argmax, or Gumbel-max with the noise keyed by each
candidate's vocab id, so with k = V (any candidate order) it draws the dense step's token.
The math is the torch reference `kernels.reference.transition_step_topk_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import checks
from . import rng_triton as rng

# Tuning constants.
MAX_BLOCK_K = 128  # candidates per inner step: a 128 x 64 fp32 W2 gather is 64 registers/thread
MAX_BLOCK_R = 64  # r chunk of the gathered W2 rows (same reason)
NUM_WARPS = 4  # one row per program; 4 warps cover a 128-candidate block


@triton.jit
def _topk_kernel(vals_ptr, stride_vals, ids_ptr, stride_ids, prev_ptr, w1_ptr, stride_w1,
                 w2_ptr, stride_w2, temp_ptr, seed_ptr, pos_ptr,
                 token_ptr, logprob_ptr, lse_ptr, K,
                 R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    row = tl.program_id(0)
    prev = tl.load(prev_ptr + row)
    temp = tl.load(temp_ptr + row)
    sampled = temp > 0
    t = tl.where(sampled, temp, 1.0)
    key = rng.row_key(tl.load(seed_ptr + row), tl.load(pos_ptr + row))
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    best = tl.full([], float("-inf"), tl.float32)
    best_z = tl.full([], float("-inf"), tl.float32)
    best_tok = tl.zeros([], tl.int64)
    lanes = tl.arange(0, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        j = k0 + lanes
        ok = j < K
        ids = tl.load(ids_ptr + row * stride_ids + j, mask=ok, other=0)  # [BLOCK_K] int64
        bias = tl.zeros([BLOCK_K], tl.float32)
        for r0 in tl.static_range(0, R, BLOCK_R):
            ks = r0 + tl.arange(0, BLOCK_R)
            k_ok = ks < R
            a = tl.load(w1_ptr + prev * stride_w1 + ks, mask=k_ok, other=0.0)  # [BLOCK_R]
            w = tl.load(w2_ptr + ids[:, None] * stride_w2 + ks[None, :],
                        mask=ok[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_K, BLOCK_R]
            bias += tl.sum(w.to(tl.float32) * a.to(tl.float32)[None, :], 1)
        vals = tl.load(vals_ptr + row * stride_vals + j, mask=ok, other=0.0)
        z = tl.where(ok, (vals.to(tl.float32) + bias) / t, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, 0))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(z - shift), 0)
        m = m_new
        score = tl.where(sampled, z + rng.gumbel(key, ids), z)
        blk_best, lane = tl.max(score, 0, return_indices=True, return_indices_tie_break_left=True)
        here = lanes == lane
        better = blk_best > best  # strict: ties keep the earlier candidate
        best = tl.where(better, blk_best, best)
        best_z = tl.where(better, tl.max(tl.where(here, z, float("-inf")), 0), best_z)
        best_tok = tl.where(better, tl.sum(tl.where(here, ids, 0), 0), best_tok)
    shift = tl.where(m == float("-inf"), 0.0, m)
    lse = shift + tl.log(s)
    tl.store(token_ptr + row, best_tok)
    tl.store(logprob_ptr + row, best_z - lse)
    tl.store(lse_ptr + row, lse)


def transition_step_topk_triton(
    topk_values: torch.Tensor,  # [B, k] base logits of the candidates
    topk_ids: torch.Tensor,  # [B, k] int64 draft-vocabulary ids
    prev_ids: torch.Tensor,  # [B] int64 target-vocabulary id of x_{k-1}
    w1: torch.Tensor,  # [Vt, r]
    w2: torch.Tensor,  # [V, r], same dtype as w1
    temperature: torch.Tensor,  # [B] float32, 0 = greedy
    seed: torch.Tensor,  # [B] int64
    position: torch.Tensor,  # [B] int64
    *,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> token [B] int64 (draft id), logprob [B] f32, lse [B] f32 over the candidates."""
    b, k = topk_values.shape
    r = w1.shape[1]
    dev = topk_values.device
    checks.rows("topk_values", topk_values, (b, k), dev)
    checks.rows("topk_ids", topk_ids, (b, k), dev, (torch.int64,))
    checks.rows("w1", w1, (w1.shape[0], r), dev)
    checks.rows("w2", w2, (w2.shape[0], r), dev)
    assert w1.dtype == w2.dtype, f"w1 is {w1.dtype} but w2 is {w2.dtype}"
    assert k >= 1, "need at least one candidate"
    checks.vector("prev_ids", prev_ids, b, torch.int64, dev)
    checks.vector("temperature", temperature, b, torch.float32, dev)
    checks.vector("seed", seed, b, torch.int64, dev)
    checks.vector("position", position, b, torch.int64, dev)
    token, logprob, lse = checks.outputs(out, b, dev)
    if b == 0:
        return token, logprob, lse
    _topk_kernel[(b,)](topk_values, topk_values.stride(0), topk_ids, topk_ids.stride(0),
                       prev_ids, w1, w1.stride(0), w2, w2.stride(0), temperature, seed,
                       position, token, logprob, lse, k, R=r,
                       BLOCK_K=min(MAX_BLOCK_K, max(16, checks.next_pow2(k))),
                       BLOCK_R=min(MAX_BLOCK_R, max(16, checks.next_pow2(r))),
                       num_warps=NUM_WARPS)
    return token, logprob, lse
