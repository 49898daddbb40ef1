"""DSpark through real `vllm serve` processes on 127.0.0.1 (float32: token ids compared).

One server without speculation and one with DSpark (probabilistic drafting, so the
temperature-1 test exercises exact verification with draft probabilities) are started
once for the module; a third with a tiny KV cache forces preemption.
"""

from __future__ import annotations

import collections
import json
import urllib.request

import pytest
from scipy.stats import chi2_contingency

from dspark_vllm.serving import VllmServer, acceptance_length, metric_sum
from dspark_vllm.target import prepare_target
from tests.engine_utils import chat_all, drafter_for_tests, prompt_mix

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
    with plain, spec:
        yield plain, spec


@pytest.fixture(scope="module")
def prompts():
    return prompt_mix()


@pytest.fixture(scope="module")
def reference(servers, prompts):
    """Greedy outputs of the server without speculation (the ground truth)."""
    lengths = [8 + (7 * i) % 56 for i in range(len(prompts))]  # different lengths
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


def test_temperature_one_distribution_matches_no_speculation(servers):
    """Two-sample chi-square on the first three sampled tokens of a fixed prompt.

    False-alarm rate: the test fails by chance with probability ALPHA = 1e-3 when the two
    distributions are equal (fixed per-request seeds make a given run reproducible).
    """
    from openai import OpenAI

    ALPHA = 1e-3
    msg = [{"role": "user", "content": "Name one animal and one colour."}]

    def samples(url):
        client = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
        out = []
        for r in range(24):
            resp = client.chat.completions.create(
                model="target", messages=msg, max_tokens=3, temperature=1.0, n=64, seed=1000 + r,
                extra_body={"return_token_ids": True})
            out += [tuple(c.token_ids[:3]) for c in resp.choices]
        return out

    a, b = samples(servers[0].url), samples(servers[1].url)
    counts = collections.Counter(a) + collections.Counter(b)
    cells = [c for c, n in counts.most_common() if n >= 10]
    ca, cb = collections.Counter(a), collections.Counter(b)
    table = [[ca[c] for c in cells] + [len(a) - sum(ca[c] for c in cells)],
             [cb[c] for c in cells] + [len(b) - sum(cb[c] for c in cells)]]
    p = chi2_contingency(table).pvalue
    assert p > ALPHA, (p, table)


def test_preemption_keeps_greedy_outputs(target, drafter, prompts, reference, tmp_path):
    lengths, want = reference
    args = ["--num-gpu-blocks-override", "12", "--max-num-seqs", "8"]
    with VllmServer(target, spec=_spec(drafter), max_model_len=MAX_LEN, args=args,
                    log_path=tmp_path / "small-kv.log") as s:
        idx = list(range(16))
        got = chat_all(s.url, [prompts[i] for i in idx], [160] * 16, concurrency=8)
        assert metric_sum(s.metrics(), "vllm:num_preemptions_total") > 0
    with VllmServer(target, max_model_len=MAX_LEN, args=args) as s0:
        ref = chat_all(s0.url, [prompts[i] for i in idx], [160] * 16, concurrency=8)
    assert got == ref


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
