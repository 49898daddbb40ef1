"""Deferred drafter context: what a step that drafts nothing owes the drafter's K/V cache.

A DSpark drafter reads, for every earlier token, context K/V computed from the target's
captured layers (fc over the layers, then each drafter layer's K/V projection). Written
step by step that is a 16-row GEMM chain per engine step at 16 requests (~2 ms of an ~80 ms
step on 2 CPU cores), paid even on the steps the load-aware budget drafts nothing, which
under load is most of them. Steps that draft nothing therefore only record the rows (the
captured layers, positions and cache slots the write would have used), and the rows are
written in one batched pass when something will read them:

  * before any step that drafts (its blocks attend to the whole context);
  * when their request leaves the batch (finished or preempted) and the prefix cache is on:
    its full blocks stay cached for later requests, whose drafts read that K/V. A block
    handed to a new request is written by the new owner only after this (its rows are
    recorded later), so every slot still sees its writes in step order. The rows of its last,
    partial block are dropped: the prefix cache keeps only full blocks, so nothing reads
    them again. With the prefix cache off nothing reads a departed request's K/V again and
    all its rows are dropped: never computed at all;
  * when more than `max_bytes` of rows are owed (bounded memory).

Within one write a slot recorded twice (a rejected draft's position, recorded again when
the real token got there) keeps its later row, as the step-by-step writes left it; slots
below 0 (padding) are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_BYTES = 64 << 20  # owed before a forced write: ~9.7k rows of SmolLM2's 3 x 576 fp32
# layers (~600 decode steps at 16 requests), ~2.7k of an 8B target's 3 x 4096 bf16 ones


@dataclass
class Rows:
    feats: torch.Tensor  # [n, F] the target's captured layers, concatenated
    positions: torch.Tensor  # [n] int64
    slots: torch.Tensor  # [n] int64 drafter KV-cache slots (< 0: padding)


class ContextDebt:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes {max_bytes}: must be at least 1")
        self.max_bytes = max_bytes
        self.bytes = 0
        self._owed: dict[str, list[tuple[int, Rows]]] = {}  # req id -> (step order, rows)
        self._seq = 0
        self.rows = 0

    def __len__(self) -> int:
        return self.rows

    def owners(self) -> set[str]:
        return set(self._owed)

    def record(self, req_ids: list[str], bounds: list[int], rows: Rows) -> None:
        """One step's rows; request i owns rows bounds[i]:bounds[i+1] (len(bounds) = B + 1)."""
        if len(bounds) != len(req_ids) + 1:
            raise ValueError(f"{len(req_ids)} requests need {len(req_ids) + 1} bounds, "
                             f"got {len(bounds)}")
        whole = rows.feats.shape[0]
        for rid, a, b in zip(req_ids, bounds, bounds[1:]):
            if b > a:
                # A part of the step is copied: a view would keep the whole step's features
                # alive (a 4k-token prefill's) after the other requests' rows are written.
                feats = rows.feats[a:b] if b - a == whole else rows.feats[a:b].clone()
                chunk = Rows(feats, rows.positions[a:b], rows.slots[a:b])
                self._owed.setdefault(rid, []).append((self._seq, chunk))
                self._seq += 1
                self.rows += b - a
                self.bytes += (b - a) * _row_bytes(rows)

    def over_limit(self) -> bool:
        return self.bytes > self.max_bytes

    def discard(self, owners: set[str]) -> int:
        """Forget the rows of `owners` unwritten -> how many rows."""
        n = 0
        for rid in owners:
            for _, r in self._owed.pop(rid, ()):
                n += r.slots.shape[0]
                self.bytes -= r.slots.shape[0] * _row_bytes(r)
        self.rows -= n
        return n

    def drop_partial_blocks(self, owners: set[str], block_size: int) -> int:
        """Forget the rows of `owners` past their last full block of `block_size` positions
        (counted from the request's last owed position) -> how many rows."""
        n = 0
        for rid in owners:
            chunks = self._owed.get(rid)
            if not chunks:
                continue
            end = (max(int(r.positions.max()) for _, r in chunks) + 1) // block_size * block_size
            kept = []
            for seq, r in chunks:
                keep = r.positions < end
                gone = int(r.positions.shape[0] - keep.sum())
                if gone:
                    n += gone
                    self.bytes -= gone * _row_bytes(r)
                    r = Rows(r.feats[keep], r.positions[keep], r.slots[keep])
                if r.positions.shape[0]:
                    kept.append((seq, r))
            if kept:
                self._owed[rid] = kept
            else:
                del self._owed[rid]
        self.rows -= n
        return n

    def take(self, owners: set[str] | None = None) -> Rows | None:
        """Remove and return the rows of `owners` (all when None), in step order, one row
        per slot (the latest); None when nothing is owed."""
        rids = list(self._owed) if owners is None else [r for r in owners if r in self._owed]
        picked = sorted((c for r in rids for c in self._owed.pop(r)), key=lambda c: c[0])
        if not picked:
            return None
        rows = [r for _, r in picked]
        n = sum(r.slots.shape[0] for r in rows)
        self.rows -= n
        self.bytes -= n * _row_bytes(rows[0])
        return latest_per_slot(Rows(torch.cat([r.feats for r in rows]),
                                    torch.cat([r.positions for r in rows]),
                                    torch.cat([r.slots for r in rows])))


def _row_bytes(rows: Rows) -> int:
    return rows.feats.shape[1] * rows.feats.element_size() + 16  # + position and slot


def latest_per_slot(rows: Rows) -> Rows | None:
    """Rows with a valid slot, the last one for each slot, in their original order."""
    n = rows.slots.shape[0]
    order = torch.arange(n, device=rows.slots.device)
    valid = rows.slots >= 0
    slots, order = rows.slots[valid], order[valid]
    if slots.numel() == 0:
        return None
    uniq, inv = torch.unique(slots, return_inverse=True)
    last = torch.full((uniq.shape[0],), -1, dtype=order.dtype, device=order.device)
    last.scatter_reduce_(0, inv, order, reduce="amax")
    keep = last.sort().values
    return Rows(rows.feats[keep], rows.positions[keep], rows.slots[keep])
