"""The one-time cost of replaying draft blocks from CUDA graphs (dspark_vllm/block_graph.py).

  python -m benchmarks.block_graph_cost [--out benchmarks/results/block_graph_cost]   (CUDA only)

For each block shape of bench_kernels (the bundled drafter's, a Qwen3-sized one), each mode
(greedy; sampled with the [B, Vt] probabilities) and each padded batch size BlockGraphs
captures, the first call (a warm-up on a side stream, then the capture) is timed against a
later replay, and the GPU memory the captured graph keeps (its static inputs and outputs,
and its pool's reserve) is read from torch's allocator. BlockGraphs captures lazily, after
vLLM has sized its KV cache, so this memory comes out of the headroom that
--gpu-memory-utilization leaves. The first call at a new kernel shape also compiles its Triton
kernels, inside first_call_ms; later processes read them from Triton's disk cache.
Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from benchmarks.bench_kernels import BLOCK_SHAPES, block_inputs, graphed_block  # noqa: E402
from dspark_vllm.block_graph import BUCKETS, BlockGraphs  # noqa: E402

MiB = 2 ** 20


def _timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def shape_rows(name, vd, vt, r, dtype):
    """One row per (mode, bucket) for one block shape, graphs captured in order."""
    graphs = BlockGraphs()
    torch.cuda.empty_cache()
    start_alloc, start_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    for greedy in (True, False):
        for n in BUCKETS:
            x = block_inputs(n, vd, vt, r, dtype, "cuda")
            alloc, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
            first = _timed(lambda: graphed_block(x, greedy, graphs))  # result freed at once
            replay = _timed(lambda: graphed_block(x, greedy, graphs))
            yield dict(shape=name, Vd=vd, Vt=vt, r=r, mode="greedy" if greedy else "sample",
                       B=n, first_call_ms=first, replay_ms=replay,
                       graph_alloc_MiB=(torch.cuda.memory_allocated() - alloc) / MiB,
                       graph_reserved_MiB=(torch.cuda.memory_reserved() - reserved) / MiB,
                       all_graphs_alloc_MiB=(torch.cuda.memory_allocated() - start_alloc) / MiB,
                       all_graphs_reserved_MiB=(torch.cuda.memory_reserved() - start_reserved)
                       / MiB, replays=graphs.replays)
            del x


def markdown(report) -> str:
    lines = [f"# One-time cost of CUDA-graph blocks on {report['device']}", "",
             "First call = warm-up + capture (+ Triton compiles at a new shape); the graph's "
             "memory as torch's allocator reads it after the call.", "",
             "| shape | mode | B | first call ms | replay ms | graph MiB (allocated) | "
             "graph MiB (reserved) | all graphs so far, MiB reserved |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['shape']} | {r['mode']} | {r['B']} | {r['first_call_ms']:.1f} | "
              f"{r['replay_ms']:.3f} | {r['graph_alloc_MiB']:.1f} | "
              f"{r['graph_reserved_MiB']:.1f} | {r['all_graphs_reserved_MiB']:.1f} |"
              for r in report["rows"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/block_graph_cost",
                    help="output path without suffix: writes <out>.json and <out>.md")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("CUDA graphs need a CUDA device, and torch sees none here "
                 "(on a CPU the block always runs eagerly: nothing to measure)")
    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=[])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for shape in BLOCK_SHAPES:
        for row in shape_rows(*shape):
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
            out.with_name(out.name + ".json").write_text(json.dumps(report, indent=1) + "\n")
        torch.cuda.empty_cache()
    out.with_name(out.name + ".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
