"""The step-cost model: least-squares fit, online refits that follow drift, profile cache."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dspark_vllm.budget import StepCost
from dspark_vllm.cost_model import (MIN_SPAN_TOKENS, REFIT_EVERY, CostModel, fit,
                                    read_profile)


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
