"""Start and stop a real `vllm serve` on 127.0.0.1 (demo, benchmarks and tests share it)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from .metrics import METRICS_ENV

BUNDLED_DRAFTER = Path(__file__).parent / "drafters" / "smollm2-135m-dspark"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_command() -> list[str]:
    """The user's `vllm` command from this environment (dspark-vllm's working shim)."""
    exe = Path(sys.executable).parent / "vllm"
    if exe.is_file():
        return [str(exe)]
    return [sys.executable, "-c", "from dspark_vllm.patches.cli_version import main; main()"]


class VllmServer:
    """`vllm serve TARGET ...` as a subprocess; a context manager that always cleans up."""

    def __init__(self, target: str, *, spec: dict | None = None, args: list[str] = (),
                 env: dict | None = None, log_path: str | Path | None = None,
                 port: int | None = None, dtype: str = "float32", max_model_len: int = 2048,
                 kv_cache_gb: int = 2, enforce_eager: bool = True) -> None:
        self.port = port or free_port()
        self.cmd = vllm_command() + [
            "serve", str(target), "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", dtype, "--max-model-len", str(max_model_len), "--seed", "0",
            "--served-model-name", "target", *(["--enforce-eager"] if enforce_eager else []),
            *args]
        if spec is not None:
            self.cmd += ["--speculative-config", json.dumps(spec)]
        # Each server its own DSpark stats snapshot: a path inherited from this process
        # (set once an in-process engine has run here) would be shared by every server.
        stats = Path(tempfile.mkdtemp(prefix="dspark-metrics-")) / "stats.json"
        self.env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gb),
                    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", METRICS_ENV: str(stats), **(env or {})}
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> VllmServer:
        """Start the process without waiting for it (see `serving`)."""
        out = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_ready(self, timeout: float = 900) -> VllmServer:
        """Poll /health until it answers 200; a process that exits, or a timeout, raises
        with the log's tail."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode} at start-up"
                                   + self._log_tail())
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"vllm serve not healthy after {timeout}s" + self._log_tail())

    def start(self, timeout: float = 900) -> VllmServer:
        return self.launch().wait_ready(timeout)

    def _log_tail(self, n: int = 4000) -> str:
        if self.log_path and self.log_path.is_file():
            return "\n--- server log tail ---\n" + self.log_path.read_text()[-n:]
        return ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def status(self) -> dict | None:
        """The DSpark status view (/dspark/status), None where the server has none."""
        try:
            with urllib.request.urlopen(self.url + "/dspark/status", timeout=10) as r:
                return json.loads(r.read().decode())
        except (OSError, ValueError):
            return None

    def metrics(self) -> dict[str, float]:
        """Prometheus text from /metrics as {name{labels}: value}."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            m = re.match(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?)\s+([-+.\deEinfNa]+)$", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def serving(*servers: VllmServer, timeout: float = 900):
    """Start several servers side by side and stop them all however the block ends. A
    server's start-up is mostly one busy thread (imports, weight loading, the KV cache's
    allocation): the engine tests' two servers took 85 s side by side on 2 cores, 136 s
    one after the other (clean-clone suite runs, 2026-12-02)."""
    try:
        for s in servers:
            s.launch()
        for s in servers:
            s.wait_ready(timeout)
        yield servers
    finally:
        for s in servers:
            s.stop()


def metric_sum(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counter increments between two scrapes (a window's own counts)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def acceptance_length(metrics: dict[str, float]) -> float | None:
    """Mean tokens per verification round (bonus included) from vLLM's spec-decode counters."""
    drafts = metric_sum(metrics, "vllm:spec_decode_num_drafts_total")
    accepted = metric_sum(metrics, "vllm:spec_decode_num_accepted_tokens_total")
    return None if drafts == 0 else 1.0 + accepted / drafts
