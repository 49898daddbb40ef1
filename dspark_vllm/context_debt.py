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
COMPACT_ROWS = 64  # unowed rows a step must hold before they are copied away (ContextDebt)


@dataclass
class Rows:
    feats: torch.Tensor  # [n, F] the target's captured layers, concatenated
    positions: torch.Tensor  # [n] int64
    slots: torch.Tensor  # [n] int64 drafter KV-cache slots (< 0: padding)


@dataclass
class _Step:
    """One recorded step: its rows, kept whole, and each owner's share of them (a slice,
    or row indices once drop_partial_blocks has cut it)."""
    rows: Rows
    shares: dict[str, slice | torch.Tensor]

    def owed(self) -> int:
        return sum(map(_size, self.shares.values()))


def _size(share: slice | torch.Tensor) -> int:
    return share.stop - share.start if isinstance(share, slice) else share.shape[0]


class ContextDebt:
    """Steps are kept whole, one entry each, not split per request: an undrafted step at 16
    requests recorded 16 copies (~0.14 ms of a ~65 ms step on 2 cores, about half the
    proposer's work on it). Memory is counted honestly all the same: a step's bytes count
    until its last owner is written or dropped, and once less than half its rows are still
    owed and COMPACT_ROWS or more are not (a long prefill whose owner left beside short
    decodes) the rest are copied out and the step's tensors freed."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes {max_bytes}: must be at least 1")
        self.max_bytes = max_bytes
        self.bytes = 0  # held by the recorded steps' tensors
        self.rows = 0  # owed
        self._steps: dict[int, _Step] = {}  # step order -> step (dicts keep insertion order)
        self._owed: dict[str, list[int]] = {}  # req id -> the steps it owes rows of
        self._seq = 0

    def __len__(self) -> int:
        return self.rows

    def owners(self) -> set[str]:
        return set(self._owed)

    def record(self, req_ids: list[str], bounds: list[int], rows: Rows) -> None:
        """One step's rows; request i owns rows bounds[i]:bounds[i+1] (len(bounds) = B + 1)."""
        if len(bounds) != len(req_ids) + 1:
            raise ValueError(f"{len(req_ids)} requests need {len(req_ids) + 1} bounds, "
                             f"got {len(bounds)}")
        shares = {rid: slice(a, b) for rid, a, b in zip(req_ids, bounds, bounds[1:]) if b > a}
        if not shares:
            return
        n = rows.slots.shape[0]
        if rows.feats.shape[0] != n:  # a padded step: only its first n rows are anyone's
            rows = Rows(rows.feats[:n], rows.positions, rows.slots)
        seq, self._seq = self._seq, self._seq + 1
        self._steps[seq] = _Step(rows, shares)
        for rid in shares:
            self._owed.setdefault(rid, []).append(seq)
        self.rows += bounds[-1] - bounds[0]
        self.bytes += _bytes(rows)

    def over_limit(self) -> bool:
        return self.bytes > self.max_bytes

    def discard(self, owners: set[str]) -> int:
        """Forget the rows of `owners` unwritten -> how many rows."""
        n, touched = 0, set()
        for rid in owners:
            for seq in self._owed.pop(rid, ()):
                n += self._release(seq, rid)
                touched.add(seq)
        self._settle(touched)
        return n

    def drop_partial_blocks(self, owners: set[str], block_size: int) -> int:
        """Forget the rows of `owners` past their last full block of `block_size` positions
        (counted from the request's last owed position) -> how many rows."""
        n, touched = 0, set()
        for rid in owners:
            seqs = self._owed.get(rid)
            if not seqs:
                continue
            pos = {seq: self._steps[seq].rows.positions[self._steps[seq].shares[rid]]
                   for seq in seqs}
            end = (max(int(p.max()) for p in pos.values()) + 1) // block_size * block_size
            for seq, p in pos.items():
                keep = p < end
                if bool(keep.all()):
                    continue
                step = self._steps[seq]
                share = step.shares[rid]
                idx = _indices([share], p.device)[keep]
                n += _size(share) - idx.shape[0]
                touched.add(seq)
                if idx.shape[0]:
                    self.rows -= _size(share) - idx.shape[0]
                    step.shares[rid] = idx
                else:
                    self._release(seq, rid)
                    seqs.remove(seq)
            if not seqs:
                del self._owed[rid]
        self._settle(touched)
        return n

    def take(self, owners: set[str] | None = None) -> Rows | None:
        """Remove and return the rows of `owners` (all when None), in step order, one row
        per slot (the latest); None when nothing is owed."""
        rids = list(self._owed) if owners is None else [r for r in owners if r in self._owed]
        wanted: dict[int, list[str]] = {}
        for rid in rids:
            for seq in self._owed.pop(rid):
                wanted.setdefault(seq, []).append(rid)
        parts = []
        for seq in sorted(wanted):
            step = self._steps[seq]
            if (len(wanted[seq]) == len(step.shares)
                    and step.owed() == step.rows.slots.shape[0]):
                parts.append(step.rows)  # every row of the step owed, to these: no gather
            else:
                r = step.rows
                mine = set(wanted[seq])  # their rows in the step's own order
                idx = _indices([s for rid, s in step.shares.items() if rid in mine],
                               r.slots.device)
                parts.append(Rows(r.feats[idx], r.positions[idx], r.slots[idx]))
            for rid in wanted[seq]:
                self._release(seq, rid)
        self._settle(wanted)
        if not parts:
            return None
        if len(parts) == 1:
            return latest_per_slot(parts[0])
        return latest_per_slot(Rows(torch.cat([r.feats for r in parts]),
                                    torch.cat([r.positions for r in parts]),
                                    torch.cat([r.slots for r in parts])))

    def _release(self, seq: int, rid: str) -> int:
        """`rid` no longer owes its share of step `seq` -> the rows it owed there."""
        n = _size(self._steps[seq].shares.pop(rid))
        self.rows -= n
        return n

    def _settle(self, seqs) -> None:
        """After releases: free each of the steps `seqs` with its last owner, or copy out
        what is still owed once that is under half its rows and at least COMPACT_ROWS rows
        would be freed (a prefill beside decodes; a decode step's few rows are not worth
        a copy at every departure)."""
        for seq in seqs:
            step = self._steps[seq]
            held, owed = step.rows.slots.shape[0], step.owed()
            if not step.shares:
                del self._steps[seq]
                self.bytes -= _bytes(step.rows)
            elif 2 * owed < held and held - owed >= COMPACT_ROWS:
                r = step.rows
                idx = _indices(list(step.shares.values()), r.slots.device)
                kept = Rows(r.feats[idx], r.positions[idx], r.slots[idx])  # copies
                offsets = [0]
                for s in step.shares.values():
                    offsets.append(offsets[-1] + _size(s))
                step.shares = {o: slice(a, b)
                               for o, a, b in zip(step.shares, offsets, offsets[1:])}
                self.bytes += _bytes(kept) - _bytes(r)
                step.rows = kept


def _indices(shares: list[slice | torch.Tensor], device: torch.device) -> torch.Tensor:
    """Row indices of `shares`, in their order -> [n] int64."""
    return torch.cat([torch.arange(s.start, s.stop, device=device) if isinstance(s, slice)
                      else s for s in shares])


def _bytes(rows: Rows) -> int:
    return rows.feats.nbytes + rows.positions.nbytes + rows.slots.nbytes


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
