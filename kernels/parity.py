"""Parity of the Triton kernels with the torch references, on fresh random inputs:

  TRITON_INTERPRET=1 python -m kernels.parity --device cpu     # Triton interpreter, any host
  python -m kernels.parity --device cuda                       # natively on a GPU

Prints one JSON line per check ({"check", "ok", "detail"}) and exits 1 if any failed.
tests/test_kernels.py runs it in a fresh subprocess, because TRITON_INTERPRET must be set
before the kernels are defined and an imported vLLM may have replaced `triton` by a stub.
Every output is poisoned (NaN / -1) before a launch, so an element a kernel never writes
fails the comparison, and the kernels' scratch is poisoned too (DSPARK_KERNEL_POISON=1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

os.environ.setdefault("DSPARK_KERNEL_POISON", "1")  # before kernels.checks is imported

import torch  # noqa: E402

from . import dispatch, reference  # noqa: E402
from .confidence_head import confidence_triton  # noqa: E402
from .topk import transition_step_topk_triton  # noqa: E402
from .transition import plan, transition_step_triton  # noqa: E402

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}  # rtol = atol, per weight dtype
# (B, V, r, dtype): B = 1, odd r, V not a multiple of any tile, B beyond one 16-row tile.
SHAPES = [(1, 300, 7, torch.float32), (5, 257, 33, torch.float32), (17, 90, 64, torch.float32),
          (4, 200, 16, torch.bfloat16), (3, 131, 5, torch.bfloat16)]
CHI2_CRIT_DF7 = 24.32  # chi-square 0.999 quantile, 7 degrees of freedom (V = 8)
# 4096 draws of one row: an ulp of the GPU's log in the noise may flip a near-tie (~1e-6
# apart, odds ~1% per run); the dense check, over fresh rows, still demands identity.
MAX_NEAR_TIES = 2


def _inputs(b, v, r, dtype, device, sampled, gen, vt=50):
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    temp = torch.rand(b, generator=gen) * 1.5 + 0.3 if sampled else torch.zeros(b)
    if sampled and b > 1:
        temp[::3] = 0.0  # greedy and sampled rows mixed in one launch
    x = dict(base_logits=rnd(b, v, scale=2.0), prev_ids=torch.randint(0, vt, (b,), generator=gen),
             w1=rnd(vt, r), w2=rnd(v, r, scale=0.4), temperature=temp,
             seed=torch.randint(-2**62, 2**62, (b,), generator=gen),
             position=torch.randint(0, 1 << 20, (b,), generator=gen))
    return {k: t.to(device) for k, t in x.items()}


def _poisoned(b, device, v=None):
    out = (torch.full((b,), -1, dtype=torch.int64, device=device),
           torch.full((b,), float("nan"), device=device),
           torch.full((b,), float("nan"), device=device))
    probs = None if v is None else torch.full((b, v), float("nan"), device=device)
    return out, probs


def _compare(name, got, want, tol):
    """[(tensor, tensor)] -> '' if equal (ints) / close (floats), else what differs."""
    problems = []
    for label, g, w in zip(("token", "logprob", "lse", "probs"), got, want):
        if g is None and w is None:
            continue
        if not g.dtype.is_floating_point:
            if not torch.equal(g.cpu(), w.cpu()):
                problems.append(f"{label} {g.tolist()} != {w.tolist()}")
        elif not torch.allclose(g.cpu(), w.cpu(), rtol=tol, atol=tol):
            err = (g.cpu() - w.cpu()).abs().nan_to_num(float("inf")).max().item()
            problems.append(f"{label} max error {err:.3g} > {tol}")
    return f"{name}: " + "; ".join(problems) if problems else ""


def check_dense(device, gen):
    bad = []
    for b, v, r, dtype in SHAPES:
        for sampled in (False, True):
            x = _inputs(b, v, r, dtype, device, sampled, gen)
            want = reference.transition_step_ref(**x, want_probs=True)
            many = plan(b, v, r, x["w1"].element_size(), torch.device(device), block_v=16,
                        num_splits=5)  # many small tiles and splits, besides the default
            # one launch (the splits merged by the last program) and two (a combine launch);
            # the launches run back to back, so a counter not re-armed poisons the next
            for cfg, want_probs, fused in ((None, True, True), (None, False, True),
                                           (many, True, True), (many, False, False),
                                           (None, True, False)):
                out, probs = _poisoned(b, device, v if want_probs else None)
                got = transition_step_triton(**x, want_probs=want_probs, out_probs=probs,
                                             out=out, config=cfg, fused_combine=fused)
                exp = want if want_probs else (*want[:3], None)
                tag = (f"B={b} V={v} r={r} {dtype} sampled={sampled} probs={want_probs} "
                       f"fused={fused} {cfg}")
                bad.append(_compare(tag, got, exp, TOL[dtype]))
    # more splits than one merge chunk holds (COMBINE_ELEMS / BLOCK_B = 128 at B = 17)
    b, v, r, dtype = 17, 4000, 8, torch.float32
    wide = plan(b, v, r, 4, torch.device(device), block_v=16, num_splits=250)
    for sampled in (False, True):
        x = _inputs(b, v, r, dtype, device, sampled, gen)
        want = reference.transition_step_ref(**x)
        for fused in (True, False):
            out, _ = _poisoned(b, device)
            got = transition_step_triton(**x, out=out, config=wide, fused_combine=fused)
            bad.append(_compare(f"B={b} V={v} S={wide.num_splits} sampled={sampled} "
                                f"fused={fused}", got, want[:3], TOL[dtype]))
    return [m for m in bad if m]


def check_gumbel_distribution(device, gen):
    """4096 draws of one row under distinct (seed, position) pairs ~ softmax(logits / t)."""
    n, v, t = 4096, 8, 0.8
    row = torch.randn(v, generator=gen) * 1.5
    x = _inputs(n, v, 4, torch.float32, "cpu", True, gen)
    x.update(base_logits=row.expand(n, v).contiguous(), temperature=torch.full((n,), t),
             prev_ids=torch.zeros(n, dtype=torch.long), w2=torch.zeros(v, 4),
             seed=torch.arange(n) // 64 + 12345, position=torch.arange(n) % 64)
    x = {k: val.to(device) for k, val in x.items()}
    got = transition_step_triton(**x)[0].cpu()
    ref = reference.transition_step_ref(**x)[0].cpu()
    expected = torch.softmax(row / t, -1) * n
    observed = torch.bincount(got, minlength=v).float()
    chi2 = ((observed - expected) ** 2 / expected).sum().item()
    msgs = []
    differ = int((got != ref).sum())
    if differ > MAX_NEAR_TIES:
        msgs.append(f"kernel and reference drew differently in {differ} of {n}")
    if chi2 > CHI2_CRIT_DF7:
        msgs.append(f"chi2 {chi2:.1f} > {CHI2_CRIT_DF7}: observed {observed.tolist()}, "
                    f"expected {expected.round().tolist()}")
    return msgs


def check_topk(device, gen):
    bad = []
    for b, v, r, dtype in SHAPES[:2] + SHAPES[3:4]:
        x = _inputs(b, v, r, dtype, device, True, gen)
        u = x.pop("base_logits")
        dense = transition_step_triton(u, **x)
        for k in (v, 37):  # k = V in shuffled order must reproduce the dense step
            ids = torch.stack([torch.randperm(v, generator=gen)[:k] for _ in range(b)]).to(device)
            vals = u.gather(1, ids)
            out, _ = _poisoned(b, device)
            got = transition_step_topk_triton(vals, ids, **x, out=out)
            want = reference.transition_step_topk_ref(vals, ids, **x)
            bad.append(_compare(f"topk B={b} V={v} k={k} {dtype} vs ref", got, want, TOL[dtype]))
            if k == v:
                bad.append(_compare(f"topk k=V B={b} {dtype} vs dense", got, dense[:3],
                                    TOL[dtype]))
    return [m for m in bad if m]


def check_confidence(device, gen):
    bad = []
    for b, hdim, r, dtype in ((1, 50, 7, torch.float32), (6, 96, 33, torch.float32),
                              (5, 64, 16, torch.bfloat16)):
        h = torch.randn(b, hdim, generator=gen).to(dtype).to(device)
        prev = torch.randint(0, 40, (b,), generator=gen).to(device)
        w1 = torch.randn(40, r, generator=gen).to(dtype).to(device)
        w = (torch.randn(hdim + r, generator=gen) * 0.2).to(dtype).to(device)
        bias = torch.randn(1, generator=gen).to(dtype).to(device)
        out = torch.full((b,), float("nan"), device=device)
        got = confidence_triton(h, prev, w1, w, bias, out=out)
        want = reference.confidence_ref(h, prev, w1, w, bias)
        if not torch.allclose(got.cpu(), want.cpu(), rtol=TOL[dtype], atol=TOL[dtype]):
            bad.append(f"B={b} H={hdim} r={r} {dtype}: {got.tolist()} != {want.tolist()}")
    return bad


def check_dispatch_columns(device, gen):
    """The dispatcher as dspark_vllm.sequential calls it, slot by slot, with columns of
    [B, K] tensors (strided vectors), forced onto the Triton path; against the references."""
    b, k, v, hdim, r, vt = 5, 4, 257, 48, 16, 60
    declined, dispatch._declined = dispatch._declined, lambda *tensors: False
    bad = []
    try:
        for dtype in (torch.float32, torch.bfloat16):
            def rnd(*shape, scale=1.0):
                return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

            base, h = rnd(b, k, v, scale=2.0), rnd(b, k, hdim)  # [B, K, V], [B, K, H]
            w1, w2 = rnd(vt, r), rnd(v, r, scale=0.4)
            w, bias = rnd(hdim + r, scale=0.2), rnd(1)
            prevs = torch.randint(0, vt, (b, k), generator=gen).to(device)  # [B, K]
            positions = torch.randint(0, 1 << 20, (b, k), generator=gen).to(device)  # [B, K]
            temp = (torch.rand(b, generator=gen) + 0.5).to(device)
            seed = torch.randint(-2**62, 2**62, (b,), generator=gen).to(device)
            temps = (torch.rand(k, generator=gen) + 0.5).to(device)
            for i in range(k):
                args = (base[:, i], prevs[:, i], w1, w2, temp, seed, positions[:, i])
                bad.append(_compare(f"step slot {i} {dtype}",
                                    dispatch.transition_step(*args, want_probs=True),
                                    reference.transition_step_ref(*args, want_probs=True),
                                    TOL[dtype]))
                bad.append(_compare(f"argmax slot {i} {dtype}",
                                    [dispatch.transition_argmax(*args[:4])],
                                    [reference.transition_argmax_ref(*args[:4])], TOL[dtype]))
                ids = torch.stack([torch.randperm(v, generator=gen)[:37] for _ in range(b)])
                ids = ids.to(device)
                top = (base[:, i].gather(1, ids), ids, *args[1:])
                bad.append(_compare(f"topk slot {i} {dtype}", dispatch.transition_step_topk(*top),
                                    reference.transition_step_topk_ref(*top), TOL[dtype]))
            got = dispatch.confidence_block(h, prevs, w1, w, bias, temps)
            want = reference.confidence_block_ref(h, prevs, w1, w, bias, temps)
            bad.append(_compare(f"confidence block {dtype}", [got], [want], TOL[dtype]))
    finally:
        dispatch._declined = declined
    return [m for m in bad if m]


def check_asserts(device, gen):
    """The wrappers refuse bad layouts, dtypes and shapes before launching anything."""
    x = _inputs(3, 40, 8, torch.float32, device, False, gen)
    h = torch.randn(3, 16, device=device)
    w = torch.randn(16 + 8, device=device)
    ids = torch.arange(40, device=device).expand(3, 40)
    cases = {
        "strided base_logits": lambda: transition_step_triton(
            **dict(x, base_logits=x["base_logits"].repeat(1, 2)[:, ::2])),
        "int32 prev_ids": lambda: transition_step_triton(**dict(x, prev_ids=x["prev_ids"].int())),
        "w2 rows != V": lambda: transition_step_triton(**dict(x, w2=x["w2"][:-1])),
        "w1/w2 dtypes differ": lambda: transition_step_triton(**dict(x, w2=x["w2"].double())),
        "float64 out_probs": lambda: transition_step_triton(
            **x, want_probs=True, out_probs=torch.empty(3, 40, dtype=torch.float64,
                                                        device=device)),
        "int32 topk ids": lambda: transition_step_topk_triton(
            x["base_logits"], ids.int(), *[x[k] for k in list(x)[1:]]),
        "confidence w too short": lambda: confidence_triton(h, x["prev_ids"], x["w1"], w[:-1],
                                                            w[:1]),
    }
    missed = []
    for name, call in cases.items():
        try:
            call()
            missed.append(f"{name}: accepted")
        except AssertionError:
            pass
    return missed


CHECKS = {"asserts": check_asserts, "dense": check_dense, "topk": check_topk,
          "gumbel_distribution": check_gumbel_distribution, "confidence": check_confidence,
          "dispatch_columns": check_dispatch_columns}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_float32_matmul_precision("highest")  # fp32 references: no TF32 on a GPU
    if args.device == "cpu":
        assert os.environ.get("TRITON_INTERPRET") == "1", "on CPU set TRITON_INTERPRET=1"
    failed = 0
    for name, fn in CHECKS.items():
        gen = torch.Generator().manual_seed(args.seed)
        try:
            problems = fn(args.device, gen)
        except Exception:  # noqa: BLE001 - a crash is a failed check with its traceback
            problems = [traceback.format_exc()]
        failed += bool(problems)
        print(json.dumps(dict(check=name, ok=not problems, detail="\n".join(problems))),
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
