"""Online serving sweep: every configuration through `vllm serve`, streaming OpenAI clients.

Configurations: no speculation, MTP-1 (EAGLE head, 1 token), DSpark with fixed draft
lengths, DSpark with the load-aware budget, and vLLM's own batch-size schedule
(`num_speculative_tokens_per_batch_size`) on the DSpark drafter as a peer.

    python -m benchmarks.serving_sweep --out benchmarks/results/serving [--quick]

Writes sweep.json (raw + medians), sweep.md (tables, matched-throughput comparison) and
frontier.png / verified.png. Warm-up requests are excluded; each point is repeated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from contextlib import ExitStack
from pathlib import Path

from benchmarks.ledger_window import ledger_summary, load_split
from benchmarks.load import closed_loop, open_loop, summarize
from benchmarks.report import PHASES
from benchmarks.step_trace import name_servers
from dspark_vllm.config import FRAME_STACK_ENV, LEDGER_SCHEDULER_CLS, TRACE_ENV
from dspark_vllm.hardware import NAMED_DTYPES
from dspark_vllm.serving import (BUNDLED_DRAFTER, VllmServer, acceptance_length, metric_sum,
                                 metrics_delta, serving)

MAX_TOKENS = 128
DEFAULT_MTP1 = "runs/smollm2/mtp-1/drafter"
BATCH_SCHEDULE = [[1, 2, 7], [3, 4, 5], [5, 8, 3], [9, 16, 2], [17, 1024, 1]]


def one_length_schedule(k: int) -> list[list[int]]:
    """vLLM's batch-size schedule ([first batch, last batch, drafts] rows) verifying k
    drafts at every batch size; k = 0 never drafts (the drafter's context pass only)."""
    return [[1, 1024, k]]

# Server environments beyond the defaults, A/Bs run only when named: the budget with the
# drafter's context K/V written on every step (DSPARK_DEFER_CONTEXT=0, against deferring it:
# context_debt.py), and with vLLM's separate draft RPC after each step
# (DSPARK_DRAFT_HANDOVER=0, against drafts on the step's output: patches/draft_handover.py),
# and with the draft gate judging by its arms' running means (DSPARK_GATE_VERDICT=arms, the
# default until 2026-12-02) or by paired bursts (the default now; named for the earlier A/Bs),
# and with the confidences rescaled to the acceptance served (DSPARK_CONFIDENCE_DRIFT=1,
# budget.ConfidenceDrift, experimental; serving-1204-c1-drift ran it as the default, named
# dspark-adaptive there, against dspark-adaptive-no-drift), and with Algorithm 1 pricing a
# step by the cheapest reachable step alone (DSPARK_STEP_PRICE=envelope, the default until
# 2026-12-05) instead of that envelope's convex hull (budget.step_prices), and with the draft
# gate's earlier cap of 4 warm bursts per load (DSPARK_GATE_WARM_BURSTS=4; gate.WARM_BURSTS),
# and with oneDNN's primitive cache at its own default of 1,024, or at 256, rather than the
# 64 a DSpark server on CPU sets (heap.bound_primitive_cache), to price the cap.
CONFIG_ENV = {"dspark-adaptive-stepwise-context": {"DSPARK_DEFER_CONTEXT": "0"},
              "dspark-adaptive-draft-rpc": {"DSPARK_DRAFT_HANDOVER": "0"},
              "dspark-adaptive-arms": {"DSPARK_GATE_VERDICT": "arms"},
              "dspark-adaptive-paired": {"DSPARK_GATE_VERDICT": "paired"},
              "dspark-adaptive-drift": {"DSPARK_CONFIDENCE_DRIFT": "1"},
              "dspark-adaptive-envelope": {"DSPARK_STEP_PRICE": "envelope"},
              "dspark-adaptive-warm4": {"DSPARK_GATE_WARM_BURSTS": "4"},
              "dspark-adaptive-onednn1024": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"},
              "dspark-adaptive-onednn256": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "256"}}
# Prompt lookup beside the drafter (dspark_vllm/lookup.py; needs its table), run only when
# named: the budget and each fixed length with "-lookup" appended (dspark-adaptive-lookup,
# dspark-k3-lookup) serve with this switch, so the budget meets fixed lengths on equal terms.
LOOKUP, LOOKUP_SWITCH = "-lookup", {"DSPARK_PROMPT_LOOKUP": "6"}
# A/A control, run only when named: a second, identical plain server. On this CPU two
# copies of one server differ by up to ~1.2x at 16 requests (a server instance keeps a speed
# of its own), so its ratio to no-spec is the noise floor any A/B ratio must clear.
AA_CONTROL = "no-spec-aa"
# Drafter A/B, only with --drafter-b: the load-aware budget served on a second drafter (a
# retrained or continued one, say), so both drafters meet the same machine drift.
DRAFTER_B = "dspark-adaptive-b"
# Eager controls, run only when named: plain decoding and the budget served with
# --enforce-eager beside the compiled servers (vLLM's default, and what `vllm serve` users
# get), as every table before 2026-12-06 was measured (`--eager` serves every server so).
EAGER = "-eager"
EAGER_CONTROLS = ("no-spec" + EAGER, "dspark-adaptive" + EAGER)
# A DSpark server that never drafts, run only when named: vLLM's batch-size schedule at zero
# drafts for every batch, so every step is a speculative server's undrafted step (the
# drafter's context pass only), to price being a speculative server apart from drafting.
NEVER_DRAFTS = "dspark-k0"
NAMED_ONLY = (*CONFIG_ENV, AA_CONTROL, *EAGER_CONTROLS, NEVER_DRAFTS)


def configs(dspark: str, mtp1: str, fixed: tuple[int, ...],
            drafter_b: str | None = None) -> dict[str, dict | None]:
    c: dict[str, dict | None] = {"no-spec": None}
    if Path(mtp1, "config.json").is_file():
        c["mtp-1"] = {"method": "eagle", "model": mtp1, "num_speculative_tokens": 1}
    for k in fixed:
        c[f"dspark-k{k}"] = {"method": "dspark", "model": dspark, "num_speculative_tokens": k}
        c[f"dspark-k{k}{LOOKUP}"] = dict(c[f"dspark-k{k}"])
    c["dspark-adaptive"] = {"method": "dspark", "model": dspark, "num_speculative_tokens": 7,
                            "enable_adaptive_verification": True}
    c["dspark-adaptive" + LOOKUP] = dict(c["dspark-adaptive"])
    for name in CONFIG_ENV:
        c[name] = dict(c["dspark-adaptive"])
    c["vllm-batch-schedule"] = {"method": "dspark", "model": dspark, "num_speculative_tokens": 7,
                                "num_speculative_tokens_per_batch_size": BATCH_SCHEDULE}
    c[NEVER_DRAFTS] = {"method": "dspark", "model": dspark, "num_speculative_tokens": 7,
                       "num_speculative_tokens_per_batch_size": one_length_schedule(0)}
    c[AA_CONTROL] = None
    for name in EAGER_CONTROLS:
        base = c[name.removesuffix(EAGER)]
        c[name] = None if base is None else dict(base)
    if drafter_b:  # a drafter A/B: the budget on a second drafter, beside the first
        c[DRAFTER_B] = {**c["dspark-adaptive"], "model": drafter_b}
    return c


def named_only(name: str) -> bool:
    """Whether a configuration runs only when --only names it (the A/Bs and controls)."""
    return name in NAMED_ONLY or name.endswith(LOOKUP)


def server_env(name: str) -> dict[str, str]:
    """The environment a configuration's server adds to the defaults."""
    return {**CONFIG_ENV.get(name, {}), **(LOOKUP_SWITCH if name.endswith(LOOKUP) else {})}


def server_groups(names: list[str], interleave: bool, instances: int) -> list[list[str]]:
    """The servers up at once, in start order, group after group. Sequential: one
    configuration at a time. Interleaved: all at once, repeats alternating between them, so
    drift over time hits every configuration alike. Each configuration is measured on
    `instances` fresh servers (a server instance carries a persistent speed of its own here,
    which interleaving does not remove), the order rotated each time so no configuration
    always starts first (or, sequentially, always runs first)."""
    if instances < 1:
        raise ValueError(f"--instances {instances}: use 1 or more")
    out = []
    for i in range(instances):
        order = names[i % len(names):] + names[:i % len(names)] if names else []
        out += [order] if interleave else [[n] for n in order]
    return out


def prompt_set(n: int) -> list[list[dict]]:
    """n prompts: a third each held-out GSM8K, HumanEval and Spec-Bench (its categories in
    turn), interleaved GSM8K, HumanEval, Spec-Bench, ... A load point reads a window of
    consecutive prompts (a few at one request), so every window must hold the whole mix:
    blocks of one source would measure the low loads on GSM8K alone."""
    from dspark_vllm.datasets import gsm8k_heldout, humaneval, load_eval_set

    by_cat: dict[str, list[dict]] = {}
    for p in load_eval_set("spec_bench", per_category=3, seed=1):
        by_cat.setdefault(p["category"], []).append(p)
    spec = [ps[i] for i in range(3) for ps in by_cat.values() if i < len(ps)]
    sources = [gsm8k_heldout(), humaneval(), spec]
    most = min(map(len, sources))
    if not 3 <= n <= 3 * most:
        raise ValueError(f"--prompts {n}: use 3 to {3 * most} (a third each from held-out "
                         f"GSM8K, HumanEval and {len(spec)} Spec-Bench first turns)")
    return [src[i]["messages"] for i in range(n // 3) for src in sources]


def measure_once(server, prompts, conc, reqs, warmup, rep, open_rate=None) -> dict:
    """One repeat of one load point (prompts rotated by the repeat index)."""
    url = server.url
    before, (kinds0, loads0) = server.metrics(), _ledger(server)
    t0 = time.perf_counter()
    if open_rate:
        res, window = asyncio.run(open_loop(url, prompts[rep:] + prompts[:rep], open_rate * conc,
                                            reqs, MAX_TOKENS, seed=rep, warmup=warmup))
        full = None
    else:
        res, window, full = asyncio.run(closed_loop(url, prompts[rep:] + prompts[:rep], conc,
                                                    reqs, MAX_TOKENS, warmup=warmup))
    wall = time.perf_counter() - t0
    after, (kinds1, loads1) = server.metrics(), _ledger(server)
    s = summarize(res, window)
    if full is not None:
        s["full_concurrency_throughput_tok_s"] = full
    s.update(ledger_summary(kinds0, kinds1, wall))
    s.update(load_split(loads0, loads1, conc))
    d = metrics_delta(before, after)
    drafts = metric_sum(d, "vllm:spec_decode_num_drafts_total")
    s["acceptance_length"] = acceptance_length(d) or 1.0
    verified = metric_sum(d, "vllm:spec_decode_num_draft_tokens_total")
    # Per request-step, steps that drafted nothing included: every request-step emits
    # one token plus its accepted drafts, so request-steps = generated - accepted.
    steps = metric_sum(d, "vllm:generation_tokens_total") - \
        metric_sum(d, "vllm:spec_decode_num_accepted_tokens_total")
    s["verified_drafts_per_request_step"] = verified / steps if steps > 0 else 0.0
    s["drafted_step_share"] = drafts / steps if steps > 0 else 0.0
    for phase in PHASES:  # load-aware budget only (its metrics)
        key = f'dspark_phase_seconds_total{{phase="{phase}"}}'
        if key in d:
            s[f"{phase}_seconds"] = d[key]
    return s


def _ledger(server) -> tuple[dict, dict]:
    """The server's step ledger now: (steps_by_kind, steps_by_load); empty without one."""
    status = (server.status() or {}).get("status") or {}
    return status.get("steps_by_kind") or {}, status.get("steps_by_load") or {}


def aggregate(runs: list[dict], status: dict | None) -> dict:
    """Medians over repeats (all server instances), the spread of the headline numbers,
    the medians per server instance, and the scheduler status (the last instance's)."""
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and v is not None
            and k != "instance"]
    med = {k: statistics.median(r[k] for r in runs if r.get(k) is not None) for k in keys}
    spread = {k: (min(r[k] for r in runs), max(r[k] for r in runs)) for k in
              ("per_user_tok_s", "throughput_tok_s") if all(r.get(k) for r in runs)}
    out = {"median": med, "spread": spread, "runs": runs}
    for key in ("throughput_tok_s", "full_concurrency_throughput_tok_s"):
        by_instance = {}
        for r in runs:
            if r.get(key) is not None:
                by_instance.setdefault(r.get("instance", 0), []).append(r[key])
        if by_instance:
            out[f"instance_{key}"] = [statistics.median(v) for _, v in sorted(by_instance.items())]
    if status and status.get("status"):  # the budget's cost lines and gate arms, as left
        out["scheduler_status"] = status["status"]
    return out


def budget_server(spec: dict | None) -> bool:
    """Does this server run the load-aware budget? (its own scheduler, with the step ledger,
    and a start-up cost profile, patches/cost_profile.py)"""
    return bool(spec and spec.get("method") == "dspark"
                and spec.get("enable_adaptive_verification"))


def _server(target, name, spec, out, args, instance: int = 0) -> VllmServer:
    extra = ["--max-num-seqs", str(max(args.concurrency))]
    if not args.prefix_caching:
        # The sweep replays a small prompt set, so with prefix caching most prompts would be
        # prefilled from cache, and unevenly: vLLM's EAGLE servers (MTP-1) drop the last
        # cached block for the drafter and, with the CPU's 128-token blocks, miss on nearly
        # every prompt here (DSpark keeps it). A replay artifact, not a property of
        # decoding: off for every server unless --prefix-caching.
        extra += ["--no-enable-prefix-caching"]
    if args.executor:
        extra += ["--distributed-executor-backend", args.executor]
    if args.ledger and not budget_server(spec):
        extra += ["--scheduler-cls", LEDGER_SCHEDULER_CLS]  # the budget's scheduler has one
    log = out / (f"{name}.log" if instance == 0 else f"{name}-{instance + 1}.log")
    return VllmServer(target, spec=spec, log_path=log,
                      enforce_eager=args.eager or name.endswith(EAGER),
                      dtype=args.dtype, max_model_len=2048,  # VLLM_PLUGINS: + /dspark/status
                      # every server, plain included, free of CPython's frame-stack cliff
                      # (patches/frame_stack.py), so none wins or loses by its call depth
                      env={"VLLM_PLUGINS": "dspark", FRAME_STACK_ENV: "1",
                           **server_env(name)},
                      args=extra)


def _point(name, c, point) -> None:
    m = point["median"]
    print(f"   {name} c={c:3d} per-user {m.get('per_user_tok_s', 0):6.1f} tok/s  throughput "
          f"{m['throughput_tok_s']:6.1f} tok/s  tau {m['acceptance_length']:.2f}  verified/step "
          f"{m['verified_drafts_per_request_step']:.2f}", flush=True)


def run_sweep(args) -> dict:
    from dspark_vllm.target import prepare_target

    target = str(prepare_target())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = prompt_set(args.prompts)
    cfgs = configs(args.drafter, args.mtp1, tuple(args.fixed), args.drafter_b)
    if args.only:
        cfgs = {k: v for k, v in cfgs.items() if k in args.only}
    else:  # the A/B variants only when named
        cfgs = {k: v for k, v in cfgs.items() if not named_only(k)}
    done = json.loads((out / "sweep.json").read_text())["results"] \
        if (out / "sweep.json").is_file() and args.resume else {}
    results = {k: r for k, r in done.items() if r.get("instances", 1) >= args.instances}
    cfgs = {k: v for k, v in cfgs.items() if k not in results}
    runs = {name: {c: [] for c in args.concurrency} for name in cfgs}
    status: dict[str, list] = {}  # per configuration, each finished instance's scheduler status

    def load_point(server, c, rep):
        reqs = max(args.requests_per_user * c, args.min_requests)
        return measure_once(server, prompts, c, reqs, warmup=c, rep=rep, open_rate=args.poisson)

    def save():
        for name, by_c in runs.items():
            last = (status.get(name) or [None])[-1]
            points = {str(c): aggregate(rs, last) for c, rs in by_c.items() if rs}
            if points:  # + every instance's status: its step ledger by load, its gate arms
                results[name] = {"spec": cfgs[name], "points": points,
                                 "instances": len(status.get(name, [])),
                                 "instance_status": [(s or {}).get("status")
                                                     for s in status.get(name, [])]}
        (out / "sweep.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))

    for group in server_groups(list(cfgs), args.interleave, args.instances):
        with ExitStack() as stack:
            servers, instance = {}, {name: len(status.get(name, [])) for name in group}
            for name in group:  # launch order = the group's order (rotated per instance)
                print(f"== {name} (server instance {instance[name] + 1}): {cfgs[name]}", flush=True)
                servers[name] = _server(target, name, cfgs[name], out, args, instance[name])
            t0 = time.time()
            # The budget's servers first, alone: their start-up cost profile is timed on
            # cores no other server is compiling on (beside them it reads contended, and
            # on a machine with no cached profile it would be, every sweep). Then the rest,
            # side by side.
            first = [s for n, s in servers.items() if budget_server(cfgs[n])]
            for batch in (first, [s for s in servers.values() if s not in first]):
                stack.enter_context(serving(*batch))
            print(f"   {len(servers)} up in {time.time() - t0:.0f}s", flush=True)
            for c in args.concurrency:
                for rep in range(args.repeats):
                    for name, server in servers.items():  # alternate (when interleaved)
                        r = load_point(server, c, rep)
                        runs[name][c].append({**r, "instance": instance[name]})
                for name in servers:
                    _point(name, c, aggregate(runs[name][c][-args.repeats:], None))
            for name, server in servers.items():
                status.setdefault(name, []).append(server.status())
        save()
    from benchmarks.report import write_report

    write_report(out, results, args.poisson, args.dtype)
    if os.environ.get(TRACE_ENV):  # which server wrote which step trace (step_trace --by-kind)
        name_servers(out, Path(os.environ[TRACE_ENV]))
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results/serving")
    p.add_argument("--drafter", default=str(BUNDLED_DRAFTER))
    p.add_argument("--drafter-b", default=None, metavar="DIR",
                   help=f"a second DSpark drafter, served as {DRAFTER_B} (the load-aware "
                        "budget) beside --drafter's configurations")
    p.add_argument("--mtp1", default=DEFAULT_MTP1)
    p.add_argument("--fixed", type=int, nargs="+", default=[2, 3, 5, 7])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--requests-per-user", type=int, default=3)
    p.add_argument("--min-requests", type=int, default=6)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--poisson", type=float, default=None,
                   help="open loop: Poisson arrivals at this rate per unit of concurrency (req/s)")
    p.add_argument("--only", nargs="+", default=None, help="subset of configuration names")
    p.add_argument("--resume", action="store_true", help="keep configurations already in sweep.json")
    p.add_argument("--eager", action="store_true",
                   help="--enforce-eager servers: start in seconds, but decode plainly ~10%% "
                        "slower on a CPU than compiled ones (vLLM's default, which users serve)")
    p.add_argument("--dtype", choices=NAMED_DTYPES, default="float32",
                   help="every server's --dtype, named (a sweep's report names its dtype); "
                        "bfloat16 pays on CPUs with AMX")
    p.add_argument("--instances", type=int, default=1,
                   help="measure each configuration on this many fresh server instances "
                        "(start order rotated); the report pairs them by instance")
    p.add_argument("--interleave", action="store_true",
                   help="start every server at once and alternate repeats between them, so "
                        "machine drift hits all configurations alike (needs RAM for all)")
    p.add_argument("--ledger", action="store_true",
                   help="run the other configurations on the step-ledger scheduler too (plain "
                        "vLLM scheduling + per-step-kind timing), for the ledger table")
    p.add_argument("--executor", choices=("mp", "uni"), default=None,
                   help="vLLM's --distributed-executor-backend for every server (default: "
                        "vLLM's choice, a separate worker process)")
    p.add_argument("--prefix-caching", action="store_true",
                   help="keep vLLM's prefix caching on (off by default: the sweep replays its "
                        "prompts, see _server)")
    p.add_argument("--quick", action="store_true", help="two configurations, tiny load (tests)")
    args = p.parse_args(argv)
    try:  # a bad --prompts or --instances is refused before any server starts
        prompt_set(args.prompts)
        server_groups([], args.interleave, args.instances)
    except ValueError as e:
        p.error(str(e))
    if args.poisson is not None and not args.poisson > 0:
        p.error(f"--poisson {args.poisson}: use a positive arrival rate (requests per second "
                "per unit of concurrency), or leave it out for closed-loop clients")
    saved = Path(args.out, "sweep.json")
    if args.resume and saved.is_file():  # one dtype per sweep: a resume must not mix two
        was = json.loads(saved.read_text())["args"].get("dtype", "float32")
        if was != args.dtype:
            p.error(f"--resume --dtype {args.dtype}: {saved} was measured with --dtype {was}; "
                    f"resume with --dtype {was}, or measure {args.dtype} into a new --out")
    if args.drafter_b and not Path(args.drafter_b, "config.json").is_file():
        p.error(f"--drafter-b {args.drafter_b}: no drafter there (no config.json)")
    known = configs(args.drafter, args.mtp1, tuple(args.fixed), args.drafter_b)
    unknown = [n for n in args.only or [] if n not in known]
    if unknown:
        p.error(f"--only {' '.join(unknown)}: not a configuration here; use any of "
                f"{', '.join(known)} (mtp-1 needs a head at --mtp1 {args.mtp1}, "
                f"{DRAFTER_B} a drafter at --drafter-b)")
    if args.quick:
        global MAX_TOKENS
        MAX_TOKENS = 16
        args.only = args.only or ["no-spec", "dspark-adaptive"]
        args.concurrency, args.requests_per_user, args.min_requests = [1, 2], 1, 2
        args.repeats, args.prompts, args.eager = 1, 6, True
    run_sweep(args)


if __name__ == "__main__":
    main()
