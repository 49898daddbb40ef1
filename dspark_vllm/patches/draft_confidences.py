"""Patch: GPUModelRunner.take_draft_token_ids.

Why: the scheduler sizes each request's verification budget from the drafter's per-token
confidences, but the V1 worker->engine message (DraftTokenIds) carries only token ids. The
wrapper attaches the confidences, aligned with `req_ids`, as `dspark_confidences`, the
drafting time of the step as `dspark_draft_seconds` (phase metrics), the drafter's
context rows so far (written, dropped, owed now) as `dspark_context_rows`, and the
requests that verified prompt lookup's block so far as `dspark_lookup_blocks`.
Removed by: a confidence field on DraftTokenIds (upstream V2 keeps them on the device).
"""

from __future__ import annotations

import functools

from . import is_patched, mark


def apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    orig = GPUModelRunner.take_draft_token_ids
    if is_patched(orig):
        return

    @functools.wraps(orig)
    def take_draft_token_ids(self):
        out = orig(self)
        drafter = getattr(self, "drafter", None)
        conf = getattr(drafter, "last_confidences", None)
        if out is not None and conf is not None:
            n = len(out.req_ids)
            out.dspark_confidences = conf[:n, : len(out.draft_token_ids[0]) if n else 0].tolist()
        if out is not None:
            out.dspark_draft_seconds = getattr(drafter, "last_draft_seconds", 0.0)
            out.dspark_lookup_blocks = getattr(drafter, "lookup_blocks", 0)
            if hasattr(drafter, "debt"):
                out.dspark_context_rows = (drafter.context_rows_written,
                                           drafter.context_rows_dropped, len(drafter.debt))
        return out

    GPUModelRunner.take_draft_token_ids = mark(take_draft_token_ids, "draft_confidences")
