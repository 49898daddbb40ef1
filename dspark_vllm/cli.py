"""`dspark`: the user's handle on everything that is not `vllm serve`."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from .hardware import DTYPES, FEAT_DTYPES, NAMED_DTYPES


def _prepare_target(a: argparse.Namespace) -> None:
    from .target import prepare_target

    print(prepare_target(a.out, force=a.force))


def _make_data(a: argparse.Namespace) -> None:
    from .datasets import parse_mix
    from .train.make_data import MakeDataConfig, make_data

    cfg = MakeDataConfig(out_dir=a.out, target=a.target, num_prompts=a.num_prompts,
                         first_prompt=a.first_prompt, max_new_tokens=a.max_new_tokens,
                         shard_size=a.shard_size, seed=a.seed,
                         mix=None if a.mix is None else parse_mix(a.mix))
    print(make_data(cfg))


def _build_cache(a: argparse.Namespace) -> None:
    from .drafter.config import default_target_layer_ids
    from .target import load_target, resolve_target
    from .train.cache import build_cache

    target = str(resolve_target(a.target))
    layers = a.layers or default_target_layer_ids(
        load_target(target, tokenizer=False)[0].config.num_hidden_layers, 5)
    c = build_cache(a.data, a.out, target, layers, max_gb=a.max_gb, dtype=a.dtype, limit=a.limit,
                    feat_dtype=a.feature_dtype)
    print(f"{c.root}: {len(c)} sequences, {c.info.offsets[len(c)]} tokens, layers {layers}")


def _train(a: argparse.Namespace) -> None:
    from .train.recipe import VARIANTS
    from .train.trainer import TrainConfig, train

    shape = [k for k in ("num_layers", "markov_rank", "block_size", "draft_vocab_size",
                         "mask_token_id", "markov_init") if getattr(a, k) is not None]
    if a.init_from and (shape or a.variant != "dspark-2l"):
        given = [f"--{k.replace('_', '-')}" for k in shape] or [f"--variant {a.variant}"]
        raise SystemExit(f"--init-from {a.init_from}: the drafter's shape comes from its "
                         f"checkpoint; drop {', '.join(given)}")
    if a.variant == "mtp-1":
        from .train.eagle import EagleConfig, train_eagle

        print(train_eagle(EagleConfig(cache=a.cache, out=a.out, target=a.target,
                                      epochs=a.epochs, max_steps=a.max_steps)))
        return

    cfg = TrainConfig(cache=a.cache, out=a.out, target=a.target, epochs=a.epochs,
                      data_fraction=a.data_fraction, init_from=a.init_from, **VARIANTS[a.variant])
    for k in ("num_layers", "markov_rank", "block_size", "lr", "batch_size", "anchors",
              "max_steps", "draft_vocab_size", "mask_token_id", "markov_init", "seed"):
        if getattr(a, k) is not None:
            setattr(cfg, k, getattr(a, k))
    print(train(cfg))


def _calibrate(a: argparse.Namespace) -> None:
    from .train.calibrate import calibrate, calibrate_lookup

    rep = calibrate_lookup(a.drafter, a.cache) if a.lookup_only else \
        calibrate(a.drafter, a.cache, a.target, max_blocks=a.max_blocks)
    print(json.dumps(rep, indent=2))


def _recipe(a: argparse.Namespace) -> None:
    from .train.recipe import RecipeConfig, run_recipe

    cfg = RecipeConfig(out=a.out, target=a.target, variants=tuple(a.variants.split(",")),
                       num_prompts=a.num_prompts, epochs=a.epochs, quick=a.quick,
                       data_fractions=tuple(float(x) for x in a.data_fractions.split(",")),
                       batch_size=a.batch_size, markov_init=a.markov_init,
                       feature_dtype=a.feature_dtype)
    print(json.dumps(run_recipe(cfg), indent=2))


def _eval_acceptance(a: argparse.Namespace) -> None:
    from .evaluate import EvalConfig, evaluate, format_report

    cfg = EvalConfig(target=a.target, drafter=a.drafter, data=a.data, temperature=a.temperature,
                     max_new_tokens=a.max_new_tokens, limit=a.limit, per_category=a.per_category,
                     block_size=a.block_size, seed=a.seed, dtype=a.dtype,
                     prompt_lookup=a.prompt_lookup)
    report = evaluate(cfg)
    print(format_report(report))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


def _audit(a: argparse.Namespace) -> None:
    from .audit import audit, format_audit

    r = audit(a.samples, a.seed)
    print(format_audit(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=2)


def _demo(a: argparse.Namespace) -> None:
    from .demo import run_demo

    run_demo(a.drafter, a.num_speculative_tokens, not a.fixed, a.max_tokens, a.log, a.dtype,
             a.eager, not a.no_prompt_lookup)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dspark", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("prepare-target", help="convert the embedded SmolLM2 target to a HF directory")
    s.add_argument("--out", default=None, help="directory (default: ~/.cache/dspark-vllm/...)")
    s.add_argument("--force", action="store_true")
    s.set_defaults(fn=_prepare_target)

    s = sub.add_parser("make-data", help="regenerate training responses with the target (vLLM)")
    s.add_argument("--out", required=True)
    s.add_argument("--target", default="default")
    s.add_argument("--num-prompts", type=int, default=4500)
    s.add_argument("--first-prompt", type=int, default=0,
                   help="skip this many prompts of the mix (add data to an earlier run)")
    s.add_argument("--max-new-tokens", type=int, default=320)
    s.add_argument("--shard-size", type=int, default=384)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--mix", default=None, metavar="CATEGORY=SHARE[,...]",
                   help="prompt categories and shares, e.g. libcode=1 or math=0.5,longform=0.5 "
                        "(default: the training mix, math 0.45, code 0.20, t0 0.30, instruct 0.05)")
    s.set_defaults(fn=_make_data)

    s = sub.add_parser("build-cache", help="run the target once over make-data output")
    s.add_argument("--data", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--target", default="default")
    s.add_argument("--layers", type=lambda x: [int(i) for i in x.split(",")], default=None)
    s.add_argument("--max-gb", type=float, default=9.5)
    s.add_argument("--limit", type=int, default=None, help="first N sequences only (a trial run)")
    s.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="the target's compute dtype; auto = bfloat16 on CPUs with native bf16")
    s.add_argument("--feature-dtype", default="float16", choices=FEAT_DTYPES,
                   help="storage of the drafter's input features (float8 halves their disk)")
    s.set_defaults(fn=_build_cache)

    s = sub.add_parser("train", help="distil a drafter from a feature cache")
    s.add_argument("--cache", required=True, nargs="+",
                   help="feature cache directory; several are read as one (more data)")
    s.add_argument("--out", required=True)
    s.add_argument("--target", default="default")
    s.add_argument("--variant", default="dspark-2l",
                   choices=["dspark-2l", "parallel-2l", "parallel-5l", "mtp-1"])
    s.add_argument("--epochs", type=float, default=4.0)
    s.add_argument("--data-fraction", type=float, default=1.0)
    for k, t in (("num-layers", int), ("markov-rank", int), ("block-size", int), ("lr", float),
                 ("batch-size", int), ("anchors", int), ("max-steps", int),
                 ("draft-vocab-size", int), ("mask-token-id", int), ("seed", int)):
        s.add_argument(f"--{k}", type=t, default=None)
    s.add_argument("--markov-init", default=None, choices=["zero", "bigram"],
                   help="transition head start: the data's bigram PMI, rank-reduced "
                        "(default), or zero (the parallel drafter)")
    s.add_argument("--init-from", default=None, metavar="DRAFTER_DIR",
                   help="continue training a drafter (this package's or upstream's "
                        "Qwen3DSparkModel checkpoint) on this cache; its shape is kept")
    s.set_defaults(fn=_train)

    s = sub.add_parser("calibrate", help="Sequential Temperature Scaling of the confidence head")
    s.add_argument("--drafter", required=True)
    s.add_argument("--cache", required=True, nargs="+",
                   help="feature cache directory; several are read as one (more data)")
    s.add_argument("--target", default="default")
    s.add_argument("--max-blocks", type=int, default=4000)
    s.add_argument("--lookup-only", action="store_true",
                   help="measure prompt lookup's acceptance table alone (the confidence "
                   "temperatures stay as they are)")
    s.set_defaults(fn=_calibrate)

    s = sub.add_parser("recipe", help="make-data + cache + train + calibrate, resumable")
    s.add_argument("--out", required=True)
    s.add_argument("--target", default="default")
    s.add_argument("--variants", default="dspark-2l")
    s.add_argument("--data-fractions", default="1.0")
    s.add_argument("--num-prompts", type=int, default=4500)
    s.add_argument("--epochs", type=float, default=4.0)
    s.add_argument("--quick", action="store_true", help="minutes-sized run (tests)")
    s.add_argument("--batch-size", type=int, default=None, help="sequences per step (default 4)")
    s.add_argument("--markov-init", default=None, choices=["zero", "bigram"],
                   help="transition head start (default bigram)")
    s.add_argument("--feature-dtype", default="float16", choices=FEAT_DTYPES,
                   help="feature-cache storage (float8: half the feature disk, README)")
    s.set_defaults(fn=_recipe)

    s = sub.add_parser("eval-acceptance", help="offline acceptance length of a drafter")
    s.add_argument("--target", default="default")
    s.add_argument("--drafter", required=True, help="drafter directory, or 'random' (untrained)")
    s.add_argument("--data", default="gsm8k",
                   help="spec_bench | gsm8k | humaneval | path to a JSONL file")
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--max-new-tokens", type=int, default=128)
    s.add_argument("--limit", type=int, default=None, help="first N prompts")
    s.add_argument("--per-category", type=int, default=None, help="N prompts per category")
    s.add_argument("--block-size", type=int, default=None, help="drafts per round (<= block)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--dtype", default="float32", choices=NAMED_DTYPES)
    s.add_argument("--prompt-lookup", action="store_true",
                   help="prompt lookup beside the drafter: per round, the block expected to be "
                   "accepted further (needs the drafter's lookup table, `dspark calibrate`)")
    s.add_argument("--json", default=None, help="write the report here")
    s.set_defaults(fn=_eval_acceptance)
    s = sub.add_parser("demo", help="serve the bundled target + drafter, chat with it")
    s.add_argument("--drafter", default=None, help="drafter directory (default: bundled)")
    s.add_argument("--num-speculative-tokens", type=int, default=5)
    s.add_argument("--fixed", action="store_true", help="fixed draft length, no load-aware budget")
    s.add_argument("--no-prompt-lookup", action="store_true",
                   help="the drafter alone (default: prompt lookup beside it, DSPARK_PROMPT_LOOKUP)")
    s.add_argument("--max-tokens", type=int, default=160)
    s.add_argument("--log", default="dspark-demo-server.log", help="server log file")
    s.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="auto: bfloat16 where the CPU has AMX or AVX512-BF16, else float32")
    s.add_argument("--eager", action="store_true",
                   help="--enforce-eager: starts in seconds; plain decoding ~10%% slower on a CPU")
    s.set_defaults(fn=_demo)

    s = sub.add_parser("audit-causality", help="Appendix A: shipped vs peeking budget policy")
    s.add_argument("--samples", type=int, default=200_000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--json", default=None)
    s.set_defaults(fn=_audit)
    return p


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("httpx", "httpx2", "openai"):  # one line per HTTP request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        args.fn(args)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"dspark {args.cmd}: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
