"""The step-cost model: least-squares fit, online refits that follow drift, profile cache."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dspark_vllm.budget import StepCost
from dspark_vllm.cost_model import (DEV_MIN_SHARE, MIN_SPAN_TOKENS, REFIT_EVERY, CostModel,
                                    contended, deviations, fit, read_profile)


def test_fit_recovers_a_line_and_never_goes_negative():
    t = np.array([1, 2, 4, 8, 16, 32])
    c = fit(t, 0.04 + 0.002 * t)
    assert c.alpha == pytest.approx(0.04) and c.beta == pytest.approx(0.002)
    flat = fit(t, 0.05 - 0.0001 * t)  # a falling line is noise: the mean, slope 0
    assert flat.beta == 0.0 and flat.alpha == pytest.approx(np.mean(0.05 - 0.0001 * t))
    through_origin = fit(t, 0.003 * t - 0.01)
    assert through_origin.alpha == 0.0 and through_origin.beta > 0


def _profiled() -> CostModel:
    return CostModel([(t, 0.04 + 0.002 * t) for t in (1, 2, 4, 8, 16, 32)])


def test_steady_traffic_moves_only_the_intercept():
    """A 16-request load runs ~40 tokens every step: the slope is not identifiable from
    it, so a slower machine (or the drafter's cost) shows up in alpha, not in beta."""
    cm = _profiled()
    rng = np.random.default_rng(0)
    refits = [cm.observe(int(t), 0.09 + 0.002 * t + rng.normal(0, 0.002))
              for t in rng.integers(38, 38 + MIN_SPAN_TOKENS - 1, REFIT_EVERY)]
    assert refits.count(True) == 1 and cm.refits == 1
    assert cm.cost.beta == pytest.approx(0.002)
    assert cm.cost.alpha == pytest.approx(0.09, abs=0.003)


def test_varied_traffic_refits_the_slope():
    cm = _profiled()
    for i in range(REFIT_EVERY):
        t = 1 + (i % 8) * 8  # 1 .. 57 tokens
        cm.observe(t, 0.03 + 0.004 * t)
    assert cm.cost.beta == pytest.approx(0.004, rel=0.15)
    assert cm.cost.beta > 0.002


def _humped() -> list[tuple[int, float]]:
    """A profile on a line but for a 2-token step 20% dear and a 2% noisy 8-token one."""
    pts = [(t, 0.04 + 0.002 * t) for t in (1, 3, 4, 16, 32)]
    return pts + [(2, 0.044 * 1.2), (2, 0.044 * 1.3), (8, 0.056 * 1.02), (8, 0.056 * 1.04)]


def test_a_profiled_deviation_is_kept_and_noise_is_not():
    cm = CostModel(_humped())
    line = fit(*map(np.asarray, zip(*_humped())))
    assert cm.cost.alpha == line.alpha and cm.cost.beta == line.beta
    dev = dict(cm.cost.dev)
    assert dev[2] > DEV_MIN_SHARE * line.seconds(2)  # the hump, from the fastest repeat
    assert cm.cost.seconds(2) == pytest.approx(0.044 * 1.2)
    assert cm.cost.seconds(2) > cm.cost.seconds(3)  # dearer than a bigger step
    assert dev[8] == 0.0 and dev[32] == 0.0  # within DEV_MIN_SHARE of the line: noise
    assert deviations([(t, 0.04 + 0.002 * t) for t in (1, 2, 4)], StepCost(0.04, 0.002)) == ()


def test_a_refit_moves_the_line_and_keeps_the_profiled_shape():
    cm = CostModel(_humped())
    hump = cm.cost.seconds(2) - cm.cost.seconds(3)
    # A slower machine: every step 10 ms dearer, the hump included (one request, 1-5 tokens).
    for i in range(REFIT_EVERY):
        t = 1 + i % 5
        cm.observe(t, cm.cost.seconds(t) + 0.010)
    assert cm.refits == 1
    assert cm.cost.seconds(2) - cm.cost.seconds(3) == pytest.approx(hump)
    assert cm.cost.seconds(4) == pytest.approx(CostModel(_humped()).cost.seconds(4) + 0.010)


def test_bad_observations_are_ignored_and_unprofiled_start_uses_a_prior():
    cm = CostModel()
    assert cm.cost == StepCost(0.05, 0.002)
    assert not any(cm.observe(t, s) for t, s in [(0, 0.1), (4, float("nan")), (4, -1.0)])
    assert not cm.samples


def test_profile_round_trips_through_its_cache_file(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"points": [[1, 0.042], [16, 0.072]], "context": 256}))
    cm = CostModel.load(path)
    assert cm.cost.alpha == pytest.approx(0.04) and cm.cost.beta == pytest.approx(0.002)
    assert CostModel.load(tmp_path / "missing.json").profile == []


@pytest.mark.parametrize("text", ["{not json", '{"points": [[1, "x"]]}', '{"pts": []}', "[]"])
def test_a_corrupt_profile_cache_is_named_and_ignored(tmp_path, caplog, text):
    path = tmp_path / "p.json"
    path.write_text(text)
    assert read_profile(path) is None  # the engine profiles again and overwrites it
    assert str(path) in caplog.text
    assert CostModel.load(path).cost == StepCost(0.05, 0.002)  # the prior until refits


def test_contention_is_a_short_share_of_cpu_time():
    # Measured on the 2-core dev CPU: alone 1.96-1.97 of 2 threads; one busy process
    # beside it 1.2-1.4.
    assert not contended(1.96, 1.0, threads=2)
    assert contended(1.3, 1.0, threads=2)
    assert not contended(0.0, 0.0, threads=2)  # nothing timed: nothing to judge


def test_a_contended_profile_is_used_once_but_not_trusted(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"points": [[1, 0.084], [16, 0.144]], "contended": True}))
    assert read_profile(path) == [(1, 0.084), (16, 0.144)]  # this run: better than the prior
    assert read_profile(path, trusted_only=True) is None  # the next start profiles again
    assert CostModel.load(path).cost.beta == pytest.approx(0.004)


def test_a_contended_profile_is_read_as_its_lower_envelope(tmp_path):
    """Contention's spikes are not kept as deviations the refit never moves: the profile a
    budget server took beside three compiling ones (2026-12-06, one request's shapes) had a
    3-token step at 125 ms, a 4-token one at 29 ms."""
    spiky = [(1, 0.0405), (2, 0.0405), (3, 0.1253), (4, 0.1121), (4, 0.0287), (8, 0.0319),
             (16, 0.0403), (32, 0.0640)]
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"points": spiky, "contended": True}))
    cm = CostModel.load(path)
    assert cm.profile == [(1, 0.0287), (2, 0.0287), (3, 0.0287), (4, 0.0287), (8, 0.0319),
                          (16, 0.0403), (32, 0.0640)]
    prices = [cm.cost.seconds(t) for t in (1, 2, 3, 4, 8, 16, 32)]
    # No size dearer than a larger one, but for the noise a deviation is allowed to ignore.
    assert all(a <= b * (1 + DEV_MIN_SHARE) for a, b in zip(prices, prices[1:]))
    assert max(prices[:4]) < 0.030
    # Trusted, the same points keep the spike: it is taken for a kernel effect.
    path.write_text(json.dumps({"points": spiky}))
    assert CostModel.load(path).cost.seconds(3) > 0.1


class _FakeRunner:
    """The three runner attributes the start-up profile uses; each dummy step either
    computes (holds the CPU) or sleeps (waits for it, as a step on shared cores does)."""

    def __init__(self, busy: bool) -> None:
        import torch

        self.busy, self.device = busy, torch.device("cpu")
        self.scheduler_config = type("S", (), {"max_num_seqs": 2})()
        self.max_num_tokens, self.uniform_decode_query_len = 8, 1
        self.model = type("M", (), {"compute_logits": staticmethod(lambda h: h)})()
        self.shapes = []

    def _dummy_run(self, tokens, **kw):
        import time

        import torch

        self.shapes.append((tokens, self.uniform_decode_query_len))
        end = time.perf_counter() + 0.005
        while self.busy and time.perf_counter() < end:
            pass
        if not self.busy:
            time.sleep(0.005)
        return torch.zeros(tokens, 4), None


@pytest.mark.parametrize("busy", [True, False])
def test_the_profile_times_each_shape_and_flags_a_run_that_waited(busy, monkeypatch):
    import torch

    from dspark_vllm.patches import frame_stack
    from dspark_vllm.patches.cost_profile import (QUERY_LENS, REPEATS, SINGLE_QUERY_LENS,
                                                  profile)

    monkeypatch.setattr(frame_stack, "_applied", False)  # an earlier engine test may apply it

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the fake computes on one thread
    try:
        runner = _FakeRunner(busy)
        points, was_contended = profile(runner)
    finally:
        torch.set_num_threads(threads)
    assert was_contended is not busy
    # One request at every query length, then the grid: batches up to max_num_seqs,
    # tokens up to the cap.
    want = list(SINGLE_QUERY_LENS) + [2 * q for q in QUERY_LENS if 2 * q <= 8]
    assert [t for t, _ in points] == want
    assert len(runner.shapes) == len(want) * (REPEATS + 1)  # + one warm-up run per shape
    assert all(s >= 0.005 for _, s in points)
    assert runner.uniform_decode_query_len == 1  # restored


def test_with_the_frame_stack_fix_the_profile_settles_a_padding_then_times_at_it(monkeypatch):
    """The served forward runs at a padded frame depth (patches/frame_stack.py); the profile
    must time steps the same way, not at the thrashing depth its own call may sit at."""
    import sys

    from dspark_vllm.patches import frame_stack as fs
    from dspark_vllm.patches.cost_profile import PROFILE_SITE, REPEATS, _time_shapes

    monkeypatch.setattr(fs, "_applied", True)
    monkeypatch.setattr(fs, "_choosers", {})
    runner, depths = _FakeRunner(busy=False), []
    run = runner._dummy_run

    def dummy_run(tokens, **kw):
        n, f = 0, sys._getframe()
        while f:  # the call depth, in frames
            n, f = n + 1, f.f_back
        depths.append(n)
        return run(tokens, **kw)

    runner._dummy_run = dummy_run
    points = _time_shapes(runner)
    calibration = len(fs.PADS) * fs.TRIES
    assert runner.shapes[:calibration] == [(1, 1)] * calibration  # one-token warm-up
    chosen = fs._choosers[PROFILE_SITE].chosen
    assert chosen is not None
    timed = depths[calibration:]
    assert len(timed) == len(points) * (REPEATS + 1) and len(set(timed)) == 1
    assert timed[0] == depths[fs.PADS.index(chosen) * fs.TRIES]  # at the chosen padding
    assert runner.uniform_decode_query_len == 1  # restored


def test_eager_and_compiled_engines_keep_separate_profiles(monkeypatch):
    """A compiled step is not an eager one's (bfloat16, AMX Xeon: 23.6 against 29.8 ms at
    16 tokens): one engine's cached profile must not price the other's steps. The scheduler
    and the worker's profile patch both key by config_profile_key."""
    from types import SimpleNamespace

    from vllm.config import CompilationMode, CUDAGraphMode

    from dspark_vllm.cost_model import config_profile_key
    from dspark_vllm.patches import frame_stack

    monkeypatch.setattr(frame_stack, "_applied", False)  # an earlier engine test may apply it

    def config(mode, graphs, seqs=16, dtype="torch.bfloat16"):
        return SimpleNamespace(
            model_config=SimpleNamespace(model="/m/smollm2", dtype=dtype),
            compilation_config=SimpleNamespace(mode=mode, cudagraph_mode=graphs),
            scheduler_config=SimpleNamespace(max_num_seqs=seqs))

    eager = config(CompilationMode.NONE, CUDAGraphMode.NONE)
    compiled = config(CompilationMode.VLLM_COMPILE, CUDAGraphMode.NONE)
    keys = {config_profile_key(c) for c in (eager, compiled,
                                             config(CompilationMode.VLLM_COMPILE,
                                                    CUDAGraphMode.PIECEWISE),
                                             config(CompilationMode.NONE, CUDAGraphMode.NONE, 8),
                                             config(CompilationMode.NONE, CUDAGraphMode.NONE,
                                                    dtype="torch.float32"))}
    assert len(keys) == 5
    monkeypatch.setattr(frame_stack, "_applied", True)  # a padded forward costs differently
    assert config_profile_key(eager) not in keys
    monkeypatch.setattr(frame_stack, "_applied", False)
    assert config_profile_key(eager) == config_profile_key(
        config(CompilationMode.NONE, CUDAGraphMode.NONE))
