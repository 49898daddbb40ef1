"""The engine's sequential stage (sequential.sample_block on the kernel dispatcher) against
the reference drafter: same greedy tokens, same confidences, exact draft probabilities."""

import pytest
import torch
from torch import nn

from dspark_vllm.block_graph import BlockGraphs, bucket
from dspark_vllm.drafter.drafting import sample_sequential
from dspark_vllm.sequential import sample_block
from tests.conftest import make_drafter


class _Head(nn.Module):
    """vLLM's DSparkConfidenceHead call signature over the reference head."""

    def __init__(self, head, with_markov):
        super().__init__()
        self.proj, self.with_markov = head.proj, with_markov

    def forward(self, h, markov_embed):
        return self.proj(torch.cat([h, markov_embed], -1).float()).squeeze(-1)


class _VllmLike(nn.Module):
    """The attribute surface of vLLM's Qwen3DSparkForCausalLM that sample_block reads."""

    def __init__(self, drafter):
        super().__init__()
        self.d = drafter
        self.draft_id_to_target_id = drafter.d2t
        self.model = nn.Module()
        self.model.markov_head = drafter.markov_head
        self.model.confidence_head = _Head(drafter.confidence_head,
                                           drafter.cfg.confidence_head_with_markov)

    def compute_draft_logits(self, h):
        return self.d.base_logits(h)

    def map_draft_to_target(self, ids):
        return self.d.draft_to_target(ids)


def test_packed_weights_fall_back_to_the_module(tiny_target):
    d = make_drafter(tiny_target, block=3)
    m = _VllmLike(d)
    h, anchor = torch.randn(2, 3, 64), torch.tensor([4, 9])
    want = sample_block(m, h, anchor, None, torch.ones(3), False, 96).confidence
    real = m.model.confidence_head.proj.weight.data.clone()
    m.model.confidence_head.proj.forward = lambda x: x @ real.t() + m.model.confidence_head.proj.bias
    m.model.confidence_head.proj.weight.data = torch.empty(0)  # as vLLM's CPU GEMM repacking
    got = sample_block(m, h, anchor, None, torch.ones(3), False, 96).confidence
    assert torch.allclose(got, want, atol=1e-6)


def test_greedy_tokens_and_confidences_match_the_reference(tiny_target):
    for vocab in (None, 40):
        d = make_drafter(tiny_target, draft_vocab=vocab, block=5)
        d.cfg.dspark_confidence_temperatures = [1.0, 2.0, 0.5, 1.5, 3.0]
        h = torch.randn(3, 5, 64)
        anchor = torch.tensor([4, 9, 50])
        ref = sample_sequential(d, h, anchor)
        got = sample_block(_VllmLike(d), h, anchor, None, torch.tensor(d.cfg.dspark_confidence_temperatures),
                           want_probs=False, target_vocab_size=96)
        assert got.tokens.tolist() == ref.tokens.tolist()
        assert torch.allclose(got.confidence, ref.confidence, atol=1e-5)


def test_probabilistic_drafts_carry_their_exact_distribution(tiny_target):
    d = make_drafter(tiny_target, draft_vocab=40, block=4)
    h, anchor = torch.randn(2, 4, 64), torch.tensor([4, 9])
    t = torch.tensor([0.7, 1.3])
    got = sample_block(_VllmLike(d), h, anchor, t, torch.ones(4), want_probs=True,
                       target_vocab_size=96)
    prev = torch.cat([anchor[:, None], got.tokens[:, :-1]], 1)
    logits = d.base_logits(h) + d.markov_bias(prev)
    want = d.to_target_probs(torch.softmax(logits / t[:, None, None], -1))
    assert torch.allclose(got.probs, want, atol=1e-5)
    assert (got.probs.gather(-1, got.tokens[..., None]) > 0).all()  # drawn from q


def test_bucket_is_the_smallest_that_holds_the_batch():
    assert [bucket(b) for b in (1, 2, 3, 5, 33, 128)] == [1, 2, 4, 8, 64, 128]
    assert bucket(129) is None and bucket(3, (2, 6)) == 6


def test_block_graphs_leave_cpu_blocks_eager(tiny_target):
    d = make_drafter(tiny_target, draft_vocab=40, block=4)
    h, anchor, temps = torch.randn(2, 4, 64), torch.tensor([4, 9]), torch.ones(4)
    graphs = BlockGraphs()
    want = sample_block(_VllmLike(d), h, anchor, None, temps, False, 96)
    got = sample_block(_VllmLike(d), h, anchor, None, temps, False, 96, graphs=graphs)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.confidence, want.confidence)
    assert graphs.replays == 0  # nothing to capture on a CPU


@pytest.mark.cuda
def test_block_graphs_replay_the_eager_walk_on_cuda(tiny_target):
    """Replayed blocks equal eager ones: greedy and sampled, padded batches (3 -> 4, 5 -> 8),
    fresh inputs into the same graph, and a batch above the buckets falls back to eager."""
    dev = torch.device("cuda")
    d = make_drafter(tiny_target, draft_vocab=40, block=5).to(dev)
    m, temps = _VllmLike(d), torch.tensor([1.0, 2.0, 0.5, 1.5, 3.0], device=dev)
    graphs = BlockGraphs(buckets=(1, 4, 8))
    calls = 0
    for b in (3, 3, 5, 1, 9):
        for temperature, want_probs in ((None, False), (torch.rand(b, device=dev) + 0.3, True)):
            h = torch.randn(b, 5, 64, device=dev)
            anchor = torch.randint(0, 96, (b,), device=dev)
            pos = torch.randint(0, 1000, (b, 5), device=dev)
            out = []
            for g in (None, graphs):
                torch.manual_seed(7)  # the same per-request seeds for both walks
                out.append(sample_block(m, h, anchor, temperature, temps, want_probs, 96,
                                        positions=pos, graphs=g))
            calls += b <= 8
            want, got = out
            assert torch.equal(got.tokens, want.tokens), (b, want_probs)
            assert torch.allclose(got.confidence, want.confidence, atol=1e-6)
            if want_probs:
                assert torch.allclose(got.probs, want.probs, atol=1e-6)
    assert graphs.replays == calls
