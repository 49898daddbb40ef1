"""Run as `python -m tests.context_debt_check --defer 0|1 --prefix-caching 0|1 [--handover 0|1]`: one engine
(in this process) on the bundled target and drafter, drafting only when it holds a single
request (vLLM's batch-size schedule with K = 0 above one), fed in three phases:

  1. A (long) and B together: no drafts; their context K/V is owed (deferred) or written;
  2. B finishes, A runs alone and drafts: A's owed context is written first; D joins for
     a few steps (the step it joins verifies A's drafts and drafts nothing after);
  3. C, B's prompt again, alone: with the prefix cache on its prompt blocks are B's,
     drafter K/V included (written when B left), and it drafts from its first step.

Prints one JSON line: the outputs, vLLM's draft and acceptance counters, and the context
rows the drafter computed, and how often the engine asked the worker for drafts by RPC
(none when the drafts ride each step's output), and how many steps' context slots (the
target's slot mapping) differed from the drafter's block-table formula, and how many
steps' proposer inputs from the undrafted-inputs shortcut differed from vLLM's own
preparation. Either way, the drafts must be the same."""

from __future__ import annotations

import argparse
import json
import os


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--defer", choices=("0", "1"), required=True)
    p.add_argument("--prefix-caching", choices=("0", "1"), required=True)
    p.add_argument("--handover", choices=("0", "1"), default="1")
    args = p.parse_args(argv)
    os.environ["DSPARK_DEFER_CONTEXT"] = args.defer
    os.environ["DSPARK_DRAFT_HANDOVER"] = args.handover
    import torch
    from vllm import SamplingParams

    from benchmarks.engine_profile import in_process_llm
    from dspark_vllm.datasets import encode_chat, gsm8k_heldout, humaneval
    from dspark_vllm.serving import BUNDLED_DRAFTER

    spec = {"method": "dspark", "model": str(BUNDLED_DRAFTER), "num_speculative_tokens": 5,
            "num_speculative_tokens_per_batch_size": [[1, 1, 5], [2, 1024, 0]]}
    slots = {"checked": 0, "mismatched": 0}  # the context slots against the block table
    from dspark_vllm.proposer import DSparkProposer

    context_slots = DSparkProposer._context_slots

    def checked_slots(self, target_positions, cad, bounds):
        pos, got = context_slots(self, target_positions, cad, bounds)
        # the slot of position p of request r: block_table[r, p // bs] * bs + p % bs
        req = torch.repeat_interleave(torch.arange(len(bounds) - 1), bounds.diff())
        table, bs = cad.block_table_tensor, self.block_size
        want = table[req, pos // bs].long() * bs + pos % bs
        slots["checked"] += 1
        slots["mismatched"] += not torch.equal(got, want)
        return pos, got

    DSparkProposer._context_slots = checked_slots
    undrafted = _compare_undrafted_inputs()
    llm = in_process_llm(spec, max_num_seqs=4, enable_prefix_caching=args.prefix_caching == "1",
                         disable_log_stats=False)
    tok = llm.get_tokenizer()
    a = encode_chat(tok, gsm8k_heldout()[0]["messages"])
    b = encode_chat(tok, humaneval()[32]["messages"])  # 311 tokens: 2 full 128-token blocks
    d = encode_chat(tok, gsm8k_heldout()[1]["messages"])
    eng = llm.llm_engine
    executor = eng.engine_core.engine_core.model_executor  # in-process engine core
    rpcs = [0]
    take = executor.take_draft_token_ids

    def counted_take():
        rpcs[0] += 1
        return take()

    executor.take_draft_token_ids = counted_take
    out: dict[str, list[int]] = {}

    def add(reqs: dict[str, tuple[list[int], int]]) -> None:
        for rid, (ids, n) in reqs.items():
            eng.add_request(rid, {"prompt_token_ids": ids},
                            SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))

    def run(reqs, join_at: int = -1, join=None) -> None:
        add(reqs)
        steps = 0
        while eng.has_unfinished_requests():
            if steps == join_at:
                add(join)
            steps += 1
            for o in eng.step():
                if o.finished:
                    out[o.request_id] = list(o.outputs[0].token_ids)

    # D joins while A drafts alone: that step verifies A's drafts and drafts nothing after.
    run({"A": (a, 90), "B": (b, 24)}, join_at=35, join={"D": (d, 6)})
    run({"C": (b, 48)})
    counters = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
    drafter = eng.model_executor.driver_worker.worker.model_runner.drafter
    print(json.dumps({
        "prompt_tokens": [len(a), len(b)], "outputs": out,
        "drafts": counters.get("vllm:spec_decode_num_drafts"),
        "accepted": counters.get("vllm:spec_decode_num_accepted_tokens"),
        "context_rows_written": drafter.context_rows_written,
        "context_rows_dropped": drafter.context_rows_dropped,
        "still_owed": len(drafter.debt), "draft_rpcs": rpcs[0],
        "context_slots": slots, "undrafted_inputs": undrafted}), flush=True)


def _compare_undrafted_inputs() -> dict[str, int]:
    """On every step the undrafted-inputs shortcut takes (patches/undrafted_inputs.py), run
    vLLM's own preparation too, with the proposer's propose() captured rather than run, and
    count the steps whose proposer inputs (positions, target layers, query offsets, slot
    mapping, batch size) differ."""
    import torch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from dspark_vllm.patches import mark, undrafted_inputs

    undrafted_inputs.apply()  # the plugin applies it again when the engine starts: a no-op
    shortcut = GPUModelRunner.propose_draft_token_ids
    vllm_path = shortcut.__wrapped__
    counts = {"checked": 0, "mismatched": 0, "after_drafts": 0}

    def captured(runner, path, args):
        seen = []
        runner.drafter.propose = lambda *a, **kw: seen.append((a, kw)) or torch.empty(0, 0)
        try:
            path(runner, *args)
        finally:
            del runner.drafter.propose  # the class's propose again
        (a, kw), = seen
        n = a[0] if a else kw["num_speculative_tokens"]
        cad = kw["common_attn_metadata"]
        rows = int(cad.query_start_loc_cpu[-1])
        return (n, kw["target_positions"][:rows].clone(),
                kw["target_hidden_states"][:rows].clone(), cad.query_start_loc_cpu.clone(),
                cad.slot_mapping[:rows].clone(), cad.batch_size())

    def compared(self, scheduler_output, *args):
        aux_hidden_states = args[4]  # the runner's positional arguments after the output
        if undrafted_inputs.context_inputs(self, scheduler_output, aux_hidden_states) is not None:
            ours = captured(self, shortcut, (scheduler_output, *args))
            ref = captured(self, vllm_path, (scheduler_output, *args))
            counts["checked"] += 1
            spec = args[5]  # the step's SpecDecodeMetadata: did it verify drafts?
            counts["after_drafts"] += spec is not None and spec.max_spec_len > 0
            counts["mismatched"] += not all(
                torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
                for a, b in zip(ours, ref))
        return shortcut(self, scheduler_output, *args)

    # marked as the patch, so the plugin's apply() at engine start leaves it in place
    GPUModelRunner.propose_draft_token_ids = mark(compared, "undrafted_inputs")
    return counts


if __name__ == "__main__":
    main()
