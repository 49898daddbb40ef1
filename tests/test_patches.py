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


def _sampling_metadata(temps, generators=None, logprobs=None):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    b = len(temps)
    greedy = all(t == 0 for t in temps)
    return SamplingMetadata(
        temperature=None if greedy else torch.tensor(temps, dtype=torch.float32),
        all_greedy=greedy, all_random=all(t > 0 for t in temps), top_p=None, top_k=None,
        generators=generators or {}, max_num_logprobs=logprobs, no_penalties=True,
        prompt_token_ids=None, frequency_penalties=torch.zeros(b),
        presence_penalties=torch.zeros(b), repetition_penalties=torch.ones(b),
        output_token_ids=[[] for _ in range(b)], allowed_token_ids_mask=None,
        bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def test_a_step_without_drafts_samples_what_the_rejection_sampler_does():
    """patches/zero_draft_sampling.py: with no drafts in the step, the shortcut returns the
    rejection sampler's exact output (greedy, and seeded at temperature > 0, with the same
    generator draws), and steps with drafts or logprobs are left to vLLM."""
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    from dspark_vllm.patches import zero_draft_sampling

    current_platform.register_triton_kernel_overrides()  # the engine's CPU kernels (no Triton)

    zero_draft_sampling.apply()
    zero_draft_sampling.apply()  # idempotent
    rs = RejectionSampler(Sampler(), None, torch.device("cpu"))
    reference = RejectionSampler.forward.__wrapped__  # vLLM's forward
    none = SpecDecodeMetadata.make_dummy([[], [], []], torch.device("cpu"))
    none.bonus_logits_indices = torch.arange(3, dtype=torch.int32)
    logits = torch.randn(3, 50)

    greedy = _sampling_metadata([0.0, 0.0, 0.0])
    got = rs(none, None, logits.clone(), greedy)
    want = reference(rs, none, None, logits.clone(), greedy)
    assert got.sampled_token_ids.dtype == want.sampled_token_ids.dtype == torch.int32
    assert torch.equal(got.sampled_token_ids, want.sampled_token_ids)
    assert got.sampled_token_ids[:, 0].tolist() == logits.argmax(-1).tolist()

    def seeded():
        return {i: torch.Generator().manual_seed(7 + i) for i in range(3)}

    g1, g2 = seeded(), seeded()
    for _ in range(5):
        got = rs(none, None, logits.clone(), _sampling_metadata([1.0, 0.7, 1.3], g1))
        want = reference(rs, none, None, logits.clone(), _sampling_metadata([1.0, 0.7, 1.3], g2))
        assert torch.equal(got.sampled_token_ids, want.sampled_token_ids)
    assert all(torch.equal(g1[i].get_state(), g2[i].get_state()) for i in range(3))

    drafted = SpecDecodeMetadata.make_dummy([[1], [], []], torch.device("cpu"))
    assert zero_draft_sampling.bonus_only(rs.sampler, drafted, logits, greedy) is None
    with_logprobs = _sampling_metadata([0.0, 0.0, 0.0], logprobs=2)
    assert zero_draft_sampling.bonus_only(rs.sampler, none, logits, with_logprobs) is None
