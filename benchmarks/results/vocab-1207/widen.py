"""Widen the bundled drafter's output vocabulary to the target's full vocabulary (no training):
lm_head becomes the target's own (shared, not stored); the transition head's W2 gains zero rows
for the tokens it never had (no transition bias for them)."""
import dataclasses, shutil, sys, torch
from dspark_vllm.drafter.checkpoint import load_drafter, save_drafter
from dspark_vllm.drafter.model import DSparkDrafter
from dspark_vllm.target import load_target
src, dst = "dspark_vllm/drafters/smollm2-135m-dspark", sys.argv[1]
target, _ = load_target(None)
emb, head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
d = load_drafter(src, emb, head, target_num_layers=target.config.num_hidden_layers)
ids = torch.arange(len(d.d2t)) + d.d2t
cfg = dataclasses.replace(d.cfg, draft_vocab_size=None)
w = DSparkDrafter(cfg, emb, head)
sd = {k: v for k, v in d.state_dict().items() if k not in ("d2t", "lm_head", "markov_head.markov_w2.weight")}
w2 = torch.zeros(cfg.vocab_size, cfg.markov_rank)
w2[ids] = d.markov_head.markov_w2.weight.float()
sd["markov_head.markov_w2.weight"] = w2
missing, unexpected = w.load_state_dict(sd, strict=False)
print("missing", missing, "unexpected", unexpected)
save_drafter(w, dst)
shutil.copy(f"{src}/calibration.json", dst)
