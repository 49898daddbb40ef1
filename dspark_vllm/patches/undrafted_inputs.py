"""Patch: GPUModelRunner.propose_draft_token_ids, for a step after which nothing is drafted.

Why: the V1 runner prepares the drafter's inputs on every step of a speculative engine:
`prepare_next_token_ids_padded` (a Python loop over the batch's requests, then a kernel)
and, once any step has carried drafts, `prepare_inputs_padded` (new attention metadata
and the rows to sample). When the DSpark budget asks for no drafts
(`num_spec_tokens_to_schedule == 0`, most steps under load) the proposer only records the
step's context rows (proposer._context_only): their positions, the captured target
layers and the step's own attention metadata, none of which that preparation changes
(`prepare_inputs_padded` keeps query_start_loc and slot_mapping; it only adds the rows to
sample). So such a step hands those over directly and skips the rest: the runner's
`sample_tokens` fell from 0.115-0.124 to 0.084-0.092 s per 96 steps at 16 requests on this
CPU (`benchmarks/engine_profile.py k0`, 2026-12-05).
Synchronous scheduling only: with async scheduling `_copy_valid_sampled_token_count`
publishes the next-token ids the following step reads, so vLLM's path runs.
Removed by: the runner skipping drafter input preparation when no drafts are scheduled.
"""

from __future__ import annotations

import functools

import torch

from . import is_patched, mark


def context_inputs(runner, scheduler_output, aux_hidden_states):
    """The undrafted step's context rows as the proposer reads them, or None when the
    shortcut does not apply. -> (positions [T], target layers [T, n_layers * H])."""
    from ..proposer import DSparkProposer

    spec = runner.speculative_config
    if (scheduler_output.num_spec_tokens_to_schedule != 0
            or not isinstance(runner.drafter, DSparkProposer)
            or runner.valid_sampled_token_count_event is not None  # async: vLLM's path
            or spec.disable_padded_drafter_batch or aux_hidden_states is None):
        return None
    n = scheduler_output.total_num_scheduled_tokens
    return runner._get_positions(n), torch.cat([h[:n] for h in aux_hidden_states], dim=-1)


def apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    orig = GPUModelRunner.propose_draft_token_ids
    if is_patched(orig):
        return

    @functools.wraps(orig)
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata,
                                hidden_states, sample_hidden_states, aux_hidden_states,
                                spec_decode_metadata, common_attn_metadata, slot_mappings):
        inputs = context_inputs(self, scheduler_output, aux_hidden_states)
        if inputs is None:
            return orig(self, scheduler_output, sampled_token_ids, sampling_metadata,
                        hidden_states, sample_hidden_states, aux_hidden_states,
                        spec_decode_metadata, common_attn_metadata, slot_mappings)
        self._draft_probs = None
        self._draft_prob_req_ids = None
        positions, feats = inputs
        return self.drafter.propose(0, target_hidden_states=feats, target_positions=positions,
                                    common_attn_metadata=common_attn_metadata)

    GPUModelRunner.propose_draft_token_ids = mark(propose_draft_token_ids, "undrafted_inputs")
