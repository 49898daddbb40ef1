"""Triton transition-head kernels vs their torch references.

The kernel parity checks live in kernels/parity.py and run in a fresh subprocess: on CPU
under the Triton interpreter (TRITON_INTERPRET must be set before the kernels are defined,
and an imported vLLM may have swapped `triton` for a stub), on a GPU natively (`cuda` mark).
The rest (random stream, reference math, dispatcher) runs in-process on torch alone.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from kernels import dispatch, reference, rng

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ["asserts", "dense", "gumbel_distribution", "topk", "confidence", "dispatch_columns"]


def _run_module(module: str, *args: str, interpret: bool, timeout: int = 600):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
               DSPARK_KERNEL_POISON="1", TRITON_DEFAULT_FP_FUSION="1")
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _parity(device: str, interpret: bool) -> dict[str, dict]:
    proc = _run_module("kernels.parity", "--device", device, interpret=interpret)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    results = {r["check"]: r for r in rows}
    if not results:
        pytest.fail(f"kernels.parity produced no results (rc {proc.returncode}):\n"
                    f"{proc.stderr[-3000:]}")
    return results


@pytest.fixture(scope="module")
def interpreter_parity():
    return _parity("cpu", interpret=True)


@pytest.fixture(scope="module")
def cuda_parity():
    return _parity("cuda", interpret=False)


@pytest.mark.parametrize("check", CHECKS)
def test_parity_interpreter(interpreter_parity, check):
    result = interpreter_parity.get(check)
    assert result is not None, f"check {check} did not run"
    assert result["ok"], result["detail"]


@pytest.mark.cuda
@pytest.mark.parametrize("check", CHECKS)
def test_parity_cuda(cuda_parity, check):
    result = cuda_parity.get(check)
    assert result is not None, f"check {check} did not run"
    assert result["ok"], result["detail"]


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    """Real compiler down to a cubin (no GPU needed): types, shared memory limits."""
    ptxas = Path(__import__("triton").__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists() and shutil.which("ptxas") is None:
        pytest.skip("no ptxas for an ahead-of-time compile")
    proc = _run_module("kernels.aot", "--cc", "90", interpret=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


# ----------------------------------------------------------------- the random stream
def _fmix32_py(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _uniform_py(seed: int, position: int, index: int) -> float:
    """The stream of kernels/rng.py's docstring in plain Python integers."""
    lo, hi = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    k = _fmix32_py(_fmix32_py(lo ^ 0x6A09E667) ^ hi)
    k = _fmix32_py(_fmix32_py(k ^ (position & 0xFFFFFFFF)) ^ ((position >> 32) & 0xFFFFFFFF))
    x = _fmix32_py(((index * 0x9E3779B9) & 0xFFFFFFFF) ^ k)
    x = _fmix32_py((x + k) & 0xFFFFFFFF)
    return ((x >> 9) + 0.5) * 2.0 ** -23


def test_stream_matches_plain_integer_definition():
    cases = [(0, 0, 0), (1, 5, 7), (-1, 3, 151935), (2**40 + 5, 2**33, 42),
             (-(2**62), 99, 1), (2**63 - 1, 0, 65535)]
    seed, pos, idx = (torch.tensor(c) for c in zip(*cases))
    got = rng.uniform(rng.row_key(seed, pos), idx)
    want = torch.tensor([_uniform_py(*c) for c in cases], dtype=torch.float32)
    assert torch.equal(got, want)


def test_uniforms_stay_inside_the_open_interval():
    ends = (torch.tensor([0.0, 2.0**23 - 1]) + 0.5) * rng.UNIFORM_SCALE  # extreme bit patterns
    assert ends[0] > 0 and ends[1] < 1
    g = rng.gumbel(torch.arange(64), torch.zeros(64, dtype=torch.long),
                   torch.arange(4096).expand(64, 4096))
    assert torch.isfinite(g).all()
    assert abs(g.mean().item() - 0.5772) < 0.01  # Euler-Mascheroni: the Gumbel mean


def test_reference_gumbel_max_matches_softmax():
    n, v, t = 20000, 16, 1.3
    gen = torch.Generator().manual_seed(1)
    row = torch.randn(v, generator=gen) * 2
    zeros = dict(w1=torch.zeros(1, 4), w2=torch.zeros(v, 4), prev_ids=torch.zeros(n).long())
    tok = reference.transition_step_ref(row.expand(n, v), temperature=torch.full((n,), t),
                                        seed=torch.arange(n) // 100, position=torch.arange(n),
                                        **zeros)[0]
    expected = torch.softmax(row / t, -1) * n
    chi2 = ((torch.bincount(tok, minlength=v) - expected) ** 2 / expected).sum().item()
    assert chi2 < 37.7, chi2  # 0.999 quantile of chi-square with 15 degrees of freedom


# ------------------------------------------------------ the reference is the drafter's math
def test_reference_matches_the_drafter(tiny_target):
    from tests.conftest import make_drafter

    drafter = make_drafter(tiny_target, markov_rank=8, draft_vocab=40)
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(6, drafter.cfg.hidden_size, generator=gen)
    prev = torch.randint(0, drafter.cfg.vocab_size, (6,), generator=gen)
    base = drafter.base_logits(h).float()
    mh = drafter.markov_head
    zeros = torch.zeros(6, dtype=torch.long)
    tok, logprob, _, probs = reference.transition_step_ref(
        base, prev, mh.markov_w1.weight, mh.markov_w2.weight, torch.zeros(6), zeros, zeros,
        want_probs=True)
    logits = base + drafter.markov_bias(prev).float()
    assert torch.equal(tok, logits.argmax(-1))
    torch.testing.assert_close(probs, torch.softmax(logits, -1))
    proj = drafter.confidence_head.proj
    conf = reference.confidence_ref(h, prev, mh.markov_w1.weight, proj.weight[0], proj.bias)
    torch.testing.assert_close(conf, torch.sigmoid(drafter.confidence_logits(h, prev)))


def test_greedy_forms_match_the_general_references():
    gen = torch.Generator().manual_seed(3)
    b, k, v, vt, r, hd = 5, 4, 60, 90, 8, 16
    base, w1, w2 = (torch.randn(b, v, generator=gen), torch.randn(vt, r, generator=gen),
                    torch.randn(v, r, generator=gen))
    prev = torch.randint(0, vt, (b,), generator=gen)
    zeros = torch.zeros(b, dtype=torch.long)
    tok = reference.transition_step_ref(base, prev, w1, w2, torch.zeros(b), zeros, zeros)[0]
    assert torch.equal(reference.transition_argmax_ref(base, prev, w1, w2), tok)
    assert torch.equal(dispatch.transition_argmax(base, prev, w1, w2), tok)  # CPU: the reference
    h, prevs = torch.randn(b, k, hd, generator=gen), torch.randint(0, vt, (b, k), generator=gen)
    w, bias, temps = torch.randn(hd + r, generator=gen), torch.randn(1, generator=gen), \
        torch.tensor([1.0, 0.5, 2.0, 1.3])
    want = torch.stack([reference.confidence_ref(h[:, i], prevs[:, i], w1, w / temps[i],
                                                 bias / temps[i]) for i in range(k)], 1)
    torch.testing.assert_close(dispatch.confidence_block(h, prevs, w1, w, bias, temps), want)


# ------------------------------------------------------------------------- dispatcher
def _small(b=3, v=50, r=8):
    gen = torch.Generator().manual_seed(2)
    return (torch.randn(b, v, generator=gen), torch.randint(0, 20, (b,), generator=gen),
            torch.randn(20, r, generator=gen), torch.randn(v, r, generator=gen),
            torch.tensor([0.0, 0.8, 1.5])[:b], torch.arange(b), torch.arange(b) + 7)


def test_dispatcher_falls_back_on_cpu_and_says_why_once(caplog, monkeypatch):
    monkeypatch.setattr(dispatch, "_told", set())
    args = _small()
    u, prev, w1, w2, temp, seed, pos = args
    ids = torch.arange(50).expand(3, 50).contiguous()
    h, w, b = torch.randn(3, 16), torch.randn(16 + 8), torch.randn(1)
    with caplog.at_level(logging.INFO, logger="kernels.dispatch"):
        for _ in range(3):
            got = dispatch.transition_step(*args, want_probs=True)
            got_k = dispatch.transition_step_topk(u, ids, prev, w1, w2, temp, seed, pos)
            got_c = dispatch.confidence(h, prev, w1, w, b)
    want = reference.transition_step_ref(*args, want_probs=True)
    for g, e in zip(got, want):
        assert torch.equal(g, e)
    assert torch.equal(got_k[0], want[0])  # k = V: the dense step's draw
    torch.testing.assert_close(got_k[1:], want[1:3])
    assert torch.equal(got_c, reference.confidence_ref(h, prev, w1, w, b))
    messages = [r.getMessage() for r in caplog.records if r.name == "kernels.dispatch"]
    for name in ("transition_step:", "transition_step_topk:", "confidence:"):
        said = [m for m in messages if name in m]
        assert len(said) == 1, messages
        assert "on cpu" in said[0] and "CUDA" in said[0]


def test_dispatcher_names_a_placeholder_triton(monkeypatch):
    stub = types.ModuleType("triton")  # what vLLM installs when no Triton backend is usable
    stub.jit = lambda fn: fn
    monkeypatch.setitem(sys.modules, "triton", stub)
    dispatch._backend_problem.cache_clear()
    try:
        assert "placeholder" in dispatch._backend_problem()
    finally:
        dispatch._backend_problem.cache_clear()
