"""Bounded soak run: concurrent streaming clients with random max_tokens, temperatures and
disconnects against `vllm serve` with DSpark + the load-aware budget.

    python -m benchmarks.soak --clients 32 --minutes 10 --out benchmarks/results/soak.json

Checks: every request that was not cancelled completes; afterwards nothing is left in the
scheduler (vLLM's running/waiting gauges and DSpark's tracked requests are 0); the engine
processes' memory stays flat (resident set sampled during the run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path

from dspark_vllm.serving import BUNDLED_DRAFTER, VllmServer, metric_sum

PROMPTS = ["Explain how a bicycle works.", "Write a haiku about rain.",
           "What is 17 * 23? Show the steps.", "List five prime numbers and why.",
           "Write a Python function that checks for palindromes.",
           "Summarize the plot of a detective story in three sentences."]
GROWTH_LIMIT = 0.10  # resident memory may not grow more than 10% from the first to last quarter


def _rss(pid: int) -> dict[str, int]:
    """Resident bytes of the server's process tree, by process name (vLLM names its engine
    core and worker processes; the API server is the root)."""
    import psutil

    p = psutil.Process(pid)
    out: dict[str, int] = {}
    for c in [p, *p.children(recursive=True)]:
        try:
            name = "api-server" if c.pid == pid else c.name()
            out[name] = out.get(name, 0) + c.memory_info().rss
        except psutil.NoSuchProcess:  # a helper process that came and went
            pass
    return out


async def client(url, rng, deadline, counts, errors, p_disconnect):
    from openai import AsyncOpenAI

    c = AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
    while time.time() < deadline:
        counts["started"] += 1
        cut = rng.randint(1, 8) if rng.random() < p_disconnect else None
        try:
            stream = await c.chat.completions.create(
                model="target", messages=[{"role": "user", "content": rng.choice(PROMPTS)}],
                max_tokens=rng.randint(1, 160), temperature=rng.choice([0.0, 0.0, 0.7, 1.0]),
                stream=True)
            chunks, finished = 0, False
            async for chunk in stream:
                chunks += 1
                if chunk.choices and chunk.choices[0].finish_reason:
                    finished = True
                if cut is not None and chunks >= cut:
                    await stream.close()  # the client disconnects mid-stream
                    break
            if cut is not None and not finished:
                counts["cancelled"] += 1
            elif finished:
                counts["completed"] += 1
            else:
                errors.append("stream ended without a finish_reason")
        except Exception as e:  # noqa: BLE001 - every failure is a finding
            errors.append(f"{type(e).__name__}: {e}")
    await c.close()


async def _drive(url, clients, seconds, seed, p_disconnect, server, parts):
    rng = random.Random(seed)
    counts = {"started": 0, "completed": 0, "cancelled": 0}
    errors: list[str] = []
    deadline = time.time() + seconds

    async def sampler():
        while time.time() < deadline:
            parts.append((time.time(), _rss(server.proc.pid)))
            await asyncio.sleep(5)

    await asyncio.gather(sampler(), *(client(url, random.Random(rng.random()), deadline, counts,
                                             errors, p_disconnect) for _ in range(clients)))
    return counts, errors


def rss_by_minute(samples: list[tuple[float, int]]) -> list[float]:
    """The resident-memory samples [(time, bytes)] as one mean a minute of the run, in MB:
    a plateau after warm-up, or a slope that a longer run would carry on (a leak)."""
    if not samples:
        return []
    t0, minutes = samples[0][0], {}
    for t, rss in samples:
        minutes.setdefault(int((t - t0) // 60), []).append(rss)
    return [round(sum(v) / len(v) / 2**20, 1) for _, v in sorted(minutes.items())]


def soak(target: str, drafter: str | None, clients: int, seconds: float, seed: int = 0,
         p_disconnect: float = 0.2, log_path=None) -> dict:
    """drafter None: plain vLLM, the same load (a control for what DSpark adds)."""
    spec = None if drafter is None else {
        "method": "dspark", "model": drafter, "num_speculative_tokens": 5,
        "enable_adaptive_verification": True, "draft_sample_method": "probabilistic"}
    with VllmServer(target, spec=spec, log_path=log_path, max_model_len=1024,
                    args=["--max-num-seqs", str(clients)]) as s:
        parts: list[tuple[float, dict[str, int]]] = []  # (time, resident bytes by process)
        counts, errors = asyncio.run(_drive(s.url, clients, seconds, seed, p_disconnect, s,
                                            parts))
        idle = None
        for _ in range(60):  # aborted requests drain within a few steps
            m = s.metrics()
            idle = {k: metric_sum(m, k) for k in ("vllm:num_requests_running",
                                                  "vllm:num_requests_waiting",
                                                  "dspark_tracked_requests")}
            if not any(idle.values()):
                break
            time.sleep(1)
    samples = [(ts, sum(r.values())) for ts, r in parts]  # the whole tree
    q = max(len(samples) // 4, 1)
    first = sum(r for _, r in samples[:q]) / q
    last = sum(r for _, r in samples[-q:]) / q
    return {"clients": clients, "seconds": seconds, **counts, "errors": errors[:20],
            "num_errors": len(errors), "after_idle": idle, "rss_first_quarter_mb": first / 2**20,
            "rss_last_quarter_mb": last / 2**20, "rss_growth": last / first - 1,
            "rss_by_minute_mb": rss_by_minute(samples),
            "rss_by_minute_mb_by_process": {n: rss_by_minute([(ts, r.get(n, 0)) for ts, r in parts])
                                            for n in sorted({n for _, r in parts for n in r})},
            "ok": not errors and idle is not None and not any(idle.values())
            and last / first - 1 < GROWTH_LIMIT}


def main(argv=None):
    from dspark_vllm.target import prepare_target

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--drafter", default=None, help=f"default: {BUNDLED_DRAFTER}")
    p.add_argument("--plain", action="store_true",
                   help="serve without speculation: the same load on plain vLLM, a control")
    p.add_argument("--disconnect", type=float, default=0.2, help="probability per request")
    p.add_argument("--out", default="benchmarks/results/soak.json")
    a = p.parse_args(argv)
    if a.plain and a.drafter:
        p.error(f"--plain with --drafter {a.drafter}: plain vLLM serves no drafter; give one or the other")
    drafter = None if a.plain else a.drafter or str(BUNDLED_DRAFTER)
    r = soak(str(prepare_target()), drafter, a.clients, a.minutes * 60,
             p_disconnect=a.disconnect,
             log_path=Path(a.out).with_suffix(".log"))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(r, indent=2))
    print(json.dumps(r, indent=2))
    raise SystemExit(0 if r["ok"] else 1)


if __name__ == "__main__":
    main()
