"""Micro-benchmark of one transition-head step: fused Triton kernel vs the unfused torch sequence.

  python -m benchmarks.bench_kernels [--quick] [--out benchmarks/results/kernels] [--threads N]
  (or python benchmarks/bench_kernels.py ...)

unfused    bias = w1[prev] @ w2.T; logits = U + bias; softmax(logits / t); argmax / multinomial
reference  kernels.reference.transition_step_ref (the dispatcher's torch path)
fused      kernels.transition.transition_step_triton (token, logprob, lse), CUDA only
fused+p    the same with want_probs (a second pass writes the [B, V] probabilities)
topk-k     torch.topk of U, then the top-k kernel (kernels.topk) on the k candidates; large V only
block      a whole draft block's K = 7 sequential steps as dspark_vllm.sequential runs them (the
           dispatcher's argmax / step-with-probabilities per slot, then the draft-to-target id
           map), against the same loop written with the unfused torch sequence; at the bundled
           drafter's shapes (8192-token draft vocabulary, r = 64, bf16) and a Qwen3-sized one;
           on CUDA also through dspark_vllm.block_graph.BlockGraphs as sample_block runs it
           there (inputs copied into a captured graph, one replay, outputs cloned out)
On CUDA the device's copy bandwidth (a large device-to-device copy, read + write bytes) is
measured and each fused kernel's effective bandwidth -- bytes of W2 + U read once plus the
outputs written, per second -- is reported as a fraction of it.  Each CUDA timing is also taken as a
CUDA-graph replay (`*_graph_ms`: the GPU's own time, without Python and launch overhead, which
dominate these microsecond kernels when launched eagerly).  On CPU only the torch paths
are timed.  Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
import kernels  # noqa: E402
from kernels import reference  # noqa: E402

FULL = dict(batch=(1, 8, 32, 128), vocab=(49152, 151936), rank=(64, 256),
            dtype=(torch.float32, torch.bfloat16))
QUICK = dict(batch=(1, 8), vocab=(4096,), rank=(64,), dtype=(torch.float32, torch.bfloat16))
MODES = {"greedy": 0.0, "sample": 1.0}
TOPK = (64, 256)  # candidates per row for the top-k path (rows with V >= TOPK_MIN_V only)
TOPK_MIN_V = 100_000
BLOCK_K = 7  # the bundled drafter's block size
# (name, draft vocab Vd, target vocab Vt, rank r, dtype) of the block loop
BLOCK_SHAPES = (("bundled", 8192, 49152, 64, torch.bfloat16),
                ("qwen3-size", 151936, 151936, 256, torch.bfloat16))
BLOCK_BATCH = (1, 8, 32, 128)
COPY_BYTES = 1 << 30  # 1 GiB source: far beyond L2, so the copy runs at HBM speed
CPU_MIN_SECONDS = 0.2  # time each CPU path for at least this long (and >= 3 calls)
DTYPE_NAME = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def unfused(u, prev, w1, w2, temperature: float, gen):
    """The plain torch sequence a proposer would write without the fused kernel."""
    bias = w1[prev] @ w2.t()  # [B, V] in the weights' dtype
    logits = u + bias
    probs = torch.softmax(logits.float() / (temperature or 1.0), -1)
    if temperature > 0:
        return torch.multinomial(probs, 1, generator=gen).squeeze(1), probs
    return probs.argmax(-1), probs


def time_cpu(fn) -> float:
    fn()  # warm-up
    times, start = [], time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < CPU_MIN_SECONDS:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def time_cuda(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


_graph_failures: dict[str, str] = {}


def timer_for(device: str):
    return time_cuda if device == "cuda" else time_cpu


def time_graph(name: str, fn) -> float | None:
    """Median ms per call replayed from a CUDA graph; None (reason kept, printed once) when
    the call cannot be captured."""
    import triton.testing

    try:
        return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median")
    except Exception as e:  # noqa: BLE001 - a path that cannot be captured is reported, not fatal
        torch.cuda.synchronize()
        if name not in _graph_failures:
            _graph_failures[name] = f"{type(e).__name__}: {e}"[:300]
            print(f"# {name}: no CUDA-graph timing ({_graph_failures[name]})", flush=True)
        return None


def copy_bandwidth() -> float:
    """GB/s of a device-to-device copy (bytes read + bytes written)."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src))
    return 2 * COPY_BYTES / ms / 1e6


def inputs(b, v, r, dtype, device):
    gen = torch.Generator(device=device).manual_seed(0)  # generated where they are used

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    return dict(base_logits=randn(b, v), w1=randn(v, r, scale=0.1), w2=randn(v, r, scale=0.1),
                prev_ids=torch.randint(0, v, (b,), generator=gen, device=device),
                seed=torch.arange(b, device=device),
                position=torch.full((b,), 7, dtype=torch.long, device=device))


def bench_config(b, v, r, dtype, device, copy_gbps):
    """One row per mode for a [b, v] step of rank r."""
    x = inputs(b, v, r, dtype, device)
    timer = timer_for(device)
    rows = []
    for mode, temperature in MODES.items():
        x["temperature"] = torch.full((b,), temperature, device=device)
        sample_gen = torch.Generator(device=device).manual_seed(0)
        row = dict(dtype=DTYPE_NAME[dtype], r=r, V=v, B=b, mode=mode)
        row["unfused_ms"] = timer(lambda: unfused(x["base_logits"], x["prev_ids"], x["w1"],
                                                  x["w2"], temperature, sample_gen))
        row["reference_ms"] = timer(lambda: reference.transition_step_ref(**x))
        if device == "cuda":
            row["unfused_graph_ms"] = time_graph(
                "unfused " + mode, lambda: unfused(x["base_logits"], x["prev_ids"], x["w1"],
                                                   x["w2"], temperature, sample_gen))
            row.update(bench_fused(x, copy_gbps))
        rows.append(row)
    return rows


def bench_fused(x, copy_gbps):
    from kernels.transition import plan, transition_step_triton

    b, v = x["base_logits"].shape
    cfg = plan(b, v, x["w1"].shape[1], x["w1"].element_size(), x["w1"].device)
    row = dict(plan=dict(block_b=cfg.block_b, block_v=cfg.block_v, splits=cfg.num_splits))
    probs = torch.empty(b, v, device=x["w1"].device)
    row["fused_ms"] = time_cuda(lambda: transition_step_triton(**x))
    row["fused_graph_ms"] = time_graph("fused", lambda: transition_step_triton(**x))
    row["fused_probs_ms"] = time_cuda(lambda: transition_step_triton(**x, want_probs=True,
                                                                     out_probs=probs))
    read = sum(x[k].numel() * x[k].element_size() for k in ("w2", "base_logits"))
    written = b * (8 + 4 + 4)  # token, logprob, lse
    for key, extra in (("fused", 0), ("fused_probs", probs.numel() * 4)):
        gbps = (read + written + extra) / row[f"{key}_ms"] / 1e6
        row[f"{key}_GBps"] = gbps
        row[f"{key}_of_copy"] = gbps / copy_gbps
    if v >= TOPK_MIN_V:
        from kernels.topk import transition_step_topk_triton

        rest = {k: x[k] for k in ("prev_ids", "w1", "w2", "temperature", "seed", "position")}
        for k in TOPK:
            row[f"topk{k}_ms"] = time_cuda(
                lambda: transition_step_topk_triton(*torch.topk(x["base_logits"], k), **rest))
    got, want = transition_step_triton(**x), reference.transition_step_ref(**x)
    row["tokens_agree"] = float((got[0] == want[0]).float().mean())  # same stream: expect 1.0
    row["lse_max_err"] = float((got[2] - want[2]).abs().max())
    return row


def block_inputs(b, vd, vt, r, dtype, device):
    gen = torch.Generator(device=device).manual_seed(0)
    base = torch.randn(b, BLOCK_K, vd, generator=gen, device=device).to(dtype)  # [B, K, Vd]
    d2t = torch.randint(0, vt - vd + 1, (vd,), generator=gen, device=device)  # draft id offset
    return dict(base=base, anchor=torch.randint(0, vt, (b,), generator=gen, device=device),
                w1=(torch.randn(vt, r, generator=gen, device=device) * 0.1).to(dtype),
                w2=(torch.randn(vd, r, generator=gen, device=device) * 0.1).to(dtype),
                d2t=d2t, temperature=torch.ones(b, device=device),
                seed=torch.arange(b, device=device),
                positions=torch.arange(BLOCK_K, device=device)[:, None].repeat(1, b))  # [K, B]


def block_loop(x, fused: bool, greedy: bool, gen):
    """K sequential transition steps -> [B, K] target ids; fused: the dispatcher's calls."""
    prev, out = x["anchor"], []
    for i in range(BLOCK_K):
        u = x["base"][:, i]
        if not fused:
            d = unfused(u, prev, x["w1"], x["w2"], 0.0 if greedy else 1.0, gen)[0]
        elif greedy:
            d = kernels.transition_argmax(u, prev, x["w1"], x["w2"])
        else:
            d = kernels.transition_step(u, prev, x["w1"], x["w2"], x["temperature"], x["seed"],
                                        x["positions"][i], want_probs=True)[0]
        prev = d + x["d2t"][d]
        out.append(prev)
    return torch.stack(out, 1)


def graphed_block(x, greedy: bool, graphs):
    """block_loop(x, fused=True) through dspark_vllm.block_graph.BlockGraphs, as
    sequential.sample_block runs it on a GPU: inputs copied into a captured graph's static
    buffers, one replay, the outputs cloned out."""
    inputs = dict(base=x["base"], anchor=x["anchor"], temperature=x["temperature"],
                  seed=x["seed"], positions=x["positions"].t())  # batch-major, as captured

    def walk(positions, **rest):
        return (block_loop(dict(x, positions=positions.t().contiguous(), **rest), True, greedy,
                           None),)

    return graphs.run(("bench", greedy, x["w1"].data_ptr()), inputs, walk)[0]


def bench_blocks(device):
    from dspark_vllm.block_graph import BlockGraphs

    timer, graphs = timer_for(device), BlockGraphs()
    for name, vd, vt, r, dtype in BLOCK_SHAPES:
        for b in BLOCK_BATCH:
            x = block_inputs(b, vd, vt, r, dtype, device)
            gen = torch.Generator(device=device).manual_seed(0)
            for mode in MODES:
                greedy = mode == "greedy"
                row = dict(shape=name, dtype=DTYPE_NAME[dtype], r=r, Vd=vd, B=b, mode=mode,
                           K=BLOCK_K)
                row["unfused_ms"] = timer(lambda: block_loop(x, False, greedy, gen))
                row["dispatch_ms"] = timer(lambda: block_loop(x, True, greedy, gen))
                if device == "cuda":
                    row["unfused_graph_ms"] = time_graph(
                        "block unfused " + mode, lambda: block_loop(x, False, greedy, gen))
                    row["dispatch_graph_ms"] = time_graph(
                        "block dispatch " + mode, lambda: block_loop(x, True, greedy, gen))
                    row["graphs_ms"] = timer(lambda: graphed_block(x, greedy, graphs))
                    row["graphs_agree"] = float((graphed_block(x, greedy, graphs) ==
                                                 block_loop(x, True, greedy, gen)).float().mean())
                if greedy:  # same tokens from both loops (argmax: no random stream involved)
                    row["tokens_agree"] = float((block_loop(x, False, True, gen) ==
                                                 block_loop(x, True, True, gen)).float().mean())
                yield row
            if device == "cuda":
                torch.cuda.empty_cache()


def host_us(fn, n: int = 2000) -> tuple[float, float]:
    """(µs per call to issue, µs per call until the GPU is done) over n back-to-back calls:
    when the two agree the path is bound by its Python and launch overhead, not the GPU."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6


def bench_host(device):
    """Per-step host cost of each path at the bundled drafter's shape (CUDA only)."""
    from kernels.transition import transition_step_triton

    name, vd, vt, r, dtype = BLOCK_SHAPES[0]
    for b in (1, 32):
        x = block_inputs(b, vd, vt, r, dtype, device)
        u, prev, w1, w2 = x["base"][:, 0], x["anchor"], x["w1"], x["w2"]
        t, seed, pos = x["temperature"], x["seed"], x["positions"][0]
        zf, zi = torch.zeros(b, device=device), torch.zeros(b, dtype=torch.long, device=device)
        gen = torch.Generator(device=device).manual_seed(0)
        paths = {
            "unfused greedy": lambda: unfused(u, prev, w1, w2, 0.0, gen),
            "kernels.transition_argmax": lambda: kernels.transition_argmax(u, prev, w1, w2),
            "wrapper greedy, one launch": lambda: transition_step_triton(
                u, prev, w1, w2, zf, zi, zi, fused_combine=True),
            "wrapper greedy, two launches": lambda: transition_step_triton(
                u, prev, w1, w2, zf, zi, zi, fused_combine=False),
            "unfused sample": lambda: unfused(u, prev, w1, w2, 1.0, gen),
            "kernels.transition_step (probs)": lambda: kernels.transition_step(
                u, prev, w1, w2, t, seed, pos, want_probs=True),
            "block loop greedy (7 steps)": lambda: block_loop(x, True, True, gen),
            "block loop unfused greedy (7 steps)": lambda: block_loop(x, False, True, gen),
        }
        for path, fn in paths.items():
            issue, done = host_us(fn, 300 if "block" in path else 2000)
            graph = time_graph(path, fn) if path.startswith("wrapper") else None
            yield dict(shape=name, B=b, path=path, issue_us=issue, done_us=done,
                       graph_us=None if graph is None else graph * 1e3)


def markdown(report) -> str:
    gpu = report["copy_GBps"] is not None
    head = ["dtype", "r", "V", "B", "mode", "unfused ms", "reference ms"]
    if gpu:
        head += ["fused ms", "fused+p ms", "speed-up", "fused GB/s", "of copy BW",
                 "fused+p of copy BW", "graph: unfused ms", "graph: fused ms", "graph speed-up"]
    lines = [f"# Transition-step kernels on {report['device']}", ""]
    if gpu:
        lines += [f"Device copy bandwidth: {report['copy_GBps']:.0f} GB/s "
                  "(device-to-device copy, read + write).", ""]
    else:
        lines += ["CPU run: only the torch paths are timed; the Triton timings need a GPU "
                  "(run benchmarks/gpu_kernels.sh on a CUDA machine).", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report["rows"]:
        cells = [row["dtype"], row["r"], row["V"], row["B"], row["mode"],
                 f"{row['unfused_ms']:.3f}", f"{row['reference_ms']:.3f}"]
        if gpu:
            cells += [f"{row['fused_ms']:.3f}", f"{row['fused_probs_ms']:.3f}",
                      f"{row['unfused_ms'] / row['fused_ms']:.1f}x",
                      f"{row['fused_GBps']:.0f}", f"{row['fused_of_copy']:.0%}",
                      f"{row['fused_probs_of_copy']:.0%}", _ms(row.get("unfused_graph_ms")),
                      _ms(row.get("fused_graph_ms")),
                      _ratio(row.get("unfused_graph_ms"), row.get("fused_graph_ms"))]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    topk = [row for row in report["rows"] if "topk64_ms" in row]
    if topk:
        lines += ["", "Top-k path (torch.topk + kernels.topk) beside the dense fused step:", "",
                  "| dtype | r | V | B | mode | fused ms | " +
                  " | ".join(f"topk-{k} ms" for k in TOPK) + " |",
                  "|" + "---|" * (6 + len(TOPK))]
        for row in topk:
            lines.append(f"| {row['dtype']} | {row['r']} | {row['V']} | {row['B']} | "
                         f"{row['mode']} | {row['fused_ms']:.3f} | " +
                         " | ".join(f"{row[f'topk{k}_ms']:.3f}" for k in TOPK) + " |")
    if report.get("blocks"):
        lines += ["", f"A draft block's {BLOCK_K} sequential steps (sampled: with the [B, V] "
                  "probabilities the rejection sampler reads):", "",
                  "| shape | dtype | r | Vd | B | mode | unfused ms | dispatch ms | speed-up | "
                  "graph: unfused ms | graph: dispatch ms | graph speed-up | BlockGraphs ms | "
                  "BlockGraphs vs dispatch |",
                  "|" + "---|" * 14]
        for row in report["blocks"]:
            lines.append(f"| {row['shape']} | {row['dtype']} | {row['r']} | {row['Vd']} | "
                         f"{row['B']} | {row['mode']} | {row['unfused_ms']:.3f} | "
                         f"{row['dispatch_ms']:.3f} | "
                         f"{row['unfused_ms'] / row['dispatch_ms']:.1f}x | "
                         f"{_ms(row.get('unfused_graph_ms'))} | "
                         f"{_ms(row.get('dispatch_graph_ms'))} | "
                         f"{_ratio(row.get('unfused_graph_ms'), row.get('dispatch_graph_ms'))} | "
                         f"{_ms(row.get('graphs_ms'))} | "
                         f"{_ratio(row['dispatch_ms'], row.get('graphs_ms'))} |")
    if report.get("host"):
        lines += ["", "Host cost per call, eager, back-to-back (issue = the Python and launch "
                  "work; done = until the GPU finished):", "",
                  "| shape | B | path | issue µs | done µs | CUDA graph µs |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {h['shape']} | {h['B']} | {h['path']} | {h['issue_us']:.1f} | "
                  f"{h['done_us']:.1f} | "
                  f"{'-' if h.get('graph_us') is None else format(h['graph_us'], '.1f')} |"
                  for h in report["host"]]
    if report.get("graph_failures"):
        lines += ["", "Not captured in a CUDA graph (eager timings only):", ""]
        lines += [f"- {k}: {v}" for k, v in report["graph_failures"].items()]
    return "\n".join(lines) + "\n"


def _ms(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _ratio(a, b) -> str:
    return "-" if a is None or b is None else f"{a / b:.1f}x"


def save(report, out: Path) -> None:
    """<out>.json and <out>.md, rewritten after every configuration (a cut-off run keeps
    what it measured)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps(report, indent=1) + "\n")
    out.with_name(out.name + ".md").write_text(markdown(report))


def step_rows(grid, device, copy_gbps):
    for dtype in grid["dtype"]:
        for r in grid["rank"]:
            for v in grid["vocab"]:
                for b in grid["batch"]:
                    yield from bench_config(b, v, r, dtype, device, copy_gbps)
                    if device == "cuda":
                        torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, < 1 min)")
    ap.add_argument("--out", default="benchmarks/results/kernels",
                    help="output path without suffix: writes <out>.json and <out>.md")
    ap.add_argument("--device", choices=("cuda", "cpu"),
                    default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-blocks", action="store_true", help="skip the draft-block loops")
    ap.add_argument("--no-steps", action="store_true", help="skip the single-step grid")
    ap.add_argument("--host", action="store_true",
                    help="CUDA: first measure each path's per-call host (Python + launch) cost")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: torch's; use 1 on a busy host)")
    args = ap.parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device here; use --device cpu")
    if args.host and device != "cuda":
        ap.error("--host times CUDA launches: it needs --device cuda")
    if args.threads:
        torch.set_num_threads(args.threads)
    grid = QUICK if args.quick else FULL
    if device == "cuda":
        name = torch.cuda.get_device_name()
        copy_gbps = copy_bandwidth()
    else:
        cpu = platform.processor() or platform.machine()
        name = f"CPU ({cpu}, {torch.get_num_threads()} threads)"
        copy_gbps = None
    report = dict(device=name, torch=torch.__version__, quick=args.quick, copy_GBps=copy_gbps,
                  rows=[], blocks=[], host=[], graph_failures=_graph_failures)
    out = Path(args.out)
    out = out.with_suffix("") if out.suffix in (".json", ".md") else out
    parts = (("host", args.host, lambda: bench_host(device)),
             ("rows", not args.no_steps, lambda: step_rows(grid, device, copy_gbps)),
             ("blocks", not (args.no_blocks or args.quick), lambda: bench_blocks(device)))
    for key, wanted, rows in parts:
        for row in rows() if wanted else ():
            report[key].append(row)
            print(json.dumps(row), flush=True)
            save(report, out)  # a cut-off run keeps every row it measured
    save(report, out)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
