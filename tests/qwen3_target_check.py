"""Run as `python -m tests.qwen3_target_check DIR` (vLLM's engine spawns processes, so this
needs a __main__): a tiny random Qwen3 target (SmolLM2's tokenizer) served with a random
DSpark drafter and without speculation; prints IDENTICAL and the drafts proposed."""

import os
import shutil
import sys
from pathlib import Path

import torch


def main(root: Path) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from transformers import AutoConfig, AutoModelForCausalLM
    from vllm import LLM, SamplingParams

    from dspark_vllm.drafter.checkpoint import save_drafter
    from dspark_vllm.drafter.config import drafter_config_for_target
    from dspark_vllm.drafter.model import DSparkDrafter
    from dspark_vllm.target import resolve_target

    cfg = AutoConfig.for_model("qwen3", vocab_size=49152, hidden_size=128, intermediate_size=256,
                               num_hidden_layers=8, num_attention_heads=2, num_key_value_heads=1,
                               head_dim=64, tie_word_embeddings=True, max_position_embeddings=1024,
                               bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_config(cfg).eval()
    target.save_pretrained(root / "target")
    for f in Path(resolve_target("default")).glob("*token*"):
        shutil.copy(f, root / "target" / f.name)
    dcfg = drafter_config_for_target(target.config, num_layers=1, block_size=4, markov_rank=8,
                                     mask_token_id=16)
    drafter = DSparkDrafter(dcfg, target.get_input_embeddings().weight,
                            target.get_output_embeddings().weight)
    torch.nn.init.normal_(drafter.markov_head.markov_w2.weight, std=0.02)
    save_drafter(drafter, root / "drafter")

    prompts = [{"prompt_token_ids": [1, 5 + i, 77, 300 + 7 * i, 12]} for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs, drafts = {}, 0
    for name, spec in (("plain", None), ("dspark", {"method": "dspark", "model": str(root / "drafter"),
                                                    "num_speculative_tokens": 3})):
        llm = LLM(model=str(root / "target"), dtype="float32", max_model_len=256,
                  enforce_eager=True, speculative_config=spec, seed=0, disable_log_stats=False)
        outs[name] = [list(o.outputs[0].token_ids)
                      for o in llm.generate(prompts, params, use_tqdm=False)]
        if spec:
            drafts = sum(m.value for m in llm.get_metrics()
                         if m.name == "vllm:spec_decode_num_draft_tokens")
        llm.llm_engine.engine_core.shutdown()
        del llm
    print("IDENTICAL" if outs["plain"] == outs["dspark"] else f"DIFFER {outs}")
    print(f"drafts {drafts}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
