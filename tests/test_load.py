"""The sweep's load generators (closed loop, open-loop Poisson) against a small fake
OpenAI-compatible streaming server on 127.0.0.1: no model, so the arrival and warm-up rules
are checked exactly and fast."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time

import pytest
from fastapi import FastAPI, Request  # module level: FastAPI resolves the handler's annotation here
from fastapi.responses import StreamingResponse

from benchmarks.load import RequestResult, closed_loop, full_concurrency_throughput, open_loop

TOKEN_SECONDS = 0.002


def _chunk(**fields) -> str:
    return "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0,
                                  "model": "target", **fields}) + "\n\n"


@pytest.fixture(scope="module")
def fake_server():
    """-> (base url, list of (arrival time, prompt text) in arrival order)."""
    import uvicorn

    app, seen = FastAPI(), []

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        seen.append((time.perf_counter(), body["messages"][-1]["content"]))
        n = int(body["messages"][-1]["content"][1:]) + 1  # prompt "p<i>" gets i + 1 tokens

        async def events():
            for i in range(n):
                await asyncio.sleep(TOKEN_SECONDS)
                yield _chunk(choices=[{"index": 0, "delta": {"content": f" t{i}"},
                                       "finish_reason": None}])
            yield _chunk(choices=[], usage={"prompt_tokens": 1, "completion_tokens": n,
                                            "total_tokens": n + 1})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.01)
    assert server.started, "the fake server did not start"
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", seen
    server.should_exit = True
    thread.join(10)


PROMPTS = [[{"role": "user", "content": f"p{i}"}] for i in range(12)]


def test_open_loop_measures_only_after_its_warmup_at_poisson_gaps(fake_server):
    url, seen = fake_server
    seen.clear()
    rate, seed = 40.0, 3
    results, window = asyncio.run(open_loop(url, PROMPTS, rate, num_requests=5, max_tokens=64,
                                            seed=seed, warmup=3))
    # All 8 were sent (two close arrivals may reach the server in either order); only the
    # last 5 (p3..p7: 4..8 tokens), in arrival order, are measured.
    assert sorted(p for _, p in seen) == [f"p{i}" for i in range(8)]
    assert [r.tokens for r in results] == [4, 5, 6, 7, 8]
    assert window == pytest.approx(max(r.end for r in results) - min(r.start for r in results))
    # Each arrival waits its exponential gap after the one before (the seeded stream the
    # generator draws from), whatever the server's service time.
    rng = random.Random(seed)
    gaps = [rng.expovariate(rate) for _ in range(8)]
    starts = [r.start for r in results]
    assert starts == sorted(starts)
    assert starts[-1] - starts[0] >= sum(gaps[3:7]) - 0.005


def test_open_loop_stops_arriving_at_its_time_bound(fake_server):
    url, seen = fake_server
    seen.clear()
    t0 = time.perf_counter()
    results, _ = asyncio.run(open_loop(url, PROMPTS, 5.0, num_requests=1000, max_tokens=2,
                                       max_seconds=0.5))
    assert 1 <= len(results) < 1000 and len(seen) == len(results)
    assert max(t for t, _ in seen) - t0 < 0.5 + 0.1  # nothing sent after the bound


def test_a_rate_that_is_not_positive_is_refused_by_name(capsys, tmp_path):
    from benchmarks.serving_sweep import main

    with pytest.raises(ValueError, match=r"open-loop rate 0\.0: use a positive number"):
        asyncio.run(open_loop("http://127.0.0.1:9", PROMPTS, 0.0, 1, 1))
    with pytest.raises(SystemExit):  # refused before any server starts
        main(["--poisson", "-1", "--out", str(tmp_path / "never-written")])
    assert not (tmp_path / "never-written").exists()
    assert "--poisson -1.0: use a positive arrival rate" in capsys.readouterr().err


def test_closed_loop_keeps_its_users_busy_and_drops_the_warmup(fake_server):
    url, seen = fake_server
    seen.clear()
    results, _, full = asyncio.run(closed_loop(url, PROMPTS, concurrency=2, num_requests=4,
                                               max_tokens=3, warmup=2))
    assert full is not None and full > 0
    assert sorted(p for _, p in seen) == [f"p{i}" for i in range(6)]  # two users race
    assert sorted(r.tokens for r in results) == [3, 4, 5, 6]  # p2..p5: the warm-up is p0, p1
    assert all(r.tpot is not None for r in results)
    # Two users: never more than two requests in flight.
    spans = sorted((r.start, r.end) for r in results)
    for t, _ in spans:
        assert sum(s <= t < e for s, e in spans) <= 2


def test_full_concurrency_throughput_stops_where_the_users_run_out_of_requests():
    # Two users. A streams 11 tokens (first at 1 s, then one a second to 11 s); B 6 (to
    # 6 s); C, B's successor and the last request sent, starts at 6 s, first token at 7 s,
    # then 5 more evenly to 12 s. Load is full until A ends at 11 s, the first end after
    # the last start: A's 11 + B's 6 + C's 1 + 5 x 4/5 = 22 tokens in 11 s.
    a, b, c = RequestResult(0, 1, 11, 11), RequestResult(0, 1, 6, 6), RequestResult(6, 1, 12, 6)
    assert full_concurrency_throughput([a, b, c], since=0.0) == pytest.approx(22 / 11)
    # Measured from B's successor on (the first measured request): 6..11 s.
    assert full_concurrency_throughput([a, b, c], since=6.0) == pytest.approx((5 + 1 + 4) / 5)
    # The drain does not count: C ending later (a straggler) leaves the reading as it was.
    late = RequestResult(6, 1, 22, 6)
    assert full_concurrency_throughput([a, b, late], since=0.0) == pytest.approx(
        (11 + 6 + 1 + 5 * 4 / 15) / 11)
    assert full_concurrency_throughput([], since=0.0) is None
    assert full_concurrency_throughput([RequestResult(0, 1, 5, 5)], since=5.0) is None
