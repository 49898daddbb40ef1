"""The embedded target: converted once from the GGUF package, greedy-identical to it."""

import json

import pytest

from dspark_vllm.target import MARKER, greedy_continuation, prepare_target


@pytest.mark.slow
def test_conversion_is_greedy_identical_and_idempotent(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = prepare_target(tmp_path / "t")
    info = json.loads((out / MARKER).read_text())
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    # The marker records the GGUF model's own continuation, checked at conversion time.
    assert greedy_continuation(model, tok) == info["check_tokens"]
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert (out / "model.safetensors").is_file() and not list(out.glob("*.bin"))
    mtime = (out / "model.safetensors").stat().st_mtime
    assert prepare_target(out) == out  # idempotent: nothing is redone
    assert (out / "model.safetensors").stat().st_mtime == mtime
