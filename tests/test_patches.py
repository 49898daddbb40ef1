"""The CPU rejection-sampler fix: expanding per-request sampling parameters to tokens."""

import torch


def test_expand_batch_to_tokens_keeps_float_values_and_replaces():
    from dspark_vllm.patches.cpu_expand_batch import expand_batch_to_tokens

    x = torch.tensor([0.5, 0.0, 2.0])  # temperatures; 0 = greedy -> 1
    got = expand_batch_to_tokens(x, torch.tensor([2, 5, 6], dtype=torch.int32), 6,
                                 replace_from=0, replace_to=1)
    assert got.dtype == torch.float32
    assert got.tolist() == [0.5, 0.5, 1.0, 1.0, 1.0, 2.0]
    k = expand_batch_to_tokens(torch.tensor([5, 0], dtype=torch.int32), torch.tensor([0, 3]), 3)
    assert k.dtype == torch.int32 and k.tolist() == [0, 0, 0]  # a request with no drafts


def test_registered_sampler_scales_target_logits_by_the_real_temperature():
    from vllm.v1.sample import rejection_sampler as rs

    from dspark_vllm.plugin import register

    register()
    register()  # idempotent
    logits = torch.randn(5, 7)
    temps = torch.tensor([0.5, 2.0])
    md = type("MD", (), dict(all_greedy=False, temperature=temps, top_k=None, top_p=None))()
    out = rs.apply_sampling_constraints(logits.clone(), torch.tensor([3, 5]), md)
    want = logits / torch.tensor([0.5, 0.5, 0.5, 2.0, 2.0])[:, None]
    torch.testing.assert_close(out, want)
