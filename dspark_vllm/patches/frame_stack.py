"""Patch: GPUModelRunner._model_forward, on CPU: keep CPython's frame stack from thrashing.

Why: CPython 3.11+ keeps frames in 16 KiB chunks. It maps a new chunk when a call does not
fit in the current one and unmaps it the moment that call returns. A compiled vLLM graph
calls its attention and KV-cache ops through Python (90 calls a step on the bundled
target), so when a chunk boundary falls just there every one of those calls maps and unmaps
a chunk: page faults, and a TLB flush of the other compute thread's core each time. Whether
it does is decided by the call depth in bytes: served on a 2-core AMX Xeon a DSpark worker
thrashed (30,137 minor faults in 10 s, 0.91-0.92x plain's throughput without ever drafting),
plain vLLM less (12,002), and one more frame around the forward took both to ~1,250 and
moved them 5-15% (benchmarks/results/served-forward-wrapper-1206).
So: the forward runs below `pad` extra frames, with `pad` chosen per call site from the
calling thread's own minor faults over its first forwards (fewest wins, smallest on ties).
Removed by: CPython keeping a freed chunk for reuse, or vLLM's CPU ops called without a
Python frame.
"""

from __future__ import annotations

import functools
import os
import resource
import sys

from . import is_patched, mark

PADS = tuple(range(0, 24, 3))  # frames of padding tried (a pad frame is ~100 bytes)
TRIES = 3  # forwards per candidate; its fewest faults is its score (first touches are noise)


def thread_faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def padded(n: int, fn, args, kwargs):
    """fn(*args, **kwargs) called `n` Python frames deeper than this call."""
    if n > 0:
        return padded(n - 1, fn, args, kwargs)
    return fn(*args, **kwargs)


class PadChooser:
    """The padding for one call site: candidates in turn, TRIES forwards each, then fixed
    at the one whose fewest minor faults per forward was smallest (the smaller pad on ties)."""

    def __init__(self, pads=PADS, tries: int = TRIES) -> None:
        self.pads, self.tries = pads, tries
        self.scores: dict[int, int] = {}
        self.calls = 0
        self.chosen: int | None = None

    def next_pad(self) -> int:
        return self.chosen if self.chosen is not None else self.pads[self.calls // self.tries]

    def record(self, pad: int, faults: int) -> None:
        if self.chosen is not None:
            return
        self.scores[pad] = min(faults, self.scores.get(pad, faults))
        self.calls += 1
        if self.calls == len(self.pads) * self.tries:
            self.chosen = min(self.pads, key=lambda p: (self.scores[p], p))


_choosers: dict[object, PadChooser] = {}  # by call site: a code object or a name
_applied = False


def active() -> bool:
    """Is the fix on in this process (apply() ran on a CPU with a chunked frame stack)?"""
    return _applied


def call(site, fn, *args, **kwargs):
    """fn(*args, **kwargs) at the padding chosen for `site`; until it is chosen, each call
    tries the next candidate and scores it by this thread's minor faults."""
    chooser = _choosers.get(site)
    if chooser is None:
        chooser = _choosers[site] = PadChooser()
    pad = chooser.next_pad()
    if chooser.chosen is not None:
        return padded(pad, fn, args, kwargs)
    before = thread_faults()
    out = padded(pad, fn, args, kwargs)
    chooser.record(pad, thread_faults() - before)
    return out


def settled(site) -> bool:
    """Is the padding for `site` chosen? (Calibrate by calling through `site` until it is,
    from the frame the later calls come from: the padding is right for that depth only.)"""
    return site in _choosers and _choosers[site].chosen is not None


def apply_if_wanted(dspark_engine: bool) -> None:
    """Who gets the fix (config.FRAME_STACK_ENV): DSpark engines unless it is "0"; any
    engine when it is "1" (a benchmark's plain decoding, so no server wins or loses by its
    call depth)."""
    from ..config import FRAME_STACK_ENV

    wanted = os.environ.get(FRAME_STACK_ENV)
    if wanted == "1" or (dspark_engine and wanted != "0"):
        apply()


def apply() -> None:
    global _applied
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or sys.version_info < (3, 11):
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    orig = GPUModelRunner._model_forward
    if is_patched(orig):
        return

    @functools.wraps(orig)
    def _model_forward(self, *args, **kwargs):
        return call(sys._getframe(1).f_code, orig, self, *args, **kwargs)

    GPUModelRunner._model_forward = mark(_model_forward, "frame_stack")
    _applied = True
