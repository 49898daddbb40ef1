"""Fused transition-head step: logits = U + W1[prev] W2^T, reduced on the fly to the drafted
token, its log-probability and the log-sum-exp, without materialising the [B, V] logits.

Layout (flash-decoding style, deterministic):
  pass 1   grid (batch tiles, vocab splits).  A program owns BLOCK_B rows and a contiguous run
           of vocab tiles.  It loads its rows of W1[prev] once; per tile it computes the
           [BLOCK_B, BLOCK_V] logits with one tl.dot against the W2 tile (K = r, zero-padded;
           fp32 accumulation), then folds them into a running max / sum-exp (online softmax)
           and a running best (argmax or Gumbel-max) score.  W2 is streamed once per batch
           tile: once for the whole batch while B <= BLOCK_B (128, or 64 when r * elem > 512 B).
  combine  merges the per-split partials into token, logprob, lse. Fused (eager launches
           of up to 32 rows, FUSED_COMBINE): the last pass-1 program of each batch tile to
           finish -- a per-tile arrival counter, re-armed by that program -- merges its rows,
           so the step is one launch (an eager launch costs the host more than a drafter-sized
           step's GPU work). Otherwise a second launch over (B / rows,) programs.
  pass 2   (want_probs only) same grid as pass 1, recomputes the logits and writes
           exp(z - lse).  At t = 0 this row is softmax(logits), not the one-hot greedy choice.
The math is the torch reference `kernels.reference.transition_step_ref`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import checks
from . import rng_triton as rng
from .dispatch import capturing

# Tuning constants (sized from sm_90 compiles -- shared memory, registers, spills, see
# kernels/aot.py -- not from timings). Timed once on an H200 (benchmarks/bench_kernels.py,
# README "Triton kernels on a GPU"): at drafter sizes a step is 11-160 us of GPU work and
# launch-bound, reading at most ~30% of copy bandwidth, so these tiles were left as they are.
MAX_BLOCK_B = 128  # rows per program: up to B = 128 W2 is read exactly once per step
MIN_DOT = 16  # tl.dot needs every block dimension >= 16
MAX_BLOCK_V = 256  # widest vocab tile: long contiguous W2 reads at small batch
TILE_ELEMS = 8192  # BLOCK_B * BLOCK_V: a 32 KB fp32 accumulator, 32 registers/thread at 8 warps
FP32_TILE_ELEMS = 4096  # fp32 dots run on FMA units with register operands: 8192 spills
NUM_WARPS = 8  # 256 threads share the W1 block and the W2 tile of the tl.dot
W1_BLOCK_BYTES = 64 * 1024  # W1[prev] block kept for the whole program (smem / registers)
W2_TILE_BYTES = 32 * 1024  # one W2 tile; the loop pipeline keeps ~3 in flight in smem
MAX_RANK = 512  # r is reduced by one tl.dot per tile (K = next_pow2(r))
COMBINE_ELEMS = 4096  # partials merged per combine program: 16 values/thread at 4 warps
# Merge the splits in pass 1's last program per batch tile (one launch) when launched eagerly
# and the tile holds at most FUSE_MAX_ROWS rows. H200, bundled drafter's shape: eagerly the host
# issued a step in 71-86 us fused against 86-92 us in two launches (B = 1, 32), its GPU work
# (9-25 us) hidden behind that; the merge's own GPU time doubles it (9 -> 19 us at B = 1), and at
# 128 rows one program merging them costs 4x the combine launch (a 7-step block 0.54 vs 0.14 ms
# under a CUDA graph). Under graph capture the launch costs the host nothing: two launches.
FUSED_COMBINE = True
FUSE_MAX_ROWS = 32
PROGRAMS_PER_SM = 4  # vocab splits fill the GPU ~4 programs deep to keep HBM loads in flight
FP32_DOT_PRECISION = "ieee"  # exact fp32 products: "tf32" would cost ~1e-3 in the logits
# Triton 3.9's interpreter multiplies bf16 dot operands as their raw uint16 bits; under it the
# operands are widened to fp32 first (bf16 x bf16 products are exact in fp32: same values).
DOT_UPCAST = triton.knobs.runtime.interpret


@dataclass(frozen=True)
class Plan:
    block_b: int
    block_v: int
    block_r: int
    tiles_per_split: int
    num_splits: int
    num_warps: int


@functools.lru_cache(maxsize=1024)  # a pure function of its arguments, asked every step
def plan(b: int, v: int, r: int, elem_bytes: int, device: torch.device,
         block_v: int | None = None, num_splits: int | None = None) -> Plan:
    """Tile sizes and the vocab split for a [b, v] step of rank r whose W1/W2 elements are
    elem_bytes wide (block_v / num_splits override the heuristics, for tests)."""
    assert 1 <= r <= MAX_RANK, f"rank {r} outside 1..{MAX_RANK}"
    block_r = max(MIN_DOT, checks.next_pow2(r))
    row_bytes = block_r * elem_bytes
    block_b = min(MAX_BLOCK_B, max(MIN_DOT, checks.next_pow2(b)),
                  max(MIN_DOT, checks.prev_pow2(W1_BLOCK_BYTES // row_bytes)))
    batch_tiles = triton.cdiv(b, block_b)
    want_splits = num_splits or max(1, PROGRAMS_PER_SM * checks.sm_count(device) // batch_tiles)
    if block_v is None:  # as wide as smem / registers allow, but leave every split a tile
        tile_elems = FP32_TILE_ELEMS if elem_bytes == 4 else TILE_ELEMS
        block_v = min(MAX_BLOCK_V, tile_elems // block_b, W2_TILE_BYTES // row_bytes,
                      checks.prev_pow2(v // want_splits))
        block_v = max(MIN_DOT, block_v)
    tiles = triton.cdiv(v, block_v)
    tiles_per_split = triton.cdiv(tiles, min(tiles, want_splits))
    return Plan(block_b=block_b, block_v=block_v, block_r=block_r,
                tiles_per_split=tiles_per_split, num_splits=triton.cdiv(tiles, tiles_per_split),
                num_warps=NUM_WARPS)


@triton.jit
def _w1_rows(w1_ptr, stride_w1, prev, row_ok, R: tl.constexpr, BLOCK_R: tl.constexpr,
             DOT_UPCAST: tl.constexpr):
    """W1[prev] -> [BLOCK_B, BLOCK_R], zero-padded beyond r: the loop-invariant dot operand."""
    ks = tl.arange(0, BLOCK_R)
    a = tl.load(w1_ptr + prev[:, None] * stride_w1 + ks[None, :],
                mask=row_ok[:, None] & (ks < R)[None, :], other=0.0)
    if DOT_UPCAST:
        a = a.to(tl.float32)
    return a


@triton.jit
def _logits_tile(u_ptr, stride_u, a, w2_ptr, stride_w2, rows, row_ok, cols, col_ok,
                 R: tl.constexpr, BLOCK_R: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 DOT_UPCAST: tl.constexpr):
    """U[rows, cols] + W1[prev] . W2[cols]^T -> [BLOCK_B, BLOCK_V] float32 (a = W1[prev])."""
    ks = tl.arange(0, BLOCK_R)
    w = tl.load(w2_ptr + cols[:, None].to(tl.int64) * stride_w2 + ks[None, :],
                mask=col_ok[:, None] & (ks < R)[None, :], other=0.0)  # [BLOCK_V, BLOCK_R]
    if DOT_UPCAST:
        w = w.to(tl.float32)
    bias = tl.dot(a, tl.trans(w), input_precision=DOT_PRECISION)
    u = tl.load(u_ptr + rows[:, None].to(tl.int64) * stride_u + cols[None, :],
                mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    return u.to(tl.float32) + bias


@triton.jit
def _pass1_kernel(u_ptr, stride_u, prev_ptr, w1_ptr, stride_w1, w2_ptr, stride_w2,
                  temp_ptr, seed_ptr, pos_ptr,
                  part_f_ptr,  # [4, B, S] float32: running max, sum-exp, best score, z at best
                  part_i_ptr,  # [B, S] int32: vocab id of the best score
                  count_ptr,  # [batch tiles] int32 arrival counters, zero between launches
                  token_ptr, logprob_ptr, lse_ptr, B, V, S, tiles_per_split,
                  R: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
                  BLOCK_R: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  DOT_UPCAST: tl.constexpr, FUSE: tl.constexpr, BLOCK_S: tl.constexpr):
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    prev = tl.load(prev_ptr + rows, mask=row_ok, other=0)
    a = _w1_rows(w1_ptr, stride_w1, prev, row_ok, R, BLOCK_R, DOT_UPCAST)
    temp = tl.load(temp_ptr + rows, mask=row_ok, other=0.0)
    sampled = temp > 0
    t = tl.where(sampled, temp, 1.0)
    key = rng.row_key(tl.load(seed_ptr + rows, mask=row_ok, other=0),
                      tl.load(pos_ptr + rows, mask=row_ok, other=0))
    m = tl.full([BLOCK_B], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_B], tl.float32)
    best = tl.full([BLOCK_B], float("-inf"), tl.float32)
    best_z = tl.full([BLOCK_B], float("-inf"), tl.float32)
    best_id = tl.zeros([BLOCK_B], tl.int32)
    lanes = tl.arange(0, BLOCK_V)
    first = pid_s * tiles_per_split
    last = tl.minimum(first + tiles_per_split, tl.cdiv(V, BLOCK_V))
    for tile in range(first, last):
        cols = tile * BLOCK_V + lanes
        col_ok = cols < V
        logits = _logits_tile(u_ptr, stride_u, a, w2_ptr, stride_w2, rows, row_ok, cols,
                              col_ok, R, BLOCK_R, DOT_PRECISION, DOT_UPCAST)
        z = tl.where(col_ok[None, :], logits / t[:, None], float("-inf"))
        # online softmax; a row whose max is still -inf keeps s = 0 instead of NaN
        m_new = tl.maximum(m, tl.max(z, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(z - shift[:, None]), 1)
        m = m_new
        # greedy rows rank by z, sampled rows by z + Gumbel noise of their own stream
        score = tl.where(sampled[:, None], z + rng.gumbel(key[:, None], cols[None, :]), z)
        tile_best, lane = tl.max(score, 1, return_indices=True,
                                 return_indices_tie_break_left=True)
        tile_z = tl.max(tl.where(lanes[None, :] == lane[:, None], z, float("-inf")), 1)
        better = tile_best > best  # strict: ties keep the lower vocab id, like torch.argmax
        best = tl.where(better, tile_best, best)
        best_z = tl.where(better, tile_z, best_z)
        best_id = tl.where(better, tile * BLOCK_V + lane, best_id)
    offs = rows * S + pid_s
    plane = B * S
    tl.store(part_f_ptr + offs, m, mask=row_ok)
    tl.store(part_f_ptr + plane + offs, s, mask=row_ok)
    tl.store(part_f_ptr + 2 * plane + offs, best, mask=row_ok)
    tl.store(part_f_ptr + 3 * plane + offs, best_z, mask=row_ok)
    tl.store(part_i_ptr + offs, best_id, mask=row_ok)
    if FUSE:
        # Release this program's partials, count its arrival; the tile's last arrival
        # (acquire: it sees every other program's partials) merges them and re-arms the
        # counter for the next launch on this stream.
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + pid_b, 1, sem="acq_rel")
        if arrived == S - 1:
            tl.debug_barrier()
            _merge_splits(part_f_ptr, part_i_ptr, token_ptr, logprob_ptr, lse_ptr, rows,
                          row_ok, B, S, BLOCK_S)
            tl.atomic_xchg(count_ptr + pid_b, 0)


@triton.jit
def _merge_splits(part_f_ptr, part_i_ptr, token_ptr, logprob_ptr, lse_ptr, rows, row_ok, B, S,
                  BLOCK_S: tl.constexpr):
    """The rows' S partials -> token, logprob, lse, BLOCK_S splits at a time (online: the
    running max rescales the running sum; ties keep the first split, the lowest vocab ids).
    Loads bypass L1 (.cg): the partials were written by other programs of this launch."""
    plane = B * S
    m_run = tl.full(rows.shape, float("-inf"), tl.float32)
    s_run = tl.zeros(rows.shape, tl.float32)
    best = tl.full(rows.shape, float("-inf"), tl.float32)
    z_best = tl.full(rows.shape, float("-inf"), tl.float32)
    id_best = tl.zeros(rows.shape, tl.int32)
    for j0 in range(0, S, BLOCK_S):
        j = j0 + tl.arange(0, BLOCK_S)
        ok = row_ok[:, None] & (j < S)[None, :]
        offs = rows[:, None] * S + j[None, :]
        m = tl.load(part_f_ptr + offs, mask=ok, other=float("-inf"), cache_modifier=".cg")
        s = tl.load(part_f_ptr + plane + offs, mask=ok, other=0.0, cache_modifier=".cg")
        score = tl.load(part_f_ptr + 2 * plane + offs, mask=ok, other=float("-inf"),
                        cache_modifier=".cg")
        z = tl.load(part_f_ptr + 3 * plane + offs, mask=ok, other=float("-inf"),
                    cache_modifier=".cg")
        ids = tl.load(part_i_ptr + offs, mask=ok, other=0, cache_modifier=".cg")
        m_new = tl.maximum(m_run, tl.max(m, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s_run = s_run * tl.exp(m_run - shift) + tl.sum(s * tl.exp(m - shift[:, None]), 1)
        m_run = m_new
        chunk_best, win = tl.max(score, 1, return_indices=True,
                                 return_indices_tie_break_left=True)
        here = (j - j0)[None, :] == win[:, None]  # the first split holding the chunk's best
        better = chunk_best > best  # strict: an earlier chunk keeps a tie
        best = tl.where(better, chunk_best, best)
        z_best = tl.where(better, tl.max(tl.where(here, z, float("-inf")), 1), z_best)
        id_best = tl.where(better, tl.sum(tl.where(here, ids, 0), 1), id_best)
    shift = tl.where(m_run == float("-inf"), 0.0, m_run)
    lse = shift + tl.log(tl.where(row_ok, s_run, 1.0))  # (padding rows: no log(0) warning)
    tl.store(token_ptr + rows, id_best.to(tl.int64), mask=row_ok)
    tl.store(logprob_ptr + rows, z_best - lse, mask=row_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)


@triton.jit
def _combine_kernel(part_f_ptr, part_i_ptr, token_ptr, logprob_ptr, lse_ptr, B, S,
                    BLOCK_ROWS: tl.constexpr, BLOCK_S: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    _merge_splits(part_f_ptr, part_i_ptr, token_ptr, logprob_ptr, lse_ptr, rows, rows < B, B, S,
                  BLOCK_S)


@triton.jit
def _probs_kernel(u_ptr, stride_u, prev_ptr, w1_ptr, stride_w1, w2_ptr, stride_w2, temp_ptr,
                  lse_ptr, out_ptr, stride_out, B, V, tiles_per_split,
                  R: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
                  BLOCK_R: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  DOT_UPCAST: tl.constexpr):
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    prev = tl.load(prev_ptr + rows, mask=row_ok, other=0)
    a = _w1_rows(w1_ptr, stride_w1, prev, row_ok, R, BLOCK_R, DOT_UPCAST)
    temp = tl.load(temp_ptr + rows, mask=row_ok, other=0.0)
    t = tl.where(temp > 0, temp, 1.0)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    first = pid_s * tiles_per_split
    last = tl.minimum(first + tiles_per_split, tl.cdiv(V, BLOCK_V))
    for tile in range(first, last):
        cols = tile * BLOCK_V + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        logits = _logits_tile(u_ptr, stride_u, a, w2_ptr, stride_w2, rows, row_ok, cols,
                              col_ok, R, BLOCK_R, DOT_PRECISION, DOT_UPCAST)
        p = tl.exp(logits / t[:, None] - lse[:, None])
        tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_out + cols[None, :], p,
                 mask=row_ok[:, None] & col_ok[None, :])


def merge_block_s(cfg: Plan, fused: bool) -> int:
    """Splits merged at a time. Fused, the merging program holds the tile's BLOCK_B rows, so
    COMBINE_ELEMS / BLOCK_B of them; unfused, all of them (the combine launch then sizes its
    rows per program to COMBINE_ELEMS)."""
    every = checks.next_pow2(cfg.num_splits)
    return min(every, max(1, COMBINE_ELEMS // cfg.block_b)) if fused else every


_counters: dict[tuple, torch.Tensor] = {}


def _arrival_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """Zeroed int32 arrival counters, one per batch tile, kept per (device, stream): the
    kernel re-arms them itself, so launches in order on one stream (or one CUDA graph's
    replays) share them without a memset launch each step."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream)
    buf = _counters.get(key)
    if buf is None or buf.numel() < tiles:
        buf = _counters[key] = torch.zeros(max(tiles, 64), dtype=torch.int32, device=device)
    return buf


def transition_step_triton(
    base_logits: torch.Tensor,  # [B, V] U_k, float32 / bfloat16 / float16
    prev_ids: torch.Tensor,  # [B] int64 target-vocabulary id of x_{k-1}
    w1: torch.Tensor,  # [Vt, r] transition embedding
    w2: torch.Tensor,  # [V, r] nn.Linear(r, V).weight, same dtype as w1
    temperature: torch.Tensor,  # [B] float32, 0 = greedy
    seed: torch.Tensor,  # [B] int64
    position: torch.Tensor,  # [B] int64
    want_probs: bool = False,
    out_probs: torch.Tensor | None = None,  # [B, V] float32
    *,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    config: Plan | None = None,
    fused_combine: bool | None = None,  # None: by FUSED_COMBINE's rule (eager, <= 32 rows)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """-> token [B] int64, logprob [B] f32, lse [B] f32, probs [B, V] f32 or None."""
    b, v = base_logits.shape
    r = w1.shape[1]
    dev = base_logits.device
    checks.rows("base_logits", base_logits, (b, v), dev)
    checks.rows("w1", w1, (w1.shape[0], r), dev)
    checks.rows("w2", w2, (v, r), dev)
    assert w1.dtype == w2.dtype, f"w1 is {w1.dtype} but w2 is {w2.dtype}"
    checks.vector("prev_ids", prev_ids, b, torch.int64, dev)
    checks.vector("temperature", temperature, b, torch.float32, dev)
    checks.vector("seed", seed, b, torch.int64, dev)
    checks.vector("position", position, b, torch.int64, dev)
    assert out_probs is None or want_probs, "out_probs given but want_probs is False"
    token, logprob, lse = checks.outputs(out, b, dev)
    probs = None
    if want_probs:
        probs = out_probs if out_probs is not None else torch.empty(b, v, device=dev)
        checks.rows("out_probs", probs, (b, v), dev, (torch.float32,))
    if b == 0:
        return token, logprob, lse, probs
    cfg = config or plan(b, v, r, w1.element_size(), dev)
    precision = FP32_DOT_PRECISION if w1.dtype == torch.float32 else "ieee"
    consts = dict(R=r, BLOCK_B=cfg.block_b, BLOCK_V=cfg.block_v, BLOCK_R=cfg.block_r,
                  DOT_PRECISION=precision, DOT_UPCAST=DOT_UPCAST, num_warps=cfg.num_warps)
    assert cfg.block_r >= r, f"plan reduces r = {r} in one tl.dot of K = {cfg.block_r}"
    grid = (triton.cdiv(b, cfg.block_b), cfg.num_splits)
    part_f = checks.scratch((4, b, cfg.num_splits), torch.float32, dev)
    part_i = checks.scratch((b, cfg.num_splits), torch.int32, dev)
    fuse = fused_combine
    if fuse is None:
        fuse = FUSED_COMBINE and cfg.block_b <= FUSE_MAX_ROWS and not capturing(dev)
    counters = _arrival_counters(dev, grid[0]) if fuse else part_i  # (unread when not fused)
    block_s = merge_block_s(cfg, fuse)
    _pass1_kernel[grid](base_logits, base_logits.stride(0), prev_ids, w1, w1.stride(0), w2,
                        w2.stride(0), temperature, seed, position, part_f, part_i, counters,
                        token, logprob, lse, b, v, cfg.num_splits, cfg.tiles_per_split,
                        FUSE=fuse, BLOCK_S=block_s, **consts)
    if not fuse:
        block_rows = min(checks.next_pow2(b), max(1, COMBINE_ELEMS // block_s))
        _combine_kernel[(triton.cdiv(b, block_rows),)](part_f, part_i, token, logprob, lse, b,
                                                       cfg.num_splits, BLOCK_ROWS=block_rows,
                                                       BLOCK_S=block_s)
    if want_probs:
        _probs_kernel[grid](base_logits, base_logits.stride(0), prev_ids, w1, w1.stride(0), w2,
                            w2.stride(0), temperature, lse, probs, probs.stride(0), b, v,
                            cfg.tiles_per_split, **consts)
    return token, logprob, lse, probs
