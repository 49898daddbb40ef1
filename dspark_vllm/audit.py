"""`dspark audit-causality`: the DSpark paper's Appendix A with the shipped policy code.

Two-token vocabulary; the target's next-token distribution is (0.7, 0.3) at every
position, the drafter's (0.5, 0.5); steps-per-second is (1, 0.5, 0.45) for 1, 2, 3 batch
tokens; a_1 = 0.8 and c_2 = 1 if x_1 is token 0 else 0 (c_2 legitimately reads x_1).

* shipped (Algorithm 1, stop at the first non-improving admission): the 2-token step is
  priced on the hull of the step times (budget.step_prices: 1.61 s, between 1 s and 2.22 s),
  so admitting x_1 raises goodput (1.8 / 1.61 > 1) whatever x_1 holds; x_2 follows when its
  own survival a_2 clears MIN_SURVIVAL. x_1's value never decides its own verification
  -> (0.70, 0.30). (Priced by the envelope alone, hull=False, the 2-token step costs 2 s,
  admitting x_1 alone lowers goodput and it stops before x_1: the same distribution.)
* peeking (global search without the early stop, kept only for this audit): it admits x_1
  when (1 + a_1 + a_1 c_2) x 0.45 > 1, i.e. exactly when x_1 = 0 -> (0.85, 0.15).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .budget import admit_greedy
from .spec_sampling import speculative_sample

P_TARGET = (0.7, 0.3)
Q_DRAFT = (0.5, 0.5)
SPS = (1.0, 0.5, 0.45)
A1 = 0.8


@dataclass(frozen=True)
class TableCost:
    """Step seconds from a steps-per-second table indexed by batch tokens (1-based)."""

    sps: tuple[float, ...]

    def seconds(self, tokens: int) -> float:
        return 1.0 / self.sps[min(tokens, len(self.sps)) - 1]


def shipped_policy(survivals: list[float]) -> int:
    return admit_greedy([survivals], 1, TableCost(SPS), token_budget=len(SPS))[0]


def peeking_policy(survivals: list[float]) -> int:
    """Global search over n without the early stop: NOT a stopping time (audit only)."""
    theta = [(1.0 + sum(survivals[:n])) * SPS[n] for n in range(len(survivals) + 1)]
    return max(range(len(theta)), key=theta.__getitem__)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return c - h, c + h


def run(policy, n: int = 200_000, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    q = torch.tensor(Q_DRAFT).expand(n, 2, 2)
    p = torch.tensor(P_TARGET).expand(n, 3, 2)
    draft = torch.multinomial(torch.tensor(Q_DRAFT).expand(n * 2, 2), 1, generator=g).view(n, 2)
    c2 = (draft[:, 0] == 0).float()
    verify = torch.tensor([policy([A1, A1 * float(c)]) for c in c2.tolist()])
    n_acc, nxt = speculative_sample(p, q, draft, verify, g)
    first = torch.where(n_acc > 0, draft[:, 0], nxt)
    k0 = int((first == 0).sum())
    lo, hi = wilson(k0, n)
    return {"samples": n, "p0": k0 / n, "p1": 1 - k0 / n, "ci95_p0": (lo, hi),
            "verified_mean": float(verify.float().mean())}


def audit(n: int = 200_000, seed: int = 0) -> dict:
    if n < 1:
        raise ValueError(f"samples={n}: the audit needs at least one sample per policy")
    return {"target": P_TARGET, "shipped": run(shipped_policy, n, seed),
            "peeking": run(peeking_policy, n, seed)}


def format_audit(r: dict) -> str:
    lines = [f"target distribution of the first token: {r['target']}"]
    for name in ("shipped", "peeking"):
        s = r[name]
        lines.append(f"{name:8s} policy: ({s['p0']:.4f}, {s['p1']:.4f})  95% CI for p0 "
                     f"[{s['ci95_p0'][0]:.4f}, {s['ci95_p0'][1]:.4f}]  n={s['samples']}  "
                     f"mean drafts verified {s['verified_mean']:.3f}")
    return "\n".join(lines)
