"""More data without rebuilding: several feature caches trained on as one, and make-data
continuing the prompt mix where an earlier run stopped."""

import numpy as np
import pytest
import torch

from dspark_vllm.train.cache import CacheUnion, FeatureCache, build_cache, open_cache
from dspark_vllm.train.make_data import MakeDataConfig, _write_shard, make_data
from dspark_vllm.train.trainer import TrainConfig, Trainer, heldout_split, train_split


def _data(root, n, seed):
    rng = np.random.default_rng(seed)
    seqs, plens = [], []
    for _ in range(n):
        prompt = rng.integers(4, 90, size=int(rng.integers(4, 9)))
        resp = (int(rng.integers(0, 40)) + np.arange(int(rng.integers(12, 30)))) % 40 + 50
        seqs.append(np.concatenate([prompt, resp]).astype(np.int32))
        plens.append(len(prompt))
    root.mkdir()
    temps = [{"temperature": 0.0 if i % 3 else 0.8} for i in range(n)]
    _write_shard(root / "shard-00000.npz", seqs, plens, temps)
    return root


@pytest.fixture(scope="module")
def two_caches(tmp_path_factory, tiny_target):
    root = tmp_path_factory.mktemp("union")
    tiny_target.save_pretrained(root / "target")
    t = str(root / "target")
    a = build_cache(_data(root / "da", 20, 0), root / "ca", t, layer_ids=[1, 2, 3])
    b = build_cache(_data(root / "db", 13, 1), root / "cb", t, layer_ids=[1, 2, 3],
                    feat_dtype="float8")  # parts may store their features differently
    return root, a, b


def test_a_union_reads_each_part_unchanged(two_caches):
    root, a, b = two_caches
    u = open_cache([root / "ca", root / "cb"])
    assert isinstance(u, CacheUnion) and len(u) == len(a) + len(b) == 33
    for i in range(len(u)):
        part, j = (a, i) if i < len(a) else (b, i - len(a))
        want, got = part.sequence(j), u.sequence(i)
        assert got["prompt_len"] == want["prompt_len"]
        for k in ("tokens", "feats", "last", "lse"):
            assert torch.equal(got[k], want[k]), (i, k)
        # The union's own offsets and token array (bigram start, token counts) agree.
        lo, hi = u.info.offsets[i], u.info.offsets[i + 1]
        assert np.array_equal(u.tokens[lo:hi], want["tokens"].numpy())
        assert u.info.temperatures[i] == part.info.temperatures[j]
    assert u.info.num_tokens == u.info.offsets[-1] == len(u.tokens)
    assert isinstance(open_cache([root / "ca"]), FeatureCache)  # one directory: no union


def test_each_part_keeps_its_own_held_out_tail(two_caches):
    root, a, b = two_caches
    u = open_cache([root / "ca", root / "cb"])
    tr, ho = train_split(u, 0.1), heldout_split(u, 0.1)
    assert tr == train_split(a, 0.1) + [len(a) + i for i in train_split(b, 0.1)]
    assert ho == heldout_split(a, 0.1) + [len(a) + i for i in heldout_split(b, 0.1)]
    assert sorted(tr + ho) == list(range(len(u))) and not set(tr) & set(ho)
    assert ho == [18, 19, 32]  # 2 of a's 20 and 1 of b's 13


def test_training_on_a_union_uses_only_its_training_sequences(two_caches, tmp_path):
    root, a, b = two_caches
    cfg = TrainConfig(cache=[str(root / "ca"), str(root / "cb")], out=str(tmp_path),
                      target=str(root / "target"), num_layers=1, block_size=4, markov_rank=8,
                      draft_vocab_size=48, mask_token_id=3, num_target_features=3, epochs=1,
                      batch_size=4, anchors=4, heldout=0.1, max_steps=3, save_every=100)
    t = Trainer(cfg)
    assert t.seqs == train_split(t.cache, 0.1)
    drawn = {i for s in range(t.steps_per_epoch) for i in t.batch_indices(s)}
    assert drawn <= set(t.seqs) and not drawn & set(heldout_split(t.cache, 0.1))
    assert (t.train() / "model.safetensors").is_file()


def test_caches_of_other_layers_are_refused_by_name(two_caches):
    root, _, _ = two_caches
    build_cache(root / "da", root / "c12", str(root / "target"), layer_ids=[1, 2])
    with pytest.raises(ValueError, match=r"c12 has layer_ids=\[1, 2\].*\[1, 2, 3\]"):
        open_cache([root / "ca", root / "c12"])


def test_make_data_refuses_a_negative_first_prompt(tmp_path):
    with pytest.raises(ValueError, match=r"first_prompt=-1: a prompt index"):
        make_data(MakeDataConfig(out_dir=str(tmp_path / "d"), first_prompt=-1))
    assert not (tmp_path / "d").exists()
