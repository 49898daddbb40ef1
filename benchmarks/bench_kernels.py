"""Micro-benchmark of one transition-head step: fused Triton kernel vs the unfused torch sequence.

  python -m benchmarks.bench_kernels [--quick] [--out benchmarks/results/kernels] [--threads N]
  (or python benchmarks/bench_kernels.py ...)

unfused    bias = w1[prev] @ w2.T; logits = U + bias; softmax(logits / t); argmax / multinomial
reference  kernels.reference.transition_step_ref (the dispatcher's torch path)
fused      kernels.transition.transition_step_triton (token, logprob, lse), CUDA only
fused+p    the same with want_probs (a second pass writes the [B, V] probabilities)
On CUDA the device's copy bandwidth (a large device-to-device copy, read + write bytes) is
measured and each fused kernel's effective bandwidth -- bytes of W2 + U read once plus the
outputs written, per second -- is reported as a fraction of it.  On CPU only the torch paths
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
from kernels import reference  # noqa: E402

FULL = dict(batch=(1, 8, 32, 128), vocab=(49152, 151936), rank=(64, 256),
            dtype=(torch.float32, torch.bfloat16))
QUICK = dict(batch=(1, 8), vocab=(4096,), rank=(64,), dtype=(torch.float32, torch.bfloat16))
MODES = {"greedy": 0.0, "sample": 1.0}
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
    timer = time_cuda if device == "cuda" else time_cpu
    rows = []
    for mode, temperature in MODES.items():
        x["temperature"] = torch.full((b,), temperature, device=device)
        sample_gen = torch.Generator(device=device).manual_seed(0)
        row = dict(dtype=DTYPE_NAME[dtype], r=r, V=v, B=b, mode=mode)
        row["unfused_ms"] = timer(lambda: unfused(x["base_logits"], x["prev_ids"], x["w1"],
                                                  x["w2"], temperature, sample_gen))
        row["reference_ms"] = timer(lambda: reference.transition_step_ref(**x))
        if device == "cuda":
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
    row["fused_probs_ms"] = time_cuda(lambda: transition_step_triton(**x, want_probs=True,
                                                                     out_probs=probs))
    read = sum(x[k].numel() * x[k].element_size() for k in ("w2", "base_logits"))
    written = b * (8 + 4 + 4)  # token, logprob, lse
    for key, extra in (("fused", 0), ("fused_probs", probs.numel() * 4)):
        gbps = (read + written + extra) / row[f"{key}_ms"] / 1e6
        row[f"{key}_GBps"] = gbps
        row[f"{key}_of_copy"] = gbps / copy_gbps
    got, want = transition_step_triton(**x), reference.transition_step_ref(**x)
    row["tokens_agree"] = float((got[0] == want[0]).float().mean())  # same stream: expect 1.0
    row["lse_max_err"] = float((got[2] - want[2]).abs().max())
    return row


def markdown(report) -> str:
    gpu = report["copy_GBps"] is not None
    head = ["dtype", "r", "V", "B", "mode", "unfused ms", "reference ms"]
    if gpu:
        head += ["fused ms", "fused+p ms", "speed-up", "fused GB/s", "of copy BW",
                 "fused+p of copy BW"]
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
                      f"{row['fused_probs_of_copy']:.0%}"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, < 1 min)")
    ap.add_argument("--out", default="benchmarks/results/kernels",
                    help="output path without suffix: writes <out>.json and <out>.md")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: torch's; use 1 on a busy host)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    grid = QUICK if args.quick else FULL
    device = args.device
    if device == "cuda":
        name = torch.cuda.get_device_name()
        copy_gbps = copy_bandwidth()
    else:
        cpu = platform.processor() or platform.machine()
        name = f"CPU ({cpu}, {torch.get_num_threads()} threads)"
        copy_gbps = None
    report = dict(device=name, torch=torch.__version__, quick=args.quick, copy_GBps=copy_gbps,
                  rows=[])
    for dtype in grid["dtype"]:
        for r in grid["rank"]:
            for v in grid["vocab"]:
                for b in grid["batch"]:
                    for row in bench_config(b, v, r, dtype, device, copy_gbps):
                        report["rows"].append(row)
                        print(json.dumps(row), flush=True)
                    if device == "cuda":
                        torch.cuda.empty_cache()
    out = Path(args.out)
    out = out.with_suffix("") if out.suffix in (".json", ".md") else out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps(report, indent=1) + "\n")
    table = markdown(report)
    out.with_name(out.name + ".md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
