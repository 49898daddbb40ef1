"""Bounded on-disk cache of the target's features, built once and shared by every drafter.

Per token it keeps (float16): the outputs of the cached target layers (the drafter's
context), the final post-norm hidden state (to recompute target logits over any output
vocabulary), and float32 the full-vocabulary log-sum-exp (so target probabilities over a
reduced draft vocabulary stay exact). A DSpark drafter and the MTP-1 baseline then train
for several epochs without running the 30-layer target again.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..hardware import FEAT_DTYPES

log = logging.getLogger("vllm.dspark.cache")
FP16_MAX = 65000.0
FP8_MAX = 448.0  # the largest float8_e4m3fn value


def bytes_per_token(hidden_size: int, num_layers: int, feat_dtype: str) -> int:
    """Disk per cached token: features (+ float8 scales), final hidden, lse, token id."""
    feats = num_layers * (hidden_size + 2) if feat_dtype == "float8" else 2 * hidden_size * num_layers
    return feats + 2 * hidden_size + 4 + 4


@dataclass
class CacheInfo:
    target: str
    layer_ids: list[int]
    hidden_size: int
    num_tokens: int
    offsets: list[int]
    prompt_lens: list[int]
    temperatures: list[float]  # the sampling temperature each response was generated with
    done: int = 0  # sequences written so far, counted in `order` (resume point)
    dtype: str = "float32"  # the target's compute dtype while building
    # "length": encoded shortest first, so a batch pads little (caches from before it: "index")
    order: str = "index"
    # How the layer features are stored: "float16", or "float8" (e4m3 with one float16
    # scale per token and layer: 2.9 instead of 5.8 KB of features per token here).
    feat_dtype: str = "float16"

    def encode_order(self) -> list[int]:
        n = len(self.prompt_lens)
        if self.order == "index":
            return list(range(n))
        return sorted(range(n), key=lambda s: self.offsets[s + 1] - self.offsets[s])

    @property
    def feat_size(self) -> int:
        return self.hidden_size * len(self.layer_ids)


class FeatureCache:
    """Memory-mapped arrays: feats [N, L*H] f16 (or u8 float8 bits + scales [N, L] f16),
    last [N, H] f16, lse [N] f32, tokens [N] i32."""

    def __init__(self, root: str | Path, mode: str = "r") -> None:
        self.root = Path(root)
        index = self.root / "index.json"
        if not index.is_file():
            raise FileNotFoundError(f"{index}: missing, so {root} is not a feature cache "
                                    "(build one with `dspark build-cache`)")
        try:
            self.info = CacheInfo(**json.loads(index.read_text()))
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{index}: not a feature-cache index ({e}); rebuild it with "
                             "`dspark build-cache` into a new --out") from None
        n, i = self.info.num_tokens, self.info

        def mm(name, dtype, shape):
            return np.memmap(self.root / name, dtype=dtype, mode=mode, shape=shape)

        if i.feat_dtype == "float8":
            self.feats = mm("feats.f8", np.uint8, (n, i.feat_size))
            self.feat_scale = mm("feat_scale.f16", np.float16, (n, len(i.layer_ids)))
        elif i.feat_dtype == "float16":
            self.feats = mm("feats.f16", np.float16, (n, i.feat_size))
        else:
            raise ValueError(f"{index}: feat_dtype {i.feat_dtype!r} is not one of {FEAT_DTYPES}")
        self.last = mm("last.f16", np.float16, (n, i.hidden_size))
        self.lse = mm("lse.f32", np.float32, (n,))
        self.tokens = mm("tokens.i32", np.int32, (n,))

    def __len__(self) -> int:
        """Sequences readable as 0..len-1. A length-ordered cache is readable once complete."""
        i = self.info
        if i.order == "index" or i.done == len(i.prompt_lens):
            return i.done
        return 0

    def sequence(self, i: int) -> dict[str, torch.Tensor]:
        a, b = self.info.offsets[i], self.info.offsets[i + 1]
        return {
            "tokens": torch.from_numpy(np.asarray(self.tokens[a:b], dtype=np.int64)),
            "feats": self.read_feats(a, b),
            "last": torch.from_numpy(np.asarray(self.last[a:b], dtype=np.float32)),
            "lse": torch.from_numpy(np.array(self.lse[a:b])),
            "prompt_len": self.info.prompt_lens[i],
        }

    def read_feats(self, a: int, b: int) -> torch.Tensor:
        """Rows a..b of the layer features as float32 [T, L*H]."""
        if self.info.feat_dtype == "float16":
            return torch.from_numpy(np.asarray(self.feats[a:b], dtype=np.float32))
        q = torch.from_numpy(np.array(self.feats[a:b])).view(torch.float8_e4m3fn).float()
        scale = torch.from_numpy(np.asarray(self.feat_scale[a:b], dtype=np.float32))
        return (q.view(b - a, scale.shape[1], -1) * scale[..., None]).flatten(1)

    def write_feats(self, a: int, x: torch.Tensor) -> None:
        """Store float32 features x [T, L*H] at rows a..a+T (float16 clamps to its range;
        float8 scales each token's layer to the format's largest value)."""
        if self.info.feat_dtype == "float16":
            if x.abs().max() > FP16_MAX:
                log.warning("target features exceed the float16 range; clamping")
            self.feats[a:a + len(x)] = x.clamp(-FP16_MAX, FP16_MAX).numpy().astype(np.float16)
            return
        x = x.view(len(x), self.feat_scale.shape[1], -1)
        # The scale as stored (float16; at least its smallest subnormal, so an all-zero row
        # divides by a non-zero scale), so that q * scale reproduces x.
        scale = (x.abs().amax(-1, keepdim=True) / FP8_MAX).clamp_min(2.0 ** -24).half().float()
        q = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        self.feats[a:a + len(x)] = q.view(torch.uint8).flatten(1).numpy()
        self.feat_scale[a:a + len(x)] = scale[..., 0].numpy().astype(np.float16)

    def flush(self) -> None:
        for arr in (self.feats, self.last, self.lse, getattr(self, "feat_scale", None)):
            if arr is not None:
                arr.flush()

    def select(self, layer_ids: list[int]) -> list[int]:
        """Column blocks of `feats` holding `layer_ids` (a drafter may use a subset)."""
        missing = [i for i in layer_ids if i not in self.info.layer_ids]
        if missing:
            raise ValueError(f"cache {self.root} holds target layers {self.info.layer_ids}; "
                             f"the drafter needs {missing} too (rebuild with build-cache --layers)")
        return [self.info.layer_ids.index(i) for i in layer_ids]

    def spans(self) -> list[tuple[int, int]]:
        """(first sequence, count) of each cache this one is made of: itself."""
        return [(0, len(self))]


class CacheUnion:
    """Several feature caches read as one (more data for a drafter without rebuilding the
    cache it already has): sequences of the first, then of the second, ... Each part keeps
    its own held-out tail (`spans`), so nothing a part held out is trained on."""

    def __init__(self, roots: list[str | Path]) -> None:
        self.parts = [FeatureCache(r) for r in roots]
        first = self.parts[0].info
        for c in self.parts[1:]:
            for k in ("hidden_size", "layer_ids"):
                if getattr(c.info, k) != getattr(first, k):
                    raise ValueError(f"cache {c.root} has {k}={getattr(c.info, k)}, but "
                                     f"{self.parts[0].root} has {getattr(first, k)}: caches "
                                     "trained together must come from the same target and layers")
        self.starts = np.cumsum([0] + [len(c) for c in self.parts]).tolist()
        offsets, plens, temps, tokens, base = [0], [], [], [], 0
        for c in self.parts:
            n, ci = len(c), c.info
            offsets += [base + o for o in ci.offsets[1:n + 1]]
            plens += ci.prompt_lens[:n]
            temps += ci.temperatures[:n]
            tokens.append(np.asarray(c.tokens[:ci.offsets[n]]))
            base += ci.offsets[n]
        self.tokens = np.concatenate(tokens)  # [sum of tokens] int32, in memory (4 B/token)
        self.info = CacheInfo(target=first.target, layer_ids=first.layer_ids,
                              hidden_size=first.hidden_size, num_tokens=base, offsets=offsets,
                              prompt_lens=plens, temperatures=temps, done=len(plens),
                              dtype=first.dtype, order="index", feat_dtype=first.feat_dtype)

    def __len__(self) -> int:
        return self.starts[-1]

    def _part(self, i: int) -> tuple[FeatureCache, int]:
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.parts[k], i - self.starts[k]

    def sequence(self, i: int) -> dict[str, torch.Tensor]:
        part, j = self._part(i)
        return part.sequence(j)

    def select(self, layer_ids: list[int]) -> list[int]:
        return self.parts[0].select(layer_ids)

    def spans(self) -> list[tuple[int, int]]:
        return [(s, len(c)) for s, c in zip(self.starts, self.parts)]


def open_cache(roots: str | Path | list) -> FeatureCache | CacheUnion:
    """One cache directory, or several (a list) read as one."""
    if isinstance(roots, (list, tuple)):
        return FeatureCache(roots[0]) if len(roots) == 1 else CacheUnion(list(roots))
    return FeatureCache(roots)


def build_cache(data_dir: str | Path, out: str | Path, target_path: str, layer_ids: list[int],
                max_gb: float = 9.5, max_len: int = 768, batch_tokens: int = 4096,
                limit: int | None = None, dtype: str = "float32",
                feat_dtype: str = "float16") -> FeatureCache:
    """Run the target over make-data sequences (resumable; stops at `max_gb`), shortest
    first so that each padded batch wastes little (in the make-data order, padding to the
    batch's longest sequence cost 1.6x the real tokens on the training mix). `dtype`:
    the target's compute dtype ("auto" = bfloat16 where the CPU has it natively). Storage
    formats are the same either way and the log-normaliser always uses the float32 LM head,
    but bfloat16 moves the features and labels themselves (README), hence float32 by default.
    `feat_dtype`: how the drafter's input features are stored (float8 halves their disk; the
    labels, final hidden state and log-normaliser, stay float16/float32 either way)."""
    from tqdm import tqdm

    from ..hardware import DTYPES, preferred_dtype
    from ..target import load_target
    from .make_data import read_shards

    if limit is not None and limit < 1:  # [:0] or [:-3] would silently drop sequences
        raise ValueError(f"limit={limit}: give a positive number of sequences, or none for all")
    if feat_dtype not in FEAT_DTYPES:
        raise ValueError(f"feat_dtype={feat_dtype!r}: features are stored as one of {FEAT_DTYPES}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: the target runs in 'float32', 'bfloat16' or 'auto'")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    index = out / "index.json"
    dtype = preferred_dtype(dtype)
    target, _ = load_target(target_path, dtype=torch.float32, tokenizer=False)
    head = target.get_output_embeddings().weight.detach().clone()  # [V, H] float32, as training reads it
    target.to(getattr(torch, dtype))
    h = target.config.hidden_size
    if not index.is_file():
        seqs = [(t[:max_len], min(p, max_len), m.get("temperature", 0.0))
                for t, p, m in read_shards(data_dir)][:limit]
        per_tok = bytes_per_token(h, len(layer_ids), feat_dtype)
        budget = int(max_gb * 2**30 / per_tok)
        offsets, prompt_lens, temps, n = [0], [], [], 0
        for toks, plen, temp in seqs:
            if n + len(toks) > budget:
                log.warning("cache budget %.1f GB reached: keeping %d of %d sequences",
                            max_gb, len(prompt_lens), len(seqs))
                break
            n += len(toks)
            offsets.append(n)
            prompt_lens.append(plen)
            temps.append(float(temp))
        info = CacheInfo(target=str(target_path), layer_ids=list(layer_ids), hidden_size=h,
                         num_tokens=n, offsets=offsets, prompt_lens=prompt_lens,
                         temperatures=temps, dtype=dtype, order="length", feat_dtype=feat_dtype)
        feats = ((("feats.f8", np.uint8, (n, info.feat_size)),
                  ("feat_scale.f16", np.float16, (n, len(layer_ids))))
                 if feat_dtype == "float8" else (("feats.f16", np.float16, (n, info.feat_size)),))
        for name, dt, shape in (*feats, ("last.f16", np.float16, (n, h)),
                                ("lse.f32", np.float32, (n,)), ("tokens.i32", np.int32, (n,))):
            np.memmap(out / name, dtype=dt, mode="w+", shape=shape).flush()
        tok_mm = np.memmap(out / "tokens.i32", dtype=np.int32, mode="r+", shape=(n,))
        for i, (toks, _, _) in enumerate(seqs[:len(prompt_lens)]):
            tok_mm[offsets[i]:offsets[i + 1]] = toks
        tok_mm.flush()
        index.write_text(json.dumps(asdict(info)))
    cache = FeatureCache(out, mode="r+")
    info = cache.info
    if (info.layer_ids != list(layer_ids) or info.target != str(target_path)
            or info.dtype != dtype or info.feat_dtype != feat_dtype):
        raise ValueError(f"{out} was built for target {info.target} layers {info.layer_ids} "
                         f"in {info.dtype}, features {info.feat_dtype}; this run asks for "
                         f"{target_path} layers {list(layer_ids)} in {dtype}, features "
                         f"{feat_dtype}: resume with the same, or use a new --out")
    n_seq, order = len(info.prompt_lens), info.encode_order()

    def length(k: int) -> int:
        return info.offsets[order[k] + 1] - info.offsets[order[k]]

    bar = tqdm(total=n_seq, initial=info.done, desc="feature cache", unit="seq")
    t0, tokens = time.time(), 0
    i = info.done
    while i < n_seq:
        j, longest = i + 1, length(i)
        while j < n_seq:  # grow the batch while the padded size stays within batch_tokens
            longest_j = max(longest, length(j))
            if (j - i + 1) * longest_j > batch_tokens:
                break
            j, longest = j + 1, longest_j
        _encode_batch(target, head, cache, order[i:j], layer_ids)
        tokens += sum(length(k) for k in range(i, j))
        i = j
        info.done = i
        cache.flush()
        index.write_text(json.dumps(asdict(info)))
        bar.update(j - bar.n)
        bar.set_postfix(tok_s=f"{tokens / (time.time() - t0):.0f}")
    bar.close()
    return FeatureCache(out)


@torch.no_grad()
def _encode_batch(target, head: torch.Tensor, cache: FeatureCache, seq_ids: list[int],
                  layer_ids: list[int]) -> None:
    offs = cache.info.offsets
    lens = [offs[s + 1] - offs[s] for s in seq_ids]
    ids = torch.zeros(len(lens), max(lens), dtype=torch.long)
    for r, s in enumerate(seq_ids):
        ids[r, :lens[r]] = torch.from_numpy(np.asarray(cache.tokens[offs[s]:offs[s + 1]], dtype=np.int64))
    att = (torch.arange(ids.shape[1])[None] < torch.tensor(lens)[:, None]).long()
    # base_model: the decoder stack under any causal-LM head (`model` for Llama/Qwen,
    # `transformer` for GPT-2, ...); its last_hidden_state is post-norm, what the head reads.
    out = target.base_model(ids, attention_mask=att, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i + 1] for i in layer_ids], -1).float()  # [B, T, L*H]
    last = out.last_hidden_state.float()  # post-norm, what the LM head reads
    # float32 LM head whatever the compute dtype: training recomputes these logits in float32.
    lse = torch.logsumexp(last @ head.t(), -1)  # [B, T]
    for r, s in enumerate(seq_ids):
        a, b, n = offs[s], offs[s + 1], lens[r]
        cache.write_feats(a, feats[r, :n])
        cache.last[a:b] = last[r, :n].numpy().astype(np.float16)
        cache.lse[a:b] = lse[r, :n].numpy()
