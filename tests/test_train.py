"""Distillation: the loss, the soft confidence label, anchors, resume, data parallel."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from dspark_vllm.train.loss import LossWeights, dspark_loss
from dspark_vllm.train.trainer import TrainConfig, Trainer, sample_anchors


# ----------------------------------------------------------------------------- loss
def test_loss_hand_computed():
    # One block, two slots, a 2-token draft vocabulary; the target keeps 0.1 of its mass
    # outside the draft vocabulary.
    draft_logits = torch.log(torch.tensor([[[0.5, 0.5], [0.8, 0.2]]]))
    p = torch.tensor([[[0.6, 0.3], [0.9, 0.0 + 1e-12]]])
    labels = torch.tensor([[0, 1]])
    valid = torch.tensor([[True, True]])
    conf = torch.tensor([[0.0, 0.0]])  # sigmoid = 0.5
    w = LossWeights(ce=0.1, l1=0.9, confidence=1.0, decay_gamma=4.0)
    loss, m = dspark_loss(draft_logits, p.log(), labels, valid, conf, w)
    w0, w1 = 1.0, math.exp(-1 / 4)
    l1 = [abs(0.5 - 0.6) + abs(0.5 - 0.3) + 0.1, abs(0.8 - 0.9) + 0.2 + 0.1]  # [0.4, 0.4]
    ce = [-math.log(0.5), -math.log(0.2)]
    acc = [1 - x / 2 for x in l1]
    bce = [-(a * math.log(0.5) + (1 - a) * math.log(0.5)) for a in acc]
    avg = lambda v: (w0 * v[0] + w1 * v[1]) / (w0 + w1)  # noqa: E731
    want = 0.1 * avg(ce) + 0.9 * avg(l1) + 1.0 * avg(bce)
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert m["accept_prob_at"].tolist() == pytest.approx(acc, rel=1e-5)


def test_confidence_label_is_the_acceptance_probability():
    # 1 - ½||p - q||_1 = sum_x min(p, q): the probability speculative sampling accepts.
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(5, 1, 7, generator=g), -1)
    q_logits = torch.randn(5, 1, 7, generator=g)
    q = torch.softmax(q_logits, -1)
    _, m = dspark_loss(q_logits, p.log(), torch.zeros(5, 1, dtype=torch.long),
                       torch.ones(5, 1, dtype=torch.bool), None)
    want = torch.minimum(p, q).sum(-1).mean(0)
    assert m["accept_prob_at"].tolist() == pytest.approx(want.tolist(), rel=1e-5)


def test_invalid_slots_and_out_of_vocab_labels_do_not_count():
    logits = torch.randn(1, 3, 4)
    logp = torch.log_softmax(torch.randn(1, 3, 4), -1)
    valid = torch.tensor([[True, False, False]])
    a, _ = dspark_loss(logits, logp, torch.tensor([[1, 2, -1]]), valid, None)
    changed = logits.clone()
    changed[0, 1:] += 10
    b, _ = dspark_loss(changed, logp, torch.tensor([[1, -1, 3]]), valid, None)
    assert float(a) == pytest.approx(float(b))


# -------------------------------------------------------------------------- anchors
def test_anchor_sampling_stays_in_the_response():
    g = torch.Generator().manual_seed(0)
    prompt_lens, lens = torch.tensor([5, 10, 3]), torch.tensor([20, 12, 40])
    anchors, keep = sample_anchors(prompt_lens, lens, 6, g)
    for r in range(3):
        a = anchors[r][keep[r]]
        assert len(set(a.tolist())) == len(a)
        assert (a >= prompt_lens[r]).all() and (a <= lens[r] - 2).all()
    assert keep[1].sum() == 1 and keep[0].all()  # only position 10 is a valid anchor in row 1


# ------------------------------------------------------------------- tiny pipeline
@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory, tiny_target):
    from dspark_vllm.train.cache import build_cache
    from dspark_vllm.train.make_data import _write_shard

    root = tmp_path_factory.mktemp("train")
    tiny_target.save_pretrained(root / "target")
    # A learnable language: responses count upwards mod 40 from a random start.
    rng = np.random.default_rng(0)
    seqs, plens = [], []
    for _ in range(48):
        prompt = rng.integers(4, 90, size=int(rng.integers(4, 9)))
        start = int(rng.integers(0, 40))
        resp = (start + np.arange(int(rng.integers(12, 30)))) % 40 + 50
        seqs.append(np.concatenate([prompt, resp]).astype(np.int32))
        plens.append(len(prompt))
    (root / "data").mkdir()
    _write_shard(root / "data" / "shard-00000.npz", seqs, plens, [{"temperature": 0.0}] * len(seqs))
    build_cache(root / "data", root / "cache", str(root / "target"), layer_ids=[1, 2, 3])
    return root


def _cfg(root, out, **kw):
    base = dict(cache=str(root / "cache"), out=str(out), target=str(root / "target"),
                num_layers=1, block_size=4, markov_rank=8, draft_vocab_size=48, mask_token_id=3,
                num_target_features=3, epochs=3, batch_size=4, anchors=6, lr=3e-3, heldout=0.1,
                log_every=1, save_every=5)
    return TrainConfig(**{**base, **kw})


def test_training_a_few_steps_lowers_the_loss(tiny_cache, tmp_path):
    # The tiny target is random (its distribution is near uniform), so weigh the hard
    # labels of the counting language up to get a clear learning signal.
    weights = LossWeights(ce=1.0, l1=0.1, confidence=0.1)
    out = Trainer(_cfg(tiny_cache, tmp_path, epochs=6, loss=weights)).train()
    rows = [json.loads(x) for x in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    first, last = np.mean([r["loss"] for r in rows[:4]]), np.mean([r["loss"] for r in rows[-4:]])
    assert last < 0.9 * first, (first, last)
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def test_resume_from_checkpoint_is_exact(tiny_cache, tmp_path):
    Trainer(_cfg(tiny_cache, tmp_path / "straight", max_steps=10)).train()
    Trainer(_cfg(tiny_cache, tmp_path / "resumed", max_steps=5)).train()
    Trainer(_cfg(tiny_cache, tmp_path / "resumed", max_steps=10)).train()  # picks up at 5
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "straight" / "state" / "state.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "state" / "state.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
def test_torchrun_two_processes_on_gloo(tiny_cache, tmp_path):
    cfg = _cfg(tiny_cache, tmp_path, max_steps=4)
    script = tmp_path / "run.py"
    script.write_text(
        "import json, sys\n"
        "from dspark_vllm.train.trainer import TrainConfig, Trainer\n"
        f"cfg = TrainConfig(**json.loads({json.dumps(json.dumps({k: v for k, v in cfg.__dict__.items() if k != 'loss'}))}))\n"
        "t = Trainer(cfg); t.train()\n"
        "import torch, torch.distributed as dist\n"
        "flat = torch.cat([p.detach().flatten() for p in t.drafter.parameters()])\n"
        "out = [torch.zeros_like(flat) for _ in range(2)]\n"
        "dist.all_gather(out, flat)\n"
        "assert t.world == 2 and torch.equal(out[0], out[1]), 'ranks diverged'\n"
        "print('RANK_OK', t.rank)\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                        "--master_port=29531", str(script)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("RANK_OK") == 2


def test_bigram_start_of_the_transition_head(tiny_cache, tmp_path):
    # The counting language: response token 50 + i is always followed by 50 + (i + 1) % 40.
    # Rank 48 holds all 40 successor rows (a permutation is full rank).
    zero = Trainer(_cfg(tiny_cache, tmp_path / "zero", markov_rank=48, markov_init="zero"))
    big = Trainer(_cfg(tiny_cache, tmp_path / "bigram", markov_rank=48, markov_init="bigram"))
    head = big.drafter.markov_head
    for i in range(40):
        bias = head.bias(torch.tensor([50 + i]))[0]
        assert int(bias.argmax()) == int(big.t2d[50 + (i + 1) % 40]), i
    # Only the transition head changed: the RNG stream and every other weight are the same.
    for (n, a), (_, b) in zip(zero.drafter.named_parameters(), big.drafter.named_parameters()):
        if not n.startswith("markov_head."):
            assert torch.equal(a, b), n
    assert zero.drafter.markov_head.markov_w2.weight.abs().sum() == 0


def test_greedy_outcomes_are_measured_alike_without_a_confidence_head(tiny_cache, tmp_path):
    # The parallel drafters have no confidence head; their survival sums come from the same
    # held-out blocks as calibration's, and the outcomes must not depend on the head.
    from dspark_vllm.train.calibrate import collect_greedy
    from dspark_vllm.train.trainer import heldout_split

    t = Trainer(_cfg(tiny_cache, tmp_path, max_steps=3))
    t.train()
    d = t.drafter.eval()
    seqs = heldout_split(t.cache, t.cfg.heldout)
    z, acc = collect_greedy(d, t.cache, seqs, t.cols, None)
    d.confidence_head = None
    z0, acc0 = collect_greedy(d, t.cache, seqs, t.cols, None)
    assert acc.shape == z.shape == z0.shape and len(acc) > 0
    assert np.array_equal(acc, acc0) and not z0.any()


def test_bfloat16_cache_matches_float32_and_resume_keeps_its_dtype(tiny_cache, tmp_path):
    from dspark_vllm.train.cache import FeatureCache, build_cache

    root = tiny_cache
    a = FeatureCache(root / "cache")
    b = build_cache(root / "data", tmp_path / "bf16", str(root / "target"), layer_ids=[1, 2, 3],
                    dtype="bfloat16")
    assert b.info.dtype == "bfloat16" and a.info.dtype == "float32"
    fa, fb = torch.from_numpy(np.asarray(a.feats, np.float32)), torch.from_numpy(np.asarray(b.feats, np.float32))
    assert torch.equal(torch.from_numpy(np.asarray(a.tokens)), torch.from_numpy(np.asarray(b.tokens)))
    rel = (fa - fb).norm() / fa.norm()
    assert 0 < rel < 0.02, rel  # bfloat16 rounding, nothing more
    lse_a, lse_b = torch.from_numpy(np.asarray(a.lse)), torch.from_numpy(np.asarray(b.lse))
    assert (lse_a - lse_b).abs().max() < 0.05
    with pytest.raises(ValueError, match="in bfloat16, .* in float32"):  # not silently mixed
        build_cache(root / "data", tmp_path / "bf16", str(root / "target"), layer_ids=[1, 2, 3])


def test_an_interrupted_cache_build_resumes_to_the_same_cache(tiny_cache, tmp_path, monkeypatch):
    from dspark_vllm.train import cache as cache_mod

    root, args = tiny_cache, (tiny_cache / "data", str(tiny_cache / "target"))
    straight = cache_mod.build_cache(args[0], tmp_path / "a", args[1], layer_ids=[1, 2, 3],
                                     batch_tokens=128)
    real, calls = cache_mod._encode_batch, []

    def flaky(*a, **k):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(list(a[3]))
        return real(*a, **k)

    monkeypatch.setattr(cache_mod, "_encode_batch", flaky)
    with pytest.raises(KeyboardInterrupt):
        cache_mod.build_cache(args[0], tmp_path / "b", args[1], layer_ids=[1, 2, 3], batch_tokens=128)
    partial = cache_mod.FeatureCache(tmp_path / "b")
    assert 0 < partial.info.done < len(partial.info.prompt_lens)
    assert len(partial) == 0  # shortest-first: not readable as 0..n-1 until complete
    lens = np.diff(partial.info.offsets)
    first = [s for c in calls for s in c]
    assert list(lens[first]) == sorted(lens)[:len(first)]  # shortest first
    monkeypatch.setattr(cache_mod, "_encode_batch", real)
    resumed = cache_mod.build_cache(args[0], tmp_path / "b", args[1], layer_ids=[1, 2, 3],
                                    batch_tokens=128)
    assert len(resumed) == len(straight) == len(lens)
    for name in ("feats", "last", "lse", "tokens"):
        assert np.array_equal(getattr(resumed, name), getattr(straight, name)), name


@pytest.mark.parametrize("kw,match", [({"limit": 0}, "limit=0: give a positive"),
                                      ({"limit": -3}, "limit=-3: give a positive"),
                                      ({"dtype": "float16"}, "dtype='float16': .*'float32', 'bfloat16' or 'auto'")])
def test_build_cache_refuses_a_bad_limit_or_dtype_by_name(tiny_cache, tmp_path, kw, match):
    from dspark_vllm.train.cache import build_cache

    with pytest.raises(ValueError, match=match):
        build_cache(tiny_cache / "data", tmp_path / "c", str(tiny_cache / "target"),
                    layer_ids=[1, 2, 3], **kw)
    assert not (tmp_path / "c").exists()  # refused before anything is written


def test_caches_built_before_length_order_still_read_in_index_order():
    from dspark_vllm.train.cache import CacheInfo

    old = CacheInfo(target="t", layer_ids=[1], hidden_size=4, num_tokens=9, offsets=[0, 5, 7, 9],
                    prompt_lens=[1, 1, 1], temperatures=[0.0] * 3, done=2)  # no order field
    assert old.order == "index" and old.encode_order() == [0, 1, 2]
    new = CacheInfo(**{**old.__dict__, "order": "length"})
    assert new.encode_order() == [1, 2, 0]


def test_an_unknown_transition_start_is_refused_by_name(tiny_cache, tmp_path):
    with pytest.raises(ValueError, match="'Bigram'.*'zero' or 'bigram'"):
        Trainer(_cfg(tiny_cache, tmp_path, markov_init="Bigram"))


@pytest.mark.parametrize("kw, match", [
    (dict(epochs=-1), r"epochs=-1: must be > 0"),  # used to train one step
    (dict(data_fraction=2.0), r"data_fraction=2.0: must be in \(0, 1\]"),  # IndexError
    (dict(batch_size=0, lr=0.0), r"lr=0.0: must be > 0; batch_size=0"),
    (dict(max_steps=0), r"max_steps=0"),
    (dict(markov_rank=-1), r"markov_rank=-1"),
])
def test_train_settings_are_refused_by_name_before_loading(kw, match, tmp_path):
    TrainConfig(cache="c", out="o").validate()  # the defaults are valid
    with pytest.raises(ValueError, match=match):
        Trainer(TrainConfig(cache=str(tmp_path / "absent"), out=str(tmp_path / "o"), **kw))


def test_a_directory_that_is_not_a_cache_is_named(tmp_path):
    from dspark_vllm.train.cache import FeatureCache

    with pytest.raises(FileNotFoundError, match=r"index.json: missing.*dspark build-cache"):
        FeatureCache(tmp_path)
    (tmp_path / "index.json").write_text('{"layers": 1}')
    with pytest.raises(ValueError, match=r"not a feature-cache index"):
        FeatureCache(tmp_path)


def test_recipe_refuses_bad_settings_before_generating(tmp_path):
    from dspark_vllm.train.recipe import RecipeConfig, run_recipe

    for kw, match in ((dict(variants=("dspark-2l", "dspark-9l")), r"\['dspark-9l'\]: choose"),
                      (dict(data_fractions=(0.5, 0.0)), r"data_fraction=0.0"),
                      (dict(num_prompts=0), r"num_prompts=0"),
                      (dict(feature_dtype="int4"), r"feature_dtype='int4'")):
        with pytest.raises(ValueError, match=match):
            run_recipe(RecipeConfig(out=str(tmp_path / "r"), **kw))
    assert not (tmp_path / "r").exists()


def test_an_unknown_evaluation_set_lists_the_known_ones():
    from dspark_vllm.datasets import load_eval_set

    with pytest.raises(ValueError, match=r"'gsm8kk'.*\['gsm8k', 'humaneval', 'spec_bench'\]"):
        load_eval_set("gsm8kk")


def test_counts_below_one_are_refused_by_name():
    from dspark_vllm.audit import audit
    from dspark_vllm.datasets import load_eval_set

    with pytest.raises(ValueError, match=r"limit=-1: a positive number"):
        load_eval_set("gsm8k", limit=-1)  # rows[:-1] used to drop the last prompt silently
    with pytest.raises(ValueError, match=r"samples=0"):
        audit(n=0)  # was a ZeroDivisionError


def test_make_data_refuses_bad_settings_before_writing(tmp_path):
    from dspark_vllm.train.make_data import MakeDataConfig, make_data

    MakeDataConfig(out_dir="x").validate()  # the defaults are valid
    for kw, match in ((dict(num_prompts=0), r"num_prompts=0: must be a positive integer"),
                      (dict(greedy_fraction=1.5, dtype="fp8"), r"greedy_fraction=1.5.*'fp8'")):
        with pytest.raises(ValueError, match=match):
            make_data(MakeDataConfig(out_dir=str(tmp_path / "d"), **kw))
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("arch", ["gpt2", "qwen3"])
def test_any_causal_lm_trains_and_decodes_exactly(arch, tmp_path):
    """Not only Llama-shaped targets: GPT-2 names its stack `transformer` and its sizes
    n_inner / layer_norm_epsilon / n_positions. Cache, a few steps, then the trained
    drafter's greedy speculative decoding equals the target's greedy output."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from dspark_vllm.drafter.checkpoint import load_drafter
    from dspark_vllm.evaluate import DSparkAdapter, SpecDecoder
    from dspark_vllm.train.cache import build_cache
    from dspark_vllm.train.make_data import _write_shard

    if arch == "gpt2":
        cfg = AutoConfig.for_model("gpt2", vocab_size=96, n_embd=64, n_layer=6, n_head=4)
    else:
        cfg = AutoConfig.for_model(arch, vocab_size=96, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=6, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_config(cfg).eval()
    target.save_pretrained(tmp_path / "target")
    rng = np.random.default_rng(0)
    seqs = [np.concatenate([rng.integers(4, 90, size=6), (s + np.arange(20)) % 40 + 50])
            .astype(np.int32) for s in rng.integers(0, 40, size=16)]
    (tmp_path / "data").mkdir()
    _write_shard(tmp_path / "data" / "shard-00000.npz", seqs, [6] * 16, [{}] * 16)
    build_cache(tmp_path / "data", tmp_path / "cache", str(tmp_path / "target"), layer_ids=[1, 2, 3])
    out = Trainer(TrainConfig(cache=str(tmp_path / "cache"), out=str(tmp_path / "o"),
                              target=str(tmp_path / "target"), num_layers=1, block_size=4,
                              markov_rank=8, draft_vocab_size=48, mask_token_id=3,
                              num_target_features=3, batch_size=4, anchors=4, max_steps=3)).train()
    emb, head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    drafter = load_drafter(out, emb, head, target_num_layers=6).eval()
    dec = SpecDecoder(target, DSparkAdapter(drafter), set(), 0.0, 4, torch.Generator().manual_seed(0))
    prompt = [5, 17, 33, 8, 60, 21]
    r = dec.generate(prompt, 24)
    ref = target.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                          pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
    assert r["tokens"] == ref


def test_the_mask_token_is_an_unused_special_token_of_the_tokenizer(tiny_cache, tmp_path):
    from transformers import AddedToken, PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    from dspark_vllm.train.cache import FeatureCache
    from dspark_vllm.train.vocab import pick_mask_token, response_counts

    vocab = {f"t{i}": i for i in range(96)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
                                  bos_token="t1", eos_token="t2", pad_token="t2")
    tok.add_tokens([AddedToken(f"t{i}", special=True) for i in (3, 4, 60)])
    tok.save_pretrained(tmp_path / "tok")
    (tmp_path / "tok" / "config.json").write_text((tiny_cache / "target" / "config.json").read_text())
    cache = FeatureCache(tiny_cache / "cache")
    # 60 occurs in the counting responses (tokens 50..89), so 4 is the highest unused one.
    assert pick_mask_token(str(tmp_path / "tok"), response_counts(cache, list(range(len(cache))))) == 4


def test_float8_features_are_half_the_disk_and_close_to_float16(tiny_cache, tmp_path):
    from dspark_vllm.train.cache import FeatureCache, build_cache

    c8 = build_cache(tiny_cache / "data", tmp_path / "c8", str(tiny_cache / "target"),
                     layer_ids=[1, 2, 3], feat_dtype="float8")
    c16 = FeatureCache(tiny_cache / "cache")
    n = c16.info.num_tokens
    f16, f8 = c16.read_feats(0, n).view(n, 3, -1), c8.read_feats(0, n).view(n, 3, -1)
    rel = ((f8 - f16).norm(dim=-1) / f16.norm(dim=-1)).max()
    assert 0 < rel < 0.06, rel  # e4m3 keeps 3 mantissa bits: ~2% per token and layer
    assert (tmp_path / "c8" / "feats.f8").stat().st_size * 2 == (tiny_cache / "cache" / "feats.f16").stat().st_size
    for k in ("last", "lse", "tokens"):  # the labels are stored exactly as before
        assert torch.equal(c8.sequence(3)[k], c16.sequence(3)[k])
    out = Trainer(_cfg(tiny_cache, tmp_path / "t", cache=str(tmp_path / "c8"), max_steps=3)).train()
    assert (out / "model.safetensors").is_file()
    with pytest.raises(ValueError, match=r"features float16"):  # resume must match the format
        build_cache(tiny_cache / "data", tmp_path / "c8", str(tiny_cache / "target"), layer_ids=[1, 2, 3])


def test_training_continues_from_a_trained_drafter(tiny_cache, tmp_path):
    from safetensors.torch import load_file

    from dspark_vllm.drafter.checkpoint import read_checkpoint_shapes

    weights = LossWeights(ce=1.0, l1=0.1, confidence=0.1)
    first = Trainer(_cfg(tiny_cache, tmp_path / "a", max_steps=20, loss=weights)).train()
    # The checkpoint's shape wins over the config's (rank 8, vocabulary 48, mask 3).
    t = Trainer(_cfg(tiny_cache, tmp_path / "b", init_from=str(first), markov_rank=4,
                     draft_vocab_size=20, mask_token_id=5, max_steps=3, loss=weights))
    assert (t.cfg.markov_rank, t.cfg.draft_vocab_size, t.cfg.mask_token_id) == (8, 48, 3)
    saved = load_file(str(first / "model.safetensors"))
    assert torch.equal(t.drafter.d2t, saved["d2t"])
    assert torch.equal(t.drafter.fc.weight, saved["fc.weight"])  # starts from the weights
    t.train()
    loss = [[json.loads(x)["loss"] for x in (tmp_path / d / "train_log.jsonl").read_text().splitlines()]
            for d in ("a", "b")]
    # Same seed, so the same first batches: on each, the continued drafter starts below the fresh one.
    assert all(b < a - 0.1 for a, b in zip(loss[0][:3], loss[1])), loss
    assert read_checkpoint_shapes(tmp_path / "b" / "drafter") == read_checkpoint_shapes(first)
    cfg = json.loads((tmp_path / "b" / "drafter" / "config.json").read_text())
    assert cfg.get("dspark_confidence_temperatures") is None  # old calibration dropped


def test_continuing_from_a_missing_or_mismatched_drafter_is_refused_by_name(tiny_cache, tmp_path):
    from dspark_vllm.drafter.config import DrafterConfigError

    with pytest.raises(ValueError, match=r"init_from='.*nowhere': no drafter there"):
        Trainer(_cfg(tiny_cache, tmp_path / "x", init_from=str(tmp_path / "nowhere")))
    first = Trainer(_cfg(tiny_cache, tmp_path / "a", max_steps=1)).train()
    cfg = json.loads((first / "config.json").read_text())
    (first / "config.json").write_text(json.dumps({**cfg, "hidden_size": cfg["hidden_size"] * 2}))
    with pytest.raises(DrafterConfigError, match="hidden_size"):
        Trainer(_cfg(tiny_cache, tmp_path / "y", init_from=str(first)))


@pytest.mark.parametrize("extra, named", [(["--num-layers", "3"], "--num-layers"),
                                          (["--variant", "parallel-5l"], "--variant parallel-5l")])
def test_cli_init_from_refuses_shape_flags_by_name(tmp_path, extra, named):
    from dspark_vllm.cli import main

    argv = ["train", "--cache", str(tmp_path), "--out", str(tmp_path / "o"),
            "--init-from", str(tmp_path / "d"), *extra]
    with pytest.raises(SystemExit, match=f"--init-from .*drop {named}"):
        main(argv)
