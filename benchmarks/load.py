"""Load generation against an OpenAI-compatible server: closed loop or open-loop Poisson.

Every request streams; per request we record TTFT, TPOT (mean inter-token time after the
first token) and the number of completion tokens. Loops are bounded in requests and time.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass


@dataclass
class RequestResult:
    start: float
    ttft: float
    end: float
    tokens: int

    @property
    def tpot(self) -> float | None:
        return (self.end - self.start - self.ttft) / (self.tokens - 1) if self.tokens > 1 else None


async def _one(client, prompt: list[dict], max_tokens: int, temperature: float) -> RequestResult:
    start = time.perf_counter()
    first, tokens = None, 0
    stream = await client.chat.completions.create(
        model="target", messages=prompt, max_tokens=max_tokens, temperature=temperature,
        stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first is None:
            first = time.perf_counter() - start
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    return RequestResult(start, first if first is not None else end - start, end, tokens)


async def closed_loop(url: str, prompts: list[list[dict]], concurrency: int, num_requests: int,
                      max_tokens: int, temperature: float = 0.0, warmup: int = 0,
                      max_seconds: float = 600) -> tuple[list[RequestResult], float, float | None]:
    """`concurrency` users, each sending its next request when the last one finishes.
    -> (the measured requests, their window's seconds, tokens per second while every user
    had a request in flight: full_concurrency_throughput)."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    counter = {"next": 0}
    results: list[RequestResult] = []
    every: list[RequestResult] = []  # the warm-up's too: they stream inside the window
    deadline = time.perf_counter() + max_seconds

    async def user():
        while time.perf_counter() < deadline:
            i = counter["next"]
            if i >= warmup + num_requests:
                return
            counter["next"] += 1
            r = await _one(client, prompts[i % len(prompts)], max_tokens, temperature)
            every.append(r)
            if i >= warmup:
                results.append(r)

    t0 = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(concurrency)))
    await client.close()
    since = min((r.start for r in results), default=t0)
    return (results, _window(results) or (time.perf_counter() - t0),
            full_concurrency_throughput(every, since))


def full_concurrency_throughput(every: list[RequestResult], since: float) -> float | None:
    """Tokens per second streamed from `since` (the first measured request's start) until
    the closed loop's users began to run out of requests: the first end after the last
    request started. From then on fewer requests are in flight each time one ends, and a
    server whose requests end out of step (speculative decoding: each request's accepted
    drafts vary) drains longer than one whose requests end together (plain decoding, a
    wave's requests that run to the token limit), so the whole window's throughput reads it
    lower at a load it was not under.
    Each request's tokens after its first are counted as streamed evenly up to its end.
    None when the window holds no time at full concurrency."""
    if not every:
        return None
    last_start = max(r.start for r in every)
    until = min((r.end for r in every if r.end > last_start), default=None)
    if until is None or until <= since:
        return None
    tokens = 0.0
    for r in every:
        first = r.start + r.ttft
        if since <= first <= until:
            tokens += 1
        if r.tokens > 1 and r.end > first:
            overlap = min(r.end, until) - max(first, since)
            tokens += (r.tokens - 1) * max(overlap, 0.0) / (r.end - first)
    return tokens / (until - since)


async def open_loop(url: str, prompts: list[list[dict]], rate: float, num_requests: int,
                    max_tokens: int, temperature: float = 0.0, seed: int = 0, warmup: int = 0,
                    max_seconds: float = 600) -> tuple[list[RequestResult], float]:
    """Poisson arrivals at `rate` requests per second: `warmup` requests, then `num_requests`
    measured ones; arrivals stop at `max_seconds`, and every request sent is awaited."""
    from openai import AsyncOpenAI

    if not rate > 0:
        raise ValueError(f"open-loop rate {rate!r}: use a positive number of requests per second")
    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    rng = random.Random(seed)
    tasks = []
    deadline = time.perf_counter() + max_seconds
    for i in range(warmup + num_requests):
        if time.perf_counter() >= deadline:
            break
        tasks.append(asyncio.create_task(_one(client, prompts[i % len(prompts)], max_tokens,
                                              temperature)))
        await asyncio.sleep(rng.expovariate(rate))
    results = list(await asyncio.gather(*tasks))[warmup:]
    await client.close()
    return results, _window(results)


def _window(results: list[RequestResult]) -> float:
    """Seconds from the first measured request's start to the last one's end (0 if none)."""
    return max(r.end for r in results) - min(r.start for r in results) if results else 0.0


def summarize(results: list[RequestResult], window: float) -> dict:
    import numpy as np

    tpots = np.array([r.tpot for r in results if r.tpot is not None])
    ttfts = np.array([r.ttft for r in results])
    tokens = sum(r.tokens for r in results)
    return {
        "requests": len(results), "tokens": tokens, "seconds": window,
        "throughput_tok_s": tokens / window if window else 0.0,
        "per_user_tok_s": float(1.0 / tpots.mean()) if len(tpots) else None,
        "tpot_p50_ms": float(np.percentile(tpots, 50) * 1e3) if len(tpots) else None,
        "tpot_p99_ms": float(np.percentile(tpots, 99) * 1e3) if len(tpots) else None,
        "ttft_p50_ms": float(np.percentile(ttfts, 50) * 1e3) if len(ttfts) else None,
        "ttft_p99_ms": float(np.percentile(ttfts, 99) * 1e3) if len(ttfts) else None,
    }
