"""Reference drafter: shapes, layout, attention structure and the transition head."""

import torch

from dspark_vllm.drafter.drafting import propose, sample_sequential
from dspark_vllm.drafter.model import block_inputs, block_mask
from tests.conftest import make_drafter


def _ctx(drafter, t=10, b=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, drafter.cfg.context_feature_size, generator=g)


def test_block_layout_anchor_is_first_prediction():
    ids, pos = block_inputs(torch.tensor([[7, 9]]), torch.tensor([[5, 20]]), 4, mask_token_id=3)
    assert ids.tolist() == [[7, 3, 3, 3, 9, 3, 3, 3]]
    assert pos.tolist() == [[5, 6, 7, 8, 20, 21, 22, 23]]


def test_block_mask_context_before_anchor_and_bidirectional_block():
    m = block_mask(torch.tensor([[3, 6]]), ctx_len=8, block_size=2)[0]
    assert m.shape == (4, 8 + 4)
    assert m[0, :8].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]  # context strictly before anchor 3
    assert m[2, :8].tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert m[0, 8:].tolist() == [1, 1, 0, 0] and m[1, 8:].tolist() == [1, 1, 0, 0]
    assert m[3, 8:].tolist() == [0, 0, 1, 1]


def test_gamma_slots_give_gamma_drafts(tiny_drafter):
    d = propose(tiny_drafter, _ctx(tiny_drafter, b=2), torch.tensor([5, 6]))
    g = tiny_drafter.cfg.block_size
    assert d.tokens.shape == (2, g) and d.probs.shape == (2, g, 96)
    assert d.confidence.shape == (2, g) and ((d.confidence > 0) & (d.confidence < 1)).all()
    assert torch.allclose(d.probs.sum(-1), torch.ones(2, g))


def test_context_after_anchor_and_nothing_else_is_ignored(tiny_drafter):
    ctx = _ctx(tiny_drafter, t=12)
    anchor_pos = torch.tensor([[8]])
    ids, pos = block_inputs(torch.tensor([[5]]), anchor_pos, 4, 3)
    mask = block_mask(anchor_pos, 12, 4)
    ctx_pos = torch.arange(12)[None]
    h = tiny_drafter(ids, pos, ctx, ctx_pos, mask)
    changed = ctx.clone()
    changed[:, 8:] += 5.0  # positions >= anchor: the drafter must not see them
    assert torch.allclose(h, tiny_drafter(ids, pos, changed, ctx_pos, mask), atol=1e-6)
    changed[:, 2] += 5.0  # a verified position: must matter
    assert not torch.allclose(h, tiny_drafter(ids, pos, changed, ctx_pos, mask), atol=1e-3)


def test_block_attention_is_bidirectional(tiny_drafter):
    ctx = _ctx(tiny_drafter)
    anchor_pos = torch.tensor([[10]])
    ids, pos = block_inputs(torch.tensor([[5]]), anchor_pos, 4, 3)
    mask, ctx_pos = block_mask(anchor_pos, 10, 4), torch.arange(10)[None]
    h = tiny_drafter(ids, pos, ctx, ctx_pos, mask)
    ids2 = ids.clone()
    ids2[0, 3] = 11  # the last slot: earlier slots see it too
    h2 = tiny_drafter(ids2, pos, ctx, ctx_pos, mask)
    assert not torch.allclose(h[0, 0], h2[0, 0], atol=1e-4)


def test_transition_head_is_exactly_a_low_rank_bias(tiny_drafter):
    mh = tiny_drafter.markov_head
    prev = torch.arange(96)
    bias = mh.bias(prev)  # [V, V_draft]: row x is B(x, .)
    assert torch.allclose(bias, mh.markov_w1.weight @ mh.markov_w2.weight.T, atol=1e-5)
    assert torch.linalg.matrix_rank(bias).item() <= tiny_drafter.cfg.markov_rank
    # The sequential stage adds exactly B(x_{k-1}, .) to the parallel logits.
    h = torch.randn(1, 4, 64)
    d = sample_sequential(tiny_drafter, h, torch.tensor([7]))
    base = tiny_drafter.base_logits(h)
    prev = torch.cat([torch.tensor([7]), d.tokens[0, :-1]])
    want = (base[0] + mh.bias(prev)).argmax(-1)
    assert d.tokens[0].tolist() == want.tolist()


def test_rank_zero_is_the_purely_parallel_drafter(tiny_target):
    seq = make_drafter(tiny_target, markov_rank=8, conf=False, seed=3)
    par = make_drafter(tiny_target, markov_rank=0, conf=False, seed=3)
    state = {k: v for k, v in seq.state_dict().items() if not k.startswith("markov_head")}
    par.load_state_dict(state)
    assert par.markov_head is None
    ctx = _ctx(par)
    d = propose(par, ctx, torch.tensor([5]))
    h = par(*_block_args(par, ctx))
    assert d.tokens[0].tolist() == par.base_logits(h)[0].argmax(-1).tolist()
    seq.markov_head.markov_w2.weight.data.zero_()  # a zero transition head == parallel
    assert propose(seq, ctx, torch.tensor([5])).tokens.tolist() == d.tokens.tolist()


def _block_args(drafter, ctx):
    t = ctx.shape[1]
    anchor_pos = torch.tensor([[t]])
    ids, pos = block_inputs(torch.tensor([[5]]), anchor_pos, drafter.cfg.block_size, 3)
    return ids, pos, ctx, torch.arange(t)[None], block_mask(anchor_pos, t, drafter.cfg.block_size)


def test_reduced_vocabulary_maps_to_target_ids(tiny_target):
    d = make_drafter(tiny_target, draft_vocab=32)
    out = propose(d, _ctx(d), torch.tensor([5]), temperature=1.0,
                  generator=torch.Generator().manual_seed(0))
    allowed = set((torch.arange(32) + d.d2t).tolist())
    assert set(out.tokens.flatten().tolist()) <= allowed
    q = d.to_target_probs(out.probs)
    assert q.shape[-1] == 96 and torch.allclose(q.sum(-1), torch.ones(1, 4))
    assert (q[..., [i for i in range(96) if i not in allowed]] == 0).all()


def test_sampling_follows_the_corrected_distribution(tiny_drafter):
    h = torch.randn(1, 4, 64)
    g = torch.Generator().manual_seed(0)
    first = [int(sample_sequential(tiny_drafter, h, torch.tensor([7]), 1.0, g).tokens[0, 0])
             for _ in range(3000)]
    logits = tiny_drafter.base_logits(h)[0, 0] + tiny_drafter.markov_bias(torch.tensor(7))
    p = torch.softmax(logits, -1)
    freq = torch.bincount(torch.tensor(first), minlength=96).float() / 3000
    assert (freq - p).abs().max() < 0.05
