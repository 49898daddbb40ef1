"""The whole recipe in --quick mode: vLLM data generation, feature cache, training,
calibration and export, on the real embedded target."""

import json

import pytest

from dspark_vllm.drafter.config import DSparkDrafterConfig


@pytest.mark.slow
@pytest.mark.engine
def test_quick_recipe_end_to_end(tmp_path):
    from dspark_vllm.train.recipe import RecipeConfig, run_recipe

    out = run_recipe(RecipeConfig(out=str(tmp_path), quick=True))
    drafter = out["runs"]["dspark-2l"]["drafter"]
    cfg = DSparkDrafterConfig.load(drafter)
    assert cfg.block_size == 7 and cfg.markov_rank > 0 and cfg.enable_confidence_head
    assert cfg.dspark_confidence_temperatures and len(cfg.dspark_confidence_temperatures) == 7
    rep = json.loads((tmp_path / "recipe.json").read_text())
    assert rep["timings"]["total_s"] > 0
    assert out["runs"]["dspark-2l"]["calibration"]["blocks"] > 0
