"""CUDA graphs of the sequential stage: one capture per padded batch size and block mode.

Why: on a GPU each of a block's K transition steps is microseconds of GPU work behind tens
to hundreds of microseconds of Python and kernel launches. At the bundled drafter's shape a
7-step block took 0.68-2.05 ms eagerly on an H100 and 0.11-0.21 ms through this class, copies
included (B = 1-128; README, "The block replayed from CUDA graphs"). vLLM replays its models
from graphs for the same reason; this does it for the walk that follows the drafter's forward.

What is captured: a pure tensor function of batch-major inputs (sequential._walk: the K
steps, the draft-to-target id map, the probabilities' scatter, the confidence block). Each
call copies its inputs into static buffers padded to the next bucket (padding rows hold
zeros: valid ids, greedy, position 0), replays, and returns the outputs' first B rows as
fresh tensors, so a later replay never overwrites what a caller still holds.

What is not: CPU tensors, a stream that is already capturing (an outer graph records the
eager walk as it is), batches above the largest bucket, and a walk whose capture failed
(logged once; eager from then on). vLLM's `enforce_eager` or DSPARK_BLOCK_GRAPHS=0 turns
it off (proposer.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

log = logging.getLogger(__name__)

# Padded batch sizes with a graph each. Beyond the largest, the eager walk runs: a block's
# host cost is fixed while its GPU work grows with B, so the graph matters least there.
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

Outputs = tuple[torch.Tensor | None, ...]


def bucket(b: int, buckets: tuple[int, ...] = BUCKETS) -> int | None:
    """The smallest bucket holding b rows, or None when b is above them all."""
    return next((n for n in buckets if n >= b), None)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]  # static [N, ...] buffers the graph reads
    outputs: Outputs  # static [N, ...] tensors the graph writes


class BlockGraphs:
    """Captures `fn(**inputs) -> Outputs` once per (key, bucket) and replays it.

    fn must be a pure function of its batch-major tensor inputs (and of weights that do not
    move), with no host synchronisation; key names everything else that shapes its work
    (block mode, vocabulary sizes, the weights' addresses)."""

    def __init__(self, buckets: tuple[int, ...] = BUCKETS) -> None:
        self.buckets = buckets
        self._graphs: dict[tuple, _Captured] = {}
        self._failed: set[tuple] = set()  # keys whose capture raised: eager for good
        self._pool = None  # one memory pool for all captures (they never replay at once)
        self.replays = 0  # how many calls ran from a graph (tests, metrics)

    def run(self, key: tuple, inputs: dict[str, torch.Tensor],
            fn: Callable[..., Outputs]) -> Outputs:
        """fn(**inputs), replayed from a graph where it can be (same values), else eagerly."""
        x = next(iter(inputs.values()))
        b = x.shape[0]
        n = bucket(b, self.buckets)
        if (n is None or not x.is_cuda or key in self._failed
                or torch.cuda.is_current_stream_capturing()):
            return fn(**inputs)
        entry = self._graphs.get((key, n))
        if entry is None:
            try:
                entry = self._graphs[(key, n)] = self._capture(n, inputs, fn)
            except Exception as e:  # noqa: BLE001 - a walk that cannot be captured runs eagerly
                self._failed.add(key)
                log.warning("dspark: the sequential stage runs eagerly; capturing it in a "
                            "CUDA graph failed (%s: %s)", type(e).__name__, e)
                return fn(**inputs)
        for name, buf in entry.inputs.items():
            buf[:b].copy_(inputs[name])
            buf[b:].zero_()
        entry.graph.replay()
        self.replays += 1
        return tuple(None if o is None else o[:b].clone() for o in entry.outputs)

    def _capture(self, n: int, inputs: dict[str, torch.Tensor],
                 fn: Callable[..., Outputs]) -> _Captured:
        import kernels

        static = {name: x.new_zeros((n, *x.shape[1:])) for name, x in inputs.items()}
        # Warm up on a side stream first (PyTorch's rule for capture), launching as the
        # capture will: it compiles those kernels and fills the launch caches, so the
        # capture records launches only.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), kernels.launching_as_captured():
            fn(**static)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = fn(**static)
        return _Captured(graph, static, tuple(outputs))
