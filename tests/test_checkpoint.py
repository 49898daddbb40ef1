"""Checkpoint I/O in the upstream Qwen3DSparkModel format, and every mismatch error."""

import json

import pytest
import torch
from safetensors.torch import save_file

from dspark_vllm.drafter.checkpoint import load_drafter, save_drafter
from dspark_vllm.drafter.config import DrafterConfigError, DSparkDrafterConfig
from dspark_vllm.drafter.drafting import propose
from tests.conftest import TINY, make_drafter


def _load(path, target, **kw):
    return load_drafter(path, target.get_input_embeddings().weight,
                        target.get_output_embeddings().weight,
                        target_num_layers=target.config.num_hidden_layers, **kw)


@pytest.mark.parametrize("draft_vocab", [None, 40])
def test_round_trip_is_exact(tmp_path, tiny_target, draft_vocab):
    d = make_drafter(tiny_target, draft_vocab=draft_vocab)
    save_drafter(d, tmp_path, dtype=torch.float32)
    back = _load(tmp_path, tiny_target)
    ctx = torch.randn(1, 9, d.cfg.context_feature_size)
    a, b = propose(d, ctx, torch.tensor([4])), propose(back, ctx, torch.tensor([4]))
    assert a.tokens.tolist() == b.tokens.tolist()
    assert torch.allclose(a.confidence, b.confidence)


def test_shared_weights_are_not_stored(tmp_path, tiny_target):
    from safetensors import safe_open

    save_drafter(make_drafter(tiny_target), tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert not any(n.startswith(("embed_tokens", "lm_head")) for n in names)
    assert {"fc.weight", "hidden_norm.weight", "markov_head.markov_w1.weight",
            "confidence_head.proj.weight", "layers.1.self_attn.q_norm.weight"} <= names
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["model_type"] == "qwen3"


def test_upstream_vllm_parser_accepts_our_checkpoint(tmp_path, tiny_target):
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    tiny_target.save_pretrained(tmp_path / "target")
    d = make_drafter(tiny_target, block=5)
    save_drafter(d, tmp_path / "drafter")
    mc = ModelConfig(model=str(tmp_path / "target"), skip_tokenizer_init=True, dtype="float32")
    sc = SpeculativeConfig(method="dspark", model=str(tmp_path / "drafter"),
                           target_model_config=mc, target_parallel_config=ParallelConfig())
    assert sc.draft_model_config.architectures == ["Qwen3DSparkModel"]
    assert sc.num_speculative_tokens == 5  # resolved from block_size
    assert list(sc.draft_model_config.hf_config.target_layer_ids) == d.cfg.target_layer_ids


def _other_target(**changes):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**{**TINY, **changes}, tie_word_embeddings=True))


@pytest.mark.parametrize("changes,needle", [
    (dict(hidden_size=32, intermediate_size=64, head_dim=8), "hidden_size=64 but the target"),
    (dict(vocab_size=80), "vocab_size=96 but the target has vocab_size=80"),
    (dict(num_hidden_layers=3), "target_layer_ids [2, 3] out of range: the target has 3"),
])
def test_mismatched_target_is_named(tmp_path, tiny_target, changes, needle):
    save_drafter(make_drafter(tiny_target), tmp_path)
    with pytest.raises(DrafterConfigError) as e:
        _load(tmp_path, _other_target(**changes))
    assert needle in str(e.value)


def test_missing_directory_and_files(tmp_path, tiny_target):
    with pytest.raises(DrafterConfigError, match="does not exist"):
        _load(tmp_path / "nope", tiny_target)
    save_drafter(make_drafter(tiny_target), tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "pytorch_model.bin")
    with pytest.raises(DrafterConfigError, match="pickled weights are never loaded"):
        _load(tmp_path, tiny_target)


def test_corrupt_and_incomplete_weights(tmp_path, tiny_target):
    d = make_drafter(tiny_target)
    save_drafter(d, tmp_path)
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DrafterConfigError, match="not a readable safetensors file"):
        _load(tmp_path, tiny_target)
    state = {k: v.contiguous() for k, v in d.state_dict().items() if k != "fc.weight"}
    state["norm.weight"] = torch.ones(3)
    save_file(state, str(path))
    with pytest.raises(DrafterConfigError) as e:
        _load(tmp_path, tiny_target)
    assert "missing fc.weight" in str(e.value) and "norm.weight is [3], expected [64]" in str(e.value)


@pytest.mark.parametrize("edit,needle", [
    (dict(architectures=["LlamaForCausalLM"]), "needs ['Qwen3DSparkModel']"),
    (dict(markov_rank=-1), "markov_rank=-1"),
    (dict(target_layer_ids=[3, 1]), "strictly increasing"),
    (dict(mask_token_id=500), "mask_token_id=500"),
])
def test_malformed_config_is_named(tmp_path, tiny_target, edit, needle):
    save_drafter(make_drafter(tiny_target), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(DrafterConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        DSparkDrafterConfig.load(tmp_path)
