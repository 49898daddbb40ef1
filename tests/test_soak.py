"""Short soak: concurrent streaming clients with random lengths, temperatures and
disconnects; nothing fails, nothing is left behind, memory stays flat."""

import pytest

from benchmarks.soak import soak
from dspark_vllm.target import prepare_target
from tests.engine_utils import drafter_for_tests


@pytest.mark.engine
@pytest.mark.slow
def test_short_soak(tmp_path):
    r = soak(str(prepare_target()), str(drafter_for_tests(tmp_path)), clients=8, seconds=45,
             log_path=tmp_path / "soak.log")
    assert r["num_errors"] == 0, r["errors"]
    assert r["completed"] > 0 and r["cancelled"] > 0
    assert not any(r["after_idle"].values()), r["after_idle"]
    assert r["rss_growth"] < 0.10, r
