"""Per training-mix category: responses, response tokens, mean length, share outside the bundled draft vocabulary.

    python benchmarks/results/vocab-1207/train_mix.py [DATA_DIR]   (default runs/smollm2/data)
"""
import glob, json, collections, sys, numpy as np, torch
from safetensors import safe_open
d2t = safe_open('dspark_vllm/drafters/smollm2-135m-dspark/model.safetensors', 'pt').get_tensor('d2t')
inv = np.zeros(49152, bool); inv[(torch.arange(len(d2t)) + d2t).numpy()] = True
agg = collections.defaultdict(lambda: [0, 0, 0])
for f in sorted(glob.glob(f"{sys.argv[1] if len(sys.argv) > 1 else 'runs/smollm2/data'}/shard-*.npz")):
    z = np.load(f, allow_pickle=False)
    meta = json.loads(str(z['meta']))
    cats = meta['categories'] if isinstance(meta, dict) and 'categories' in meta else meta
    tok, off, pl = z['tokens'], z['offsets'], z['prompt_lens']
    for i in range(len(pl)):
        r = tok[off[i] + pl[i]:off[i + 1]]
        c = cats[i] if isinstance(cats, list) else '?'
        c = c if isinstance(c, str) else c.get('category', '?')
        a = agg[c]; a[0] += 1; a[1] += len(r); a[2] += int((~inv[r]).sum())
for c, (n, t, o) in sorted(agg.items()):
    print(f"{c:10s} responses {n:5d} tokens {t:8d} mean {t/n:6.1f} outside {100*o/max(t,1):.2f}%")
