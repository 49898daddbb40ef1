"""Steps-per-second as a function of batch tokens, measured on the running hardware.

Seeded from a start-up profile (cached per model, machine and execution mode) and refitted
online from the step times the engine actually observes, so it follows drift (thermal
limits, other tenants, longer contexts).
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
from collections import deque
from pathlib import Path

import numpy as np

from .budget import StepCost

log = logging.getLogger("vllm.dspark.cost")

REFIT_EVERY = 32  # observed steps between refits: cheap, and fast enough to follow drift
WINDOW = 1024  # recent steps the online fit uses
PRIOR = StepCost(alpha=0.05, beta=0.002)  # used only until the first profile or refit
# The draft pass before its first refit: ~3 ms + 0.2 ms per drafted slot, what the bundled
# 2-layer drafter costs on a 2-core CPU (16 requests x 7 slots ~ 25 ms per step).
DRAFT_PRIOR = StepCost(alpha=0.003, beta=0.0002)
PROFILE_WEIGHT = 0.25  # profile points keep anchoring the fit where traffic is sparse
# Traffic spanning fewer batch-token sizes than this cannot identify a slope (a steady
# 16-request load runs ~40 tokens every step): then only the intercept follows the
# observations and the slope stays the profile's. Refitting both from one cluster of
# points lets noise (or the drafter's cost, which rides on the intercept) tilt the slope,
# and the slope is exactly what the admission policy trades against.
MIN_SPAN_TOKENS = 8
PROFILE_VERSION = 5  # bump when what the start-up profile times changes (2: + logits,
                     # 3: fastest repeat per shape, contended profiles marked, 4: every
                     # single-request query length, the shapes a quiet engine verifies,
                     # 5: timed at the frame-stack padding, patches/frame_stack.py)
# A profiled batch size whose fastest time lies off the profile's line by less than this
# share of the line is taken to be on it: two or three repeats leave a few per cent of
# noise, and a deviation moves admissions, so only a real one should (a one-request
# server's profile on the 2-core CPU: +19% at 2 tokens, -14% at 4; README, "The budget
# at one request").
DEV_MIN_SHARE = 0.05
# A profile is contended when the profiling process got less than this share of the CPU
# time its threads could use (another tenant on the cores). One busy process beside a
# 2-thread profile on this 2-core CPU: share 1.2-1.4 of 2 and shapes 2.5-4x slower; alone
# 1.96-1.97. A contended profile is used for that run (better than the prior) but not
# trusted by the next start, which profiles again.
CONTENDED_SHARE = 0.8


def fit(tokens: np.ndarray, seconds: np.ndarray, weights: np.ndarray | None = None) -> StepCost:
    """Weighted least squares for t = alpha + beta * T with alpha, beta >= 0."""
    w = np.ones_like(seconds) if weights is None else weights
    x = np.stack([np.ones_like(tokens, dtype=float), tokens.astype(float)], 1) * w[:, None]
    y = seconds * w
    (alpha, beta), *_ = np.linalg.lstsq(x, y, rcond=None)
    if beta < 0:  # flat: the mean time
        alpha, beta = float(np.average(seconds, weights=w)), 0.0
    if alpha < 0:  # through the origin
        alpha, beta = 0.0, float((tokens * seconds * w * w).sum() / (tokens * tokens * w * w).sum())
    return StepCost(float(alpha), float(beta))


def profile_key(model: str, dtype: str, max_num_seqs: int, execution: str) -> str:
    """The cache key of a start-up profile: what a step's cost depends on. `execution`:
    how vLLM runs the model (config_profile_key), since a compiled step is not an eager
    one's: in bfloat16 on the AMX Xeon a 16-token step took 23.6 ms compiled and 29.8 ms
    eager (the cached profiles of 2026-12-05/06), and until this was in the key, compiled
    servers read the eager profile an earlier server had cached."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                   .splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    raw = (f"v{PROFILE_VERSION}|{Path(model).name}|{dtype}|{max_num_seqs}|{cpu}|"
           f"{platform.node()}|{execution}")
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def config_profile_key(vllm_config) -> str:
    """profile_key for a running engine: its model, dtype, max_num_seqs and execution mode
    (torch.compile's mode and the CUDA-graph mode, --enforce-eager sets both to none; and
    whether the forward runs at the frame-stack padding)."""
    from .patches import frame_stack

    mc, cc = vllm_config.model_config, vllm_config.compilation_config
    execution = (f"compile={getattr(cc.mode, 'name', cc.mode)},"
                 f"graphs={getattr(cc.cudagraph_mode, 'name', cc.cudagraph_mode)},"
                 f"frames={'padded' if frame_stack.active() else 'as-called'}")
    return profile_key(mc.model, str(mc.dtype), vllm_config.scheduler_config.max_num_seqs,
                       execution)


def profile_path(key: str) -> Path:
    from .target import cache_dir

    return cache_dir() / "cost" / f"{key}.json"


def contended(cpu_seconds: float, wall_seconds: float, threads: int) -> bool:
    """Did a process whose `threads` compute threads ran for `wall_seconds` get less than
    CONTENDED_SHARE of the CPU time they could use? (Contention only adds wall time.)"""
    if wall_seconds <= 0 or threads <= 0:
        return False
    return cpu_seconds / wall_seconds < CONTENDED_SHARE * threads


def _profile_file(path: Path) -> tuple[list[tuple[int, float]], bool] | None:
    """(points, measured under contention) of a cached profile; None when missing or
    unreadable (then the engine profiles again and overwrites it)."""
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        return [(int(t), float(s)) for t, s in raw["points"]], bool(raw.get("contended"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("ignoring the corrupt DSpark cost profile %s (%s: %s); it is re-profiled",
                    path, type(e).__name__, e)
        return None


def read_profile(path: Path, *, trusted_only: bool = False) -> list[tuple[int, float]] | None:
    """The cached start-up profile's (tokens, seconds) points; None when the file is
    missing or unreadable, and with `trusted_only` also when it was measured under
    contention."""
    got = _profile_file(path)
    return None if got is None or (trusted_only and got[1]) else got[0]


def fastest_by_tokens(points: list[tuple[int, float]]) -> dict[int, float]:
    """Profile points -> {batch tokens: the fastest of its shapes}, ascending."""
    fastest: dict[int, float] = {}
    for t, s in points:
        fastest[t] = min(s, fastest.get(t, s))
    return dict(sorted(fastest.items()))


def lower_envelope(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Profile points -> (T, the fastest step of T or more tokens), one a batch size: what a
    contended profile still tells. Contention only adds time, and unevenly: a start-up
    profile taken beside three compiling servers on the 2-core EPYC timed a 3-token step at
    125 ms and a 4-token one at 29 ms (2026-12-06), which as a deviation priced every
    3-token step at 133 ms for the whole run."""
    out, best = [], float("inf")
    for t, s in reversed(fastest_by_tokens(points).items()):
        best = min(best, s)
        out.append((t, best))
    return out[::-1]


def deviations(points: list[tuple[int, float]], line: StepCost) -> tuple[tuple[int, float], ...]:
    """StepCost.dev from profile points: each batch size's fastest time off the line, as
    (T, seconds), zero where within DEV_MIN_SHARE of it; () when every point is on it."""
    fastest = fastest_by_tokens(points)
    dev = []
    for t, s in fastest.items():
        d = s - line.seconds(t)
        dev.append((t, d if abs(d) > DEV_MIN_SHARE * line.seconds(t) else 0.0))
    return tuple(dev) if any(d for _, d in dev) else ()


class CostModel:
    """The line is refitted online; the profile's deviations from it (kernel effects at
    particular batch sizes) are kept, and taken out of what the line is fitted to.
    A contended profile is read as its lower envelope: the online refit moves only the
    line, so a spike contention left at one batch size would stand as a deviation all run,
    and a step size the budget then never admits is never observed (served on 2026-12-06:
    a 3-token step priced at 133 ms held one request's budget at one draft a step, 0.71x
    K = 3's speed)."""

    def __init__(self, profile: list[tuple[int, float]] | None = None,
                 prior: StepCost = PRIOR, contended: bool = False) -> None:
        self.profile = lower_envelope(profile or []) if contended else list(profile or [])
        self.samples: deque[tuple[int, float]] = deque(maxlen=WINDOW)
        self.refits = 0
        self._since = 0
        self.cost = prior
        if len(self.profile) >= 2:
            line = fit(*map(np.asarray, zip(*self.profile)))
            self.cost = StepCost(line.alpha, line.beta, deviations(self.profile, line))

    @classmethod
    def load(cls, path: Path) -> CostModel:
        points, contended = _profile_file(path) or ([], False)
        return cls(points, contended=contended)

    def observe(self, tokens: int, seconds: float) -> bool:
        """Record one step; returns True when this observation triggered a refit."""
        if tokens <= 0 or not np.isfinite(seconds) or seconds <= 0:
            return False
        self.samples.append((tokens, seconds))
        self._since += 1
        if self._since < REFIT_EVERY:
            return False
        self._since = 0
        dev = self.cost.dev
        obs_t, obs_s = (np.asarray(v, float) for v in zip(*self.samples))
        if dev:  # StepCost.deviation for every sample (np.interp holds the ends flat too)
            knots_t, knots_d = (np.asarray(v, float) for v in zip(*dev))
            obs_s = obs_s - np.interp(obs_t, knots_t, knots_d)
        if np.ptp(obs_t) < MIN_SPAN_TOKENS:
            beta = self.cost.beta  # slope not identifiable from this traffic: keep it
            alpha = float(np.median(obs_s - beta * obs_t))  # median: robust to stalls
            self.cost = StepCost(max(alpha, 0.0), beta, dev)
        else:
            prof_t = np.array([t for t, _ in self.profile], float)
            prof_s = np.array([s - self.cost.deviation(t) for t, s in self.profile], float)
            w = np.array([1.0] * len(obs_t) + [PROFILE_WEIGHT] * len(prof_t))
            line = fit(np.concatenate([obs_t, prof_t]), np.concatenate([obs_s, prof_s]), w)
            self.cost = StepCost(line.alpha, line.beta, dev)
        self.refits += 1
        return True

    def table(self, tokens=(1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128)) -> dict[int, float]:
        return {t: self.cost.seconds(t) for t in tokens}
