"""Sequential Temperature Scaling on synthetic scores with a known miscalibration."""

import numpy as np

from dspark_vllm.train.calibrate import auc, ece, fit_sts, report, survival


def _synthetic(n=20000, g=4, true_t=(2.0, 0.5, 3.0, 1.0), seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(1.0, 2.0, size=(n, g))
    p = 1 / (1 + np.exp(-z / np.asarray(true_t)))  # the real conditional acceptance
    hit = rng.random((n, g)) < p
    return z, np.cumprod(hit, axis=1).astype(bool)


def test_sts_recovers_per_position_temperatures():
    z, acc = _synthetic()
    temps = fit_sts(z, acc)
    assert np.allclose(temps, [2.0, 0.5, 3.0, 1.0], rtol=0.25)
    rep = report(z, acc, temps)
    assert rep["ece_survival_after"] < 0.02 < rep["ece_survival_before"]


def test_ece_and_auc_basics():

    assert abs(ece(np.full(5, 0.8), np.ones(5)) - 0.2) < 1e-12
    assert auc(np.array([0.1, 0.2, 0.8, 0.9]), np.array([0, 0, 1, 1])) == 1.0
    assert auc(np.array([0.5, 0.5]), np.array([0, 1])) == 0.5


def test_survival_is_a_cumulative_product():
    z = np.array([[0.0, 0.0, 100.0]])
    assert np.allclose(survival(z, np.ones(3)), [[0.5, 0.25, 0.25]])


def test_report_writes_undefined_aucs_as_json_null():
    import json

    z = np.array([[2.0, 1.0], [1.0, -1.0], [0.5, 0.2]])
    acc = np.array([[True, False], [True, False], [True, False]])  # one outcome per position
    rep = report(z, acc, np.ones(2))
    assert rep["auc_per_position"] == [None, None] and rep["auc_mean"] is None
    json.loads(json.dumps(rep), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
