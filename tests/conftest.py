"""Shared fixtures: tiny random models so unit tests run in seconds on a CPU."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~20 s (still runs in CI)")
    config.addinivalue_line("markers", "engine: starts real vLLM engines / servers")
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped elsewhere)")


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA device")
    if not torch.cuda.is_available():
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip_cuda)


TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16)


@pytest.fixture(scope="session")
def tiny_target():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**TINY, max_position_embeddings=512, rms_norm_eps=1e-5,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    return LlamaForCausalLM(cfg).eval()


def make_drafter(target, *, markov_rank=8, draft_vocab=None, layers=2, block=4, conf=True,
                 seed=0):
    from dspark_vllm.drafter.config import drafter_config_for_target
    from dspark_vllm.drafter.model import DSparkDrafter

    torch.manual_seed(seed)
    cfg = drafter_config_for_target(target.config, num_layers=layers, block_size=block,
                                    markov_rank=markov_rank, draft_vocab_size=draft_vocab,
                                    mask_token_id=3, num_target_features=3,
                                    enable_confidence_head=conf)
    d2t = None
    if draft_vocab:
        ids = torch.randperm(cfg.vocab_size)[:draft_vocab].sort().values
        d2t = ids - torch.arange(draft_vocab)
    drafter = DSparkDrafter(cfg, target.get_input_embeddings().weight,
                            target.get_output_embeddings().weight, d2t=d2t)
    if drafter.markov_head is not None:  # non-zero W2 so the transition head matters
        torch.nn.init.normal_(drafter.markov_head.markov_w2.weight, std=0.5)
    return drafter.eval()


@pytest.fixture
def tiny_drafter(tiny_target):
    return make_drafter(tiny_target)
