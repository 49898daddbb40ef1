"""`dspark`: the user's handle on everything that is not `vllm serve`."""

from __future__ import annotations

import argparse
import json
import logging
import sys


def _prepare_target(a: argparse.Namespace) -> None:
    from .target import prepare_target

    print(prepare_target(a.out, force=a.force))


def _make_data(a: argparse.Namespace) -> None:
    from .train.make_data import MakeDataConfig, make_data

    cfg = MakeDataConfig(out_dir=a.out, target=a.target, num_prompts=a.num_prompts,
                         max_new_tokens=a.max_new_tokens, shard_size=a.shard_size, seed=a.seed)
    print(make_data(cfg))


def _eval_acceptance(a: argparse.Namespace) -> None:
    from .evaluate import EvalConfig, evaluate, format_report

    cfg = EvalConfig(target=a.target, drafter=a.drafter, data=a.data, temperature=a.temperature,
                     max_new_tokens=a.max_new_tokens, limit=a.limit, per_category=a.per_category,
                     block_size=a.block_size, seed=a.seed, dtype=a.dtype)
    report = evaluate(cfg)
    print(format_report(report))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


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
    s.add_argument("--max-new-tokens", type=int, default=320)
    s.add_argument("--shard-size", type=int, default=384)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(fn=_make_data)

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
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    s.add_argument("--json", default=None, help="write the report here")
    s.set_defaults(fn=_eval_acceptance)
    return p


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = build_parser().parse_args(argv)
    try:
        args.fn(args)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"dspark {args.cmd}: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
