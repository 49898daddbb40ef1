"""Where an engine step's time goes, in-process: wall-clock timers on the engine core, the
scheduler, the model runner and the DSpark proposer, for plain decoding or a DSpark engine.

    python -m benchmarks.engine_profile plain        # no speculation
    python -m benchmarks.engine_profile k0           # DSpark that never drafts (context pass only)
    python -m benchmarks.engine_profile adaptive     # DSpark with the load-aware budget
    python -m benchmarks.engine_profile fixed --k 7 --batch 1   # DSpark, K drafts every step

One `vllm.LLM` with the worker in this process (no RPC), the first `--batch` of 16 prompts
(8 GSM8K held-out, 8 HumanEval) x 96 greedy tokens: a warm-up pass, then `--repeats` timed passes, each printed
as one JSON line {timer: [seconds, calls]}. The timers wrap whole methods, so nested ones
overlap (runner.execute_model contains the target forward; runner.sample_tokens contains
the draft pass, proposer.propose; that contains drafter.forward, the drafter's context K/V
and block pass, and proposer._sample_draft_tokens, its LM head and sequential loop).
With VLLM_ENABLE_V1_MULTIPROCESSING=1 the engine core runs in its own process, as under
`vllm serve`; then only each pass's wall time is measured.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import time

TIMERS: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])


def _time(cls, name: str, label: str) -> None:
    f = getattr(cls, name, None)
    if f is None:
        return

    @functools.wraps(f)
    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            row = TIMERS[label]
            row[0] += time.perf_counter() - t0
            row[1] += 1

    setattr(cls, name, timed)


def _install_drafter(llm) -> None:
    """Timers inside the draft pass: the drafter's forward (context K/V + block), its LM
    head, the sequential sampling loop, and vLLM's input preparation for the pass."""
    from dspark_vllm.proposer import DSparkProposer

    for n in ("set_inputs_first_pass", "build_model_inputs_first_pass", "_sample_draft_tokens"):
        _time(DSparkProposer, n, f"proposer.{n}")
    executor = getattr(llm.llm_engine, "model_executor", None)
    if executor is None:  # VLLM_ENABLE_V1_MULTIPROCESSING=1: the engine core is elsewhere
        return
    drafter = executor.driver_worker.worker.model_runner.drafter.model
    for n in ("forward", "combine_hidden_states", "compute_draft_logits"):
        _time(type(drafter), n, f"drafter.{n}")


def _install() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from dspark_vllm.proposer import DSparkProposer

    for n in ("step", "post_step"):
        _time(EngineCore, n, f"core.{n}")
    for n in ("schedule", "update_from_output", "update_draft_token_ids"):
        _time(Scheduler, n, f"sched.{n}")
    for n in ("execute_model", "sample_tokens", "propose_draft_token_ids", "take_draft_token_ids"):
        _time(GPUModelRunner, n, f"runner.{n}")
    for n in ("propose", "_context_only"):
        _time(DSparkProposer, n, f"proposer.{n}")


def in_process_llm(spec: dict | None, **kw):
    """One `vllm.LLM` on the bundled target, engine core and worker in this process (no RPC
    between them), float32, eager. vLLM reads these variables when the engine starts."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm import LLM

    from dspark_vllm.target import prepare_target

    return LLM(model=str(prepare_target()), dtype="float32", max_model_len=1024, seed=0,
               enforce_eager=True, speculative_config=spec, distributed_executor_backend="uni",
               **kw)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("plain", "k0", "adaptive", "fixed"))
    p.add_argument("--k", type=int, default=7,
                   help="drafts per step (mode fixed); the most per step (mode adaptive)")
    p.add_argument("--batch", type=int, default=16, help="prompts per pass (at most 16)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--offset", type=int, default=0,
                   help="first prompt of the 16 (0-7 GSM8K, 8-15 HumanEval)")
    args = p.parse_args(argv)
    if not 0 <= args.offset <= 15:
        p.error(f"--offset {args.offset}: use 0 to 15 (the prompt set holds 16)")
    if not 1 <= args.batch <= 16 - args.offset:
        p.error(f"--batch {args.batch}: use 1 to {16 - args.offset} (the prompt set holds 16"
                + (f", from prompt {args.offset})" if args.offset else ")"))
    sized = args.mode in ("fixed", "adaptive")  # the modes --k sizes
    if sized and not 1 <= args.k <= 7:
        p.error(f"--k {args.k}: use 1 to 7 (the bundled drafter's block; mode k0 drafts none)")
    from vllm import SamplingParams

    from dspark_vllm.datasets import encode_chat, gsm8k_heldout, humaneval
    from dspark_vllm.serving import BUNDLED_DRAFTER

    _install()
    spec = None
    if args.mode != "plain":
        spec = {"method": "dspark", "model": str(BUNDLED_DRAFTER),
                "num_speculative_tokens": args.k if sized else 7}
        if args.mode == "k0":
            spec["num_speculative_tokens_per_batch_size"] = [[1, 1024, 0]]
        elif args.mode == "adaptive":
            spec["enable_adaptive_verification"] = True
    llm = in_process_llm(spec, max_num_seqs=16, enable_prefix_caching=False)
    if spec is not None:
        _install_drafter(llm)
    tok = llm.get_tokenizer()
    chats = [p["messages"] for p in gsm8k_heldout()[:8]] + [p["messages"] for p in humaneval()[:8]]
    prompts = [{"prompt_token_ids": encode_chat(tok, m)}
               for m in chats][args.offset: args.offset + args.batch]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    for rep in range(args.repeats):
        TIMERS.clear()
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        row = {"mode": args.mode, "repeat": rep, "wall_s": round(time.perf_counter() - t0, 3)}
        row |= {k: [round(v[0], 4), v[1]] for k, v in sorted(TIMERS.items())}
        print(json.dumps(row), flush=True)
    sched = _scheduler(llm)
    if hasattr(sched, "cost_model"):  # the DSpark scheduler: what its budget read and did
        st = sched.stats
        print(json.dumps({"mode": args.mode, "cost_alpha_ms": sched.cost_model.cost.alpha * 1e3,
                          "cost_beta_ms_per_token": sched.cost_model.cost.beta * 1e3,
                          "cost_refits": sched.cost_model.refits, "drafted": st.drafted,
                          "admitted": st.admitted, "dropped": st.dropped}), flush=True)


def _scheduler(llm):
    """The engine core's scheduler of an in-process `vllm.LLM` (None if not reachable)."""
    core = getattr(llm.llm_engine, "engine_core", None)
    return getattr(getattr(core, "engine_core", None), "scheduler", None)


if __name__ == "__main__":
    main()
