"""Confidence head c_k = sigmoid(w . [h_k ; W1[x_{k-1}]] + b): a dot product of H + r values
per row, fused so the concatenated feature vector is never built.
The math is the torch reference `kernels.reference.confidence_ref`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import checks

# Tuning constants.
MAX_BLOCK_H = 1024  # hidden chunk per step: 8 fp32 values a thread at 4 warps
MAX_BLOCK_R = 256  # the whole transition embedding of a typical rank in one step
NUM_WARPS = 4  # one row per program; the work is a few KB of reads


@triton.jit
def _confidence_kernel(h_ptr, stride_h, prev_ptr, w1_ptr, stride_w1, w_ptr, b_ptr, out_ptr, H,
                       R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK_H], tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        ok = hs < H
        x = tl.load(h_ptr + row.to(tl.int64) * stride_h + hs, mask=ok, other=0.0)
        acc += x.to(tl.float32) * tl.load(w_ptr + hs, mask=ok, other=0.0).to(tl.float32)
    prev = tl.load(prev_ptr + row)
    acc_r = tl.zeros([BLOCK_R], tl.float32)
    for r0 in tl.static_range(0, R, BLOCK_R):
        ks = r0 + tl.arange(0, BLOCK_R)
        ok = ks < R
        e = tl.load(w1_ptr + prev * stride_w1 + ks, mask=ok, other=0.0)
        acc_r += e.to(tl.float32) * tl.load(w_ptr + H + ks, mask=ok, other=0.0).to(tl.float32)
    logit = tl.sum(acc, 0) + tl.sum(acc_r, 0) + tl.load(b_ptr).to(tl.float32)
    tl.store(out_ptr + row, tl.sigmoid(logit))


def confidence_triton(
    h: torch.Tensor,  # [B, H] backbone hidden state h_k
    prev_ids: torch.Tensor,  # [B] int64 target-vocabulary id of x_{k-1}
    w1: torch.Tensor,  # [Vt, r]
    w: torch.Tensor,  # [H + r] nn.Linear(H + r, 1).weight[0]
    b: torch.Tensor,  # [1] its bias
    *,
    out: torch.Tensor | None = None,  # [B] float32
) -> torch.Tensor:
    """-> c [B] float32 in (0, 1)."""
    bsz, hidden = h.shape
    r = w1.shape[1]
    dev = h.device
    checks.rows("h", h, (bsz, hidden), dev)
    checks.rows("w1", w1, (w1.shape[0], r), dev)
    checks.vector("prev_ids", prev_ids, bsz, torch.int64, dev)
    assert w.shape == (hidden + r,) and w.is_contiguous() and w.device == dev, \
        f"w: expected a contiguous ({hidden + r},) vector on {dev}, got {tuple(w.shape)}"
    assert w.dtype in checks.FLOAT_DTYPES, f"w: dtype {w.dtype}"
    assert b.numel() == 1 and b.device == dev and b.dtype in checks.FLOAT_DTYPES, \
        f"b: expected one float on {dev}, got {tuple(b.shape)} {b.dtype} on {b.device}"
    if out is None:
        out = torch.empty(bsz, dtype=torch.float32, device=dev)
    checks.vector("out", out, bsz, torch.float32, dev)
    if bsz == 0:
        return out
    _confidence_kernel[(bsz,)](h, h.stride(0), prev_ids, w1, w1.stride(0), w, b, out, hidden,
                               R=r, BLOCK_H=min(MAX_BLOCK_H, checks.next_pow2(hidden)),
                               BLOCK_R=min(MAX_BLOCK_R, checks.next_pow2(r)),
                               num_warps=NUM_WARPS)
    return out
