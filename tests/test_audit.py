"""The causality audit reproduces the paper's Appendix A with the shipped policy code."""

from dspark_vllm.audit import audit, peeking_policy, shipped_policy


def test_shipped_policy_keeps_the_target_and_peeking_skews_it():
    r = audit(n=40_000, seed=1)
    lo, hi = r["shipped"]["ci95_p0"]
    assert lo - 0.005 <= 0.70 <= hi + 0.005
    lo, hi = r["peeking"]["ci95_p0"]
    assert lo - 0.005 <= 0.85 <= hi + 0.005 and lo > 0.8


def test_policies_on_the_two_cases():
    # whether x_1 is verified never depends on x_1 (c_2 reads it); x_2 follows its own a_2
    assert shipped_policy([0.8, 0.8]) == 2 and shipped_policy([0.8, 0.0]) == 1
    assert peeking_policy([0.8, 0.8]) == 2 and peeking_policy([0.8, 0.0]) == 0
