"""The bundled drafter with its draft vocabulary widened to SIZE (no training): the old 8,192
plus the most frequent other tokens over the first cache's whole sequences (prompts and
responses); the new lm_head rows are the target's, the new transition rows zero."""
import dataclasses, shutil, sys, numpy as np, torch
from dspark_vllm.drafter.checkpoint import load_drafter, save_drafter
from dspark_vllm.drafter.model import DSparkDrafter
from dspark_vllm.target import load_target
from dspark_vllm.train.cache import open_cache
src, dst, size = "dspark_vllm/drafters/smollm2-135m-dspark", sys.argv[1], int(sys.argv[2])
target, _ = load_target(None)
emb, head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
d = load_drafter(src, emb, head, target_num_layers=target.config.num_hidden_layers)
old = (torch.arange(len(d.d2t)) + d.d2t).tolist()
cache = open_cache("runs/smollm2/cache")
counts = np.bincount(np.asarray(cache.tokens), minlength=d.cfg.vocab_size)
have = set(old)
extra = [int(t) for t in np.argsort(-counts, kind="stable") if int(t) not in have][:size - len(old)]
ids = sorted(have | set(extra))
print(f"{len(ids)} ids; the extra {len(extra)} cover {counts[extra].sum() / counts.sum():.4%} of the cache's tokens, "
      f"{(counts[extra] > 0).sum()} of them seen")
cfg = dataclasses.replace(d.cfg, draft_vocab_size=len(ids))
w = DSparkDrafter(cfg, emb, head, d2t=torch.tensor(ids) - torch.arange(len(ids)))
sd = {k: v for k, v in d.state_dict().items() if k not in ("d2t", "lm_head", "markov_head.markov_w2.weight")}
pos = {t: i for i, t in enumerate(ids)}
w2 = torch.zeros(len(ids), cfg.markov_rank)
w2[[pos[t] for t in old]] = d.markov_head.markov_w2.weight.float()
sd["markov_head.markov_w2.weight"] = w2
missing, unexpected = w.load_state_dict(sd, strict=False)
assert set(missing) <= {"d2t", "lm_head"} and not unexpected, (missing, unexpected)
save_drafter(w, dst)
shutil.copy(f"{src}/calibration.json", dst)
