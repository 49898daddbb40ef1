"""Where an engine step's time goes: wall-clock timers on the engine core, the scheduler,
the model runner and the DSpark proposer, for plain decoding or a DSpark engine.

    python -m benchmarks.engine_profile plain        # no speculation
    python -m benchmarks.engine_profile k0           # DSpark that never drafts (context pass only)
    python -m benchmarks.engine_profile adaptive     # DSpark with the load-aware budget
    python -m benchmarks.engine_profile fixed --k 7 --batch 1   # DSpark, K drafts every step
    python -m benchmarks.engine_profile capped --k 3  # K drafts a step on an engine sized for 7
    python -m benchmarks.engine_profile shapes       # the budget's start-up cost profile, afresh
    python -m benchmarks.engine_profile plain --compiled  # torch.compile, as `vllm serve` runs

One `vllm.LLM`, by default with the engine and worker in this process (no RPC), the first
`--batch` of 16 prompts (8 GSM8K held-out, 8 HumanEval) x 96 greedy tokens: a warm-up pass,
then `--repeats` timed passes, each printed as one JSON line {timer: [seconds, calls]}. The timers wrap whole methods, so nested ones
overlap (runner.execute_model contains the target forward; runner.sample_tokens contains
the draft pass, proposer.propose; that contains drafter.forward, the drafter's context K/V
and block pass, and proposer._sample_draft_tokens, its LM head and sequential loop;
budget.update_draft_token_ids, the load-aware budget's work, contains sched.update_draft_token_ids).
With VLLM_ENABLE_V1_MULTIPROCESSING=1 the engine core runs in its own process, as under
`vllm serve`, and the worker in a third (vLLM's CPU platform forces its multiprocessing
executor then): vLLM starts both with multiprocessing's spawn, which imports this module
there as `__mp_main__`; it installs the same timers in each, and each writes its totals to
a file after every outermost timed call, read here after each pass (same columns; core.step
minus the worker's execute_model and sample_tokens is then the RPC between the two).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import functools
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from dspark_vllm.hardware import NAMED_DTYPES

TIMERS: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
SPAWNED_DIR_ENV = "DSPARK_PROFILE_DIR"  # where the processes vLLM spawns write their timers
_dump_dir: Path | None = None  # set in a process vLLM spawned (engine core, worker)
_depth = 0  # timed calls running now (nested timers overlap; the engine calls them from one thread)


def _time(cls, name: str, label: str) -> None:
    f = getattr(cls, name, None)
    if f is None:
        return

    @functools.wraps(f)
    def timed(*a, **k):
        global _depth
        t0 = time.perf_counter()
        _depth += 1
        try:
            return f(*a, **k)
        finally:
            _depth -= 1
            row = TIMERS[label]
            row[0] += time.perf_counter() - t0
            row[1] += 1
            if not _depth and _dump_dir is not None:  # a spawned process's outermost call
                _dump_timers(_dump_dir)

    setattr(cls, name, timed)


def _dump_timers(folder: Path) -> None:
    """In a spawned process: the totals so far, replaced atomically after each outermost
    timed call (~50 us each, a few a step). Once the parent has removed the folder at its
    exit, the engine's shutdown steps still come through here: nothing is read any more,
    so nothing is written (writing raised in the worker, which vLLM logged as a fatal
    engine error after every multiprocess profile)."""
    if not folder.is_dir():
        return
    path = folder / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(TIMERS))
    os.replace(tmp, path)


def _spawned_timers() -> dict[str, list]:
    """The spawned processes' totals so far (none with the engine in this process)."""
    totals: dict[str, list] = {}
    for f in Path(os.environ[SPAWNED_DIR_ENV]).glob("*.json"):
        for k, (s, n) in json.loads(f.read_text()).items():
            row = totals.setdefault(k, [0.0, 0])
            row[0] += s
            row[1] += n
    return totals


def _install() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from dspark_vllm.metrics import DSparkStats
    from dspark_vllm.proposer import DSparkProposer
    from dspark_vllm.scheduler import DSparkScheduler

    for n in ("step", "post_step"):
        _time(EngineCore, n, f"core.{n}")
    for n in ("schedule", "update_from_output", "update_draft_token_ids"):
        _time(Scheduler, n, f"sched.{n}")
    _time(DSparkScheduler, "update_draft_token_ids", "budget.update_draft_token_ids")
    _time(DSparkStats, "maybe_publish", "stats.maybe_publish")  # the metrics snapshot
    for n in ("execute_model", "sample_tokens", "propose_draft_token_ids", "take_draft_token_ids"):
        _time(GPUModelRunner, n, f"runner.{n}")
    for n in ("propose", "_context_only", "_context_slots", "set_inputs_first_pass",
              "build_model_inputs_first_pass", "_sample_draft_tokens",
              "prepare_next_token_ids_padded"):
        _time(DSparkProposer, n, f"proposer.{n}")
    from dspark_vllm.context_debt import ContextDebt

    _time(ContextDebt, "record", "debt.record")
    # Inside the draft pass: the drafter's forward (context K/V + block), its fc over the
    # target layers and its LM head (the class vLLM builds for a Qwen3DSparkModel drafter).
    from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM

    for n in ("forward", "combine_hidden_states", "compute_draft_logits"):
        _time(Qwen3DSparkForCausalLM, n, f"drafter.{n}")


def in_process_llm(spec: dict | None, dtype: str = "float32", eager: bool = True, **kw):
    """One `vllm.LLM` on the bundled target, engine core and worker in this process (no RPC
    between them), in `dtype`, eager unless `eager` is False (then compiled with
    torch.compile, as `vllm serve` runs by default). vLLM reads these variables when the
    engine starts."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm import LLM

    from dspark_vllm.target import prepare_target

    return LLM(model=str(prepare_target()), dtype=dtype, max_model_len=1024, seed=0,
               enforce_eager=eager, speculative_config=spec, distributed_executor_backend="uni",
               **kw)


def profiled_shapes(dtype: str = "float32", eager: bool = True) -> dict:
    """The load-aware budget's start-up cost profile (`patches/cost_profile.py`) taken afresh
    in this process on the bundled target and drafter, eager or compiled: ms of a step by
    batch tokens (forward, drafter dummy pass, logits at every token), the fastest shape per
    size."""
    from dspark_vllm.cost_model import fastest_by_tokens
    from dspark_vllm.patches.cost_profile import profile
    from dspark_vllm.serving import BUNDLED_DRAFTER

    spec = {"method": "dspark", "model": str(BUNDLED_DRAFTER), "num_speculative_tokens": 7,
            "enable_adaptive_verification": True}
    llm = in_process_llm(spec, dtype, eager=eager, max_num_seqs=16, enable_prefix_caching=False)
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    points, contended = profile(runner)
    return {"mode": "shapes", "compiled": not eager, "contended": contended, "step_ms_by_tokens": {
        t: round(sec * 1e3, 1) for t, sec in fastest_by_tokens(points).items()}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("plain", "k0", "adaptive", "fixed", "capped", "shapes"))
    p.add_argument("--k", type=int, default=7,
                   help="drafts per step (modes fixed, capped); the most per step (adaptive)")
    p.add_argument("--batch", type=int, default=16, help="prompts per pass (at most 16)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--offset", type=int, default=0,
                   help="first prompt of the 16 (0-7 GSM8K, 8-15 HumanEval)")
    p.add_argument("--dtype", choices=NAMED_DTYPES, default="float32",
                   help="the target's and drafter's dtype (bfloat16 pays on CPUs with AMX)")
    p.add_argument("--compiled", action="store_true",
                   help="compile with torch.compile, as `vllm serve` does without "
                   "--enforce-eager (the start takes minutes; eager by default)")
    args = p.parse_args(argv)
    if not 0 <= args.offset <= 15:
        p.error(f"--offset {args.offset}: use 0 to 15 (the prompt set holds 16)")
    if not 1 <= args.batch <= 16 - args.offset:
        p.error(f"--batch {args.batch}: use 1 to {16 - args.offset} (the prompt set holds 16"
                + (f", from prompt {args.offset})" if args.offset else ")"))
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats}: use 1 or more")
    if args.mode == "shapes":  # the profile's own repeats; --batch, --k, --repeats unused
        print(json.dumps(profiled_shapes(args.dtype, eager=not args.compiled)), flush=True)
        return
    sized = args.mode in ("fixed", "adaptive", "capped")  # the modes --k sizes
    if sized and not 1 <= args.k <= 7:
        p.error(f"--k {args.k}: use 1 to 7 (the bundled drafter's block; mode k0 drafts none)")
    from vllm import SamplingParams

    from benchmarks.serving_sweep import one_length_schedule
    from dspark_vllm.datasets import encode_chat, gsm8k_heldout, humaneval
    from dspark_vllm.serving import BUNDLED_DRAFTER

    os.environ[SPAWNED_DIR_ENV] = tempfile.mkdtemp(prefix="dspark-profile-")
    atexit.register(shutil.rmtree, os.environ[SPAWNED_DIR_ENV], ignore_errors=True)
    from dspark_vllm.metrics import metrics_file

    stats_path = metrics_file()  # the engine publishes its metrics, as under `vllm serve`
    _install()
    spec = None
    if args.mode != "plain":
        spec = {"method": "dspark", "model": str(BUNDLED_DRAFTER),
                "num_speculative_tokens": args.k if args.mode in ("fixed", "adaptive") else 7}
        if args.mode in ("k0", "capped"):  # vLLM's batch-size schedule: one length for all
            spec["num_speculative_tokens_per_batch_size"] = one_length_schedule(
                args.k if args.mode == "capped" else 0)
        elif args.mode == "adaptive":
            spec["enable_adaptive_verification"] = True
    llm = in_process_llm(spec, args.dtype, eager=not args.compiled, max_num_seqs=16,
                         enable_prefix_caching=False)
    tok = llm.get_tokenizer()
    chats = [p["messages"] for p in gsm8k_heldout()[:8]] + [p["messages"] for p in humaneval()[:8]]
    prompts = [{"prompt_token_ids": encode_chat(tok, m)}
               for m in chats][args.offset: args.offset + args.batch]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    for rep in range(args.repeats):
        TIMERS.clear()
        before = _spawned_timers()
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        row = {"mode": args.mode, "dtype": args.dtype, "compiled": args.compiled, "repeat": rep,
               "wall_s": round(time.perf_counter() - t0, 3)}
        for k, (s, n) in _spawned_timers().items():  # the spawned processes' share of this pass
            b = before.get(k, (0.0, 0))
            TIMERS[k][0] += s - b[0]
            TIMERS[k][1] += n - b[1]
        row |= {k: [round(v[0], 4), v[1]] for k, v in sorted(TIMERS.items())}
        print(json.dumps(row), flush=True)
    # What the budget read and did, from the metrics snapshot the engine publishes when it
    # falls idle (in whichever process the scheduler runs).
    snap = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
    cost = (snap.get("status") or {}).get("cost_model")
    if cost:  # the DSpark scheduler (load-aware budget)
        print(json.dumps({"mode": args.mode, "cost_alpha_ms": cost["alpha_s"] * 1e3,
                          "cost_beta_ms_per_token": cost["beta_s_per_token"] * 1e3,
                          "cost_refits": cost["refits"], "drafted": snap["drafted"],
                          "admitted": snap["admitted"], "dropped": snap["dropped"]}), flush=True)


if __name__ == "__mp_main__" and SPAWNED_DIR_ENV in os.environ:
    # A process vLLM spawned from this profile (engine core, worker): time it the same way.
    _dump_dir = Path(os.environ[SPAWNED_DIR_ENV])
    _install()

if __name__ == "__main__":
    main()
