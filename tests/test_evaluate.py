"""The offline evaluator decodes exactly: greedy speculative output == target's greedy."""

import dataclasses

import pytest
import torch

from dspark_vllm.evaluate import DSparkAdapter, EagleAdapter, SpecDecoder
from dspark_vllm.train.eagle import EagleHead
from tests.conftest import make_drafter


def _greedy(target, prompt, n):
    out = target.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                          pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("kind", ["dspark", "mtp1"])
def test_greedy_speculative_decoding_equals_target_greedy(tiny_target, kind):
    if kind == "dspark":
        adapter = DSparkAdapter(make_drafter(tiny_target, block=4))
        block = 4
    else:
        torch.manual_seed(0)
        adapter = EagleAdapter(EagleHead(tiny_target.config, tiny_target.get_input_embeddings().weight).eval(),
                               tiny_target.get_output_embeddings().weight)
        block = 1
    dec = SpecDecoder(tiny_target, adapter, eos_ids=set(), temperature=0.0, block=block,
                      generator=torch.Generator().manual_seed(0))
    prompt = [5, 17, 33, 8, 60, 21]
    r = dec.generate(prompt, 40)
    assert r["tokens"] == _greedy(tiny_target, prompt, 40)
    assert r["rounds"] >= 1 and sum(r["accepted_at"]) <= sum(r["reached_at"])


def test_a_copy_of_the_target_is_always_accepted(tiny_target):
    """A drafter that predicts the target's own greedy tokens gets tau = block + 1."""

    class Oracle:
        block = 3
        proposable = None  # drafts over the whole vocabulary

        def features(self, hidden_states):
            return hidden_states[-1]

        def propose(self, feats, tokens, anchor, t, gen, num_slots):
            ids = list(tokens)
            drafts = []
            for _ in range(num_slots):
                nxt = int(tiny_target(torch.tensor([ids])).logits[0, -1].argmax())
                drafts.append(nxt)
                ids.append(nxt)
            d = torch.tensor([drafts])
            return d, torch.nn.functional.one_hot(d, 96).float()

    dec = SpecDecoder(tiny_target, Oracle(), set(), 0.0, 3, torch.Generator().manual_seed(0))
    r = dec.generate([5, 17, 33], 33)
    assert r["accepted_at"] == r["reached_at"] and r["reached_at"][0] == r["rounds"]
    assert len(r["tokens"]) == 33


def _with_vocab(drafter, target, ids):
    from dspark_vllm.drafter.model import DSparkDrafter

    cfg = dataclasses.replace(drafter.cfg, draft_vocab_size=len(ids))
    d2t = torch.tensor(sorted(ids)) - torch.arange(len(ids))
    return DSparkDrafter(cfg, target.get_input_embeddings().weight,
                         target.get_output_embeddings().weight, d2t=d2t).eval()


def test_tokens_outside_a_reduced_draft_vocabulary_are_counted(tiny_target):
    """Each emitted token the drafter could never propose is counted, and only those; a
    drafter over the whole vocabulary has none."""
    full = make_drafter(tiny_target, block=4)
    half = _with_vocab(full, tiny_target, range(0, 96, 2))  # the even ids
    prompt = [5, 17, 33, 8, 60, 21]
    for drafter in (half, full):
        dec = SpecDecoder(tiny_target, DSparkAdapter(drafter), set(), 1.0, 4,
                          torch.Generator().manual_seed(0))
        r = dec.generate(prompt, 60)
        odd = sum(t % 2 for t in r["tokens"])
        assert r["outside_vocab"] == (odd if drafter is half else 0)
        if drafter is half:
            assert 0 < odd < len(r["tokens"])  # sampled at T = 1: both kinds occur
