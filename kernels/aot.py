"""Ahead-of-time compile of the kernels for NVIDIA targets, no GPU needed:

  python -m kernels.aot [--cc 90 80] [--full]

Compiles every kernel down to a cubin with Triton's bundled ptxas and reports shared memory
(against the target's per-block limit), registers and spill stack (via cuobjdump).  This
catches what the interpreter cannot: typing errors of the real compiler, tiles that do not
fit in shared memory, register spills.  --full covers every plan of the benchmark grid.
Do not run it with TRITON_INTERPRET=1 (the kernels must be real JIT functions).
Prints one JSON line per kernel; exits 1 if any compile fails or overflows shared memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget

from . import confidence_head, topk, transition

SMEM_LIMIT = {90: 232448, 80: 166912, 89: 101376, 86: 101376}  # max dynamic smem per block
SM_COUNT = {90: 132, 80: 108, 89: 128, 86: 84}  # H100/H200, A100, L40S, A40: plan's grid only
DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _signature(fn, types: dict[str, str], consts: dict) -> dict[str, str]:
    return {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}


def _resources(cubin: bytes) -> dict[str, int]:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                              text=True).stdout
    fields = [w for line in text.splitlines() if "REG:" in line for w in line.split()]
    return {k.lower(): int(v) for k, v in (w.split(":") for w in fields)
            if k in ("REG", "STACK", "LOCAL")}


def _compile(name: str, fn, types: dict, consts: dict, num_warps: int, cc: int) -> dict:
    sig = _signature(fn, types, consts)
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
               if sig[n].startswith("*") or n.startswith("stride")}  # as a real launch sees them
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=aligned)
    row = dict(kernel=name, cc=cc, num_warps=num_warps,
               consts={k: v for k, v in consts.items() if k != "DOT_UPCAST"})
    try:
        k = triton.compile(src, target=GPUTarget("cuda", cc, 32),
                           options=dict(num_warps=num_warps))
    except Exception as e:  # noqa: BLE001 - report every failure, keep compiling the rest
        return dict(row, ok=False, error=f"{type(e).__name__}: {str(e)[:500]}")
    smem = k.metadata.shared
    ok = smem <= SMEM_LIMIT.get(cc, SMEM_LIMIT[80])
    return dict(row, ok=ok, smem=smem, **_resources(k.asm["cubin"]))


def step_kernels(b: int, v: int, r: int, dtype: torch.dtype, cc: int) -> list[tuple]:
    """(name, fn, types, consts, num_warps) of the dense step's three kernels for one shape."""
    transition.checks.sm_count.cache_clear()
    dev = torch.device("meta")
    cfg = transition.plan(b, v, r, torch.tensor([], dtype=dtype).element_size(), dev,
                          num_splits=max(1, transition.PROGRAMS_PER_SM * SM_COUNT.get(cc, 108)
                                         // triton.cdiv(b, 128)))
    d = DTYPE[dtype]
    consts = dict(R=r, BLOCK_B=cfg.block_b, BLOCK_V=cfg.block_v, BLOCK_R=cfg.block_r,
                  DOT_PRECISION=transition.FP32_DOT_PRECISION if d == "fp32" else "ieee",
                  DOT_UPCAST=False)
    types = dict(u_ptr=f"*{d}", prev_ptr="*i64", w1_ptr=f"*{d}", w2_ptr=f"*{d}",
                 temp_ptr="*fp32", seed_ptr="*i64", pos_ptr="*i64", part_f_ptr="*fp32",
                 part_i_ptr="*i32", count_ptr="*i32", token_ptr="*i64", logprob_ptr="*fp32",
                 lse_ptr="*fp32", out_ptr="*fp32")
    tag = f"B={b} V={v} r={r} {d}"
    block_s = transition.merge_block_s(cfg, fused=False)
    return [
        (f"pass1 {tag}", transition._pass1_kernel, types,
         dict(consts, FUSE=True, BLOCK_S=transition.merge_block_s(cfg, fused=True)),
         cfg.num_warps),
        (f"probs {tag}", transition._probs_kernel, types, consts, cfg.num_warps),
        (f"combine S={cfg.num_splits}", transition._combine_kernel,
         dict(part_f_ptr="*fp32", part_i_ptr="*i32", token_ptr="*i64", logprob_ptr="*fp32",
              lse_ptr="*fp32"), dict(BLOCK_ROWS=max(1, transition.COMBINE_ELEMS // block_s),
                                  BLOCK_S=block_s), 4),
    ]


def small_kernels(r: int, dtype: torch.dtype) -> list[tuple]:
    d = DTYPE[dtype]
    nxt = transition.checks.next_pow2
    return [
        (f"topk r={r} {d}", topk._topk_kernel,
         dict(vals_ptr=f"*{d}", ids_ptr="*i64", prev_ptr="*i64", w1_ptr=f"*{d}", w2_ptr=f"*{d}",
              temp_ptr="*fp32", seed_ptr="*i64", pos_ptr="*i64", token_ptr="*i64",
              logprob_ptr="*fp32", lse_ptr="*fp32"),
         dict(R=r, BLOCK_K=topk.MAX_BLOCK_K, BLOCK_R=min(topk.MAX_BLOCK_R, nxt(r))),
         topk.NUM_WARPS),
        (f"confidence r={r} {d}", confidence_head._confidence_kernel,
         dict(h_ptr=f"*{d}", prev_ptr="*i64", w1_ptr=f"*{d}", w_ptr=f"*{d}", b_ptr=f"*{d}",
              out_ptr="*fp32"),
         dict(R=r, BLOCK_H=confidence_head.MAX_BLOCK_H,
              BLOCK_R=min(confidence_head.MAX_BLOCK_R, nxt(r))), confidence_head.NUM_WARPS),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cc", type=int, nargs="+", default=[90], help="compute capabilities")
    ap.add_argument("--full", action="store_true", help="every plan of the benchmark grid")
    args = ap.parse_args(argv)
    assert not triton.knobs.runtime.interpret, "unset TRITON_INTERPRET for the AOT compile"
    jobs = []
    for cc in args.cc:
        if args.full:
            for b in (1, 8, 32, 128):
                for r in (64, 256):
                    for dt in (torch.float32, torch.bfloat16):
                        jobs += [(cc, j) for j in step_kernels(b, 151936, r, dt, cc)[:2]]
        else:  # largest bf16 tiles, the register-heavy fp32 FMA dot, an odd padded rank
            jobs += [(cc, j) for j in step_kernels(128, 151936, 256, torch.bfloat16, cc)]
            jobs += [(cc, step_kernels(128, 151936, 64, torch.float32, cc)[0])]
            jobs += [(cc, step_kernels(1, 151936, 7, torch.bfloat16, cc)[0])]
        jobs += [(cc, j) for j in small_kernels(256, torch.bfloat16)]
    failed = 0
    for cc, (name, fn, types, consts, warps) in jobs:
        row = _compile(name, fn, types, consts, warps, cc)
        failed += not row["ok"]
        print(json.dumps(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
