"""Patch: GPUModelRunner.initialize_kv_cache (also the CPU runner's, via super()).

Why: the load-aware budget needs steps-per-second as a function of batch tokens on the
running hardware. Once the KV cache exists, the worker can time real forward passes of
uniform decode batches (B requests x q tokens) with vLLM's own dummy-run machinery; the
profile is cached per model, machine and execution mode (eager or compiled) and read by
the scheduler at start-up (a profile taken while another process held the cores is marked,
used once, and taken again at the next start: contention would otherwise inflate the slope
for good). vLLM has no hook between "KV cache ready" and "scheduler built" that runs in
the worker.
Removed by: a worker-side start-up hook for plugins (or an upstream cost profile, as the
V2 runner's adaptive verification has).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time

from . import frame_stack, is_patched, mark

log = logging.getLogger("vllm.dspark.cost")
BATCHES = (1, 2, 4, 8, 16)
QUERY_LENS = (1, 2, 4, 8)
# One request at every query length up to the longest: a quiet engine verifies any of
# them, and the cost need not be a line there (a 2-token step can cost more than a
# 4-token one; cost_model.deviations).
SINGLE_QUERY_LENS = tuple(range(1, max(QUERY_LENS) + 1))
CONTEXT = 256  # attention context of the profiled requests
TIME_CAP_S = 45.0  # the whole profile stays bounded; unmeasured shapes are skipped
PROFILE_SITE = "cost_profile"  # the profile's own frame-stack padding (frame_stack.call)
REPEATS = 3  # timed runs per shape after a warm-up run; the fastest counts (noise only adds)


def profile(runner) -> tuple[list[tuple[int, float]], bool]:
    """(batch tokens, step seconds) for uniform decode batches (forward, the drafter's
    dummy pass, and logits at every token), within TIME_CAP_S; and whether the profile
    ran contended (CPU only: this process's CPU time against its threads' wall time)."""
    import torch

    from ..cost_model import contended

    wall0, cpu0 = time.perf_counter(), time.process_time()
    points = _time_shapes(runner)
    wall, cpu = max(time.perf_counter() - wall0, 1e-9), time.process_time() - cpu0
    on_cpu = getattr(getattr(runner, "device", None), "type", "cpu") == "cpu"
    threads = torch.get_num_threads()
    busy = on_cpu and contended(cpu, wall, threads)
    share = f"{cpu / wall:.2f} of {threads} threads' CPU time"
    if busy:
        log.warning("DSpark cost profile ran contended (%s): used for this run, profiled "
                    "again at the next start", share)
    else:
        log.info("DSpark cost profile: %s", share)
    return points, busy


def _time_shapes(runner) -> list[tuple[int, float]]:
    import torch

    max_seqs = runner.scheduler_config.max_num_seqs
    saved = runner.uniform_decode_query_len
    points, t_end = [], time.perf_counter() + TIME_CAP_S
    shapes = [(1, q) for q in SINGLE_QUERY_LENS] + [
        (b, q) for q in QUERY_LENS for b in BATCHES if 1 < b <= max_seqs]
    dummy_run = functools.partial(runner._dummy_run, uniform_decode=True,
                                  force_attention=True, profile_seq_lens=CONTEXT)
    try:
        if frame_stack.active():
            # Time the forward at a frame depth where CPython's frame stack does not
            # thrash, as the served forward runs (patches/frame_stack.py), not at whatever
            # depth this call sits: a thrashing depth adds a fixed cost to every step.
            dummy_run = functools.partial(frame_stack.call, PROFILE_SITE, dummy_run)
            runner.uniform_decode_query_len = 1
            while not frame_stack.settled(PROFILE_SITE):  # from this frame, as below
                dummy_run(1)
        for b, q in shapes:
            if b * q > runner.max_num_tokens:
                continue
            runner.uniform_decode_query_len = q
            if time.perf_counter() > t_end:
                return points
            times = []
            for rep in range(REPEATS + 1):  # the first run warms up this shape
                t0 = time.perf_counter()
                hidden, _ = dummy_run(b * q)
                # Verification needs target logits at every scheduled token, not
                # only the last per request as the dummy run computes: on a
                # compute-bound CPU that LM-head is a large part of a draft's cost.
                hidden = hidden[0] if isinstance(hidden, tuple) else hidden
                runner.model.compute_logits(hidden[: b * q])
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                if rep:
                    times.append(time.perf_counter() - t0)
            points.append((b * q, min(times)))
    finally:
        runner.uniform_decode_query_len = saved
    return points


def apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    orig = GPUModelRunner.initialize_kv_cache
    if is_patched(orig):
        return

    @functools.wraps(orig)
    def initialize_kv_cache(self, kv_cache_config, *args, **kwargs):
        out = orig(self, kv_cache_config, *args, **kwargs)
        sc = self.speculative_config
        if (sc is None or sc.method != "dspark" or not sc.enable_adaptive_verification
                or kwargs.get("is_profiling") or (args and args[0] is True)):
            return out
        from ..cost_model import config_profile_key, profile_path, read_profile

        path = profile_path(config_profile_key(self.vllm_config))
        if read_profile(path, trusted_only=True) is not None:
            return out
        t0 = time.perf_counter()
        try:
            points, busy = profile(self)
        except Exception as e:  # noqa: BLE001 - a failed profile must never stop the engine
            log.warning("DSpark cost profile failed (%s); the budget starts from a prior "
                        "and learns online", e)
            return out
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"points": points, "context": CONTEXT, "contended": busy}))
        tmp.replace(path)
        log.info("DSpark cost profile: %d shapes in %.1fs -> %s", len(points),
                 time.perf_counter() - t0, path)
        return out

    GPUModelRunner.initialize_kv_cache = mark(initialize_kv_cache, "cost_profile")
