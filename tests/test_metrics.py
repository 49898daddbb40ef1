"""The metrics' rolling calibration error against its slow reference."""

import random

import pytest

from dspark_vllm.metrics import ECE_BINS, DSparkStats, RollingECE


def _ece(pairs) -> float | None:
    """The slow reference: bin every pair again, sum |confidences - hits| over the bins."""
    if not pairs:
        return None
    bins = [[0.0, 0.0, 0] for _ in range(ECE_BINS)]
    for c, hit in pairs:
        b = bins[min(int(c * ECE_BINS), ECE_BINS - 1)]
        b[0], b[1], b[2] = b[0] + c, b[1] + hit, b[2] + 1
    return sum(abs(s - h) for s, h, n in bins if n) / len(pairs)


@pytest.mark.parametrize("window", [1, 7, 50])
def test_rolling_ece_matches_the_reference_over_the_last_window(window):
    rng = random.Random(window)
    ece, seen = RollingECE(window), []
    assert ece.value() is None
    for i in range(20 * window + 3):
        # bin edges (0, 1/ECE_BINS, 1.0) as well as random confidences
        c = rng.choice([0.0, 1.0 / ECE_BINS, 1.0, rng.random()])
        hit = float(rng.random() < c)
        ece.append(c, hit)
        seen.append((c, hit))
        assert len(ece) == min(i + 1, window)
        assert ece.value() == pytest.approx(_ece(seen[-window:]), abs=1e-12)


def test_stats_report_the_calibration_error_of_the_conditional_confidences():
    stats = DSparkStats(3)
    # survivals 0.8, 0.4 (conditional 0.8, 0.5), first draft accepted, second rejected:
    # slot 0 is (0.8, hit), slot 1 (0.5, miss), slot 2 never reached
    stats.record_outcome([0.8, 0.4], accepted=1)
    assert stats.snapshot()["calibration_error"] == pytest.approx([0.2, 0.5, None])
