"""Greedy exactness of served DSpark against plain decoding, compiled or eager.

    python -m benchmarks.exactness                # compiled servers (vLLM's default)
    python -m benchmarks.exactness --eager        # what the engine tests check, eagerly

Three float32 `vllm serve` processes on 127.0.0.1 (token ids are compared, and only float32
keeps them comparable: bfloat16 has near-ties that flip a token): plain decoding, DSpark
with K = 5 drafts, and DSpark with the load-aware budget (K <= 7). The tests' 52-prompt mix
(different output lengths) is answered greedily by the plain server one at a time, then by
each DSpark server under a concurrency ramp of 1, 4 and 8; every answer must be the plain
one, token for token. The engine tests check the eager servers on every run; compiled ones
take minutes to start (torch.compile), so this script checks them on demand. Writes a JSON
report and exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

CHECKED = ("dspark-k5", "dspark-adaptive")  # the DSpark servers held to plain's answers


def run(out: Path, eager: bool) -> dict:
    from dspark_vllm.serving import BUNDLED_DRAFTER, VllmServer, serving
    from dspark_vllm.target import prepare_target
    from tests.engine_utils import chat_all, output_lengths, prompt_mix, ramp

    t0 = time.time()
    target = str(prepare_target())
    prompts = prompt_mix()
    lengths = output_lengths(len(prompts))
    d = str(BUNDLED_DRAFTER)
    cfgs = {"plain": None,
            "dspark-k5": {"method": "dspark", "model": d, "num_speculative_tokens": 5},
            "dspark-adaptive": {"method": "dspark", "model": d, "num_speculative_tokens": 7,
                                "enable_adaptive_verification": True}}
    out.mkdir(parents=True, exist_ok=True)
    servers = {n: VllmServer(target, spec=s, max_model_len=1024, enforce_eager=eager,
                             log_path=out / f"{n}.log", env={"VLLM_PLUGINS": "dspark"})
               for n, s in cfgs.items()}
    report = {"compiled": not eager, "dtype": "float32", "prompts": len(prompts)}
    with serving(*servers.values()):
        report["startup_s"] = round(time.time() - t0)
        print(f"servers up after {report['startup_s']} s", flush=True)
        want = chat_all(servers["plain"].url, prompts, lengths, concurrency=1)
        for name in CHECKED:
            bad = []
            for conc, idx in ramp(len(prompts)):
                got = chat_all(servers[name].url, [prompts[i] for i in idx],
                               [lengths[i] for i in idx], concurrency=conc)
                bad += [i for i, g in zip(idx, got) if g != want[i]]
            report[name] = {"mismatched_prompts": bad}
            print(f"{name}: {len(prompts) - len(bad)} of {len(prompts)} identical", flush=True)
    report["seconds"] = round(time.time() - t0)
    (out / "exactness.json").write_text(json.dumps(report, indent=1))
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--eager", action="store_true", help="--enforce-eager servers")
    p.add_argument("--out", default="benchmarks/results/exactness")
    args = p.parse_args(argv)
    report = run(Path(args.out), args.eager)
    return 1 if any(report[n]["mismatched_prompts"] for n in CHECKED) else 0


if __name__ == "__main__":
    sys.exit(main())
