"""The one validated serving configuration, checked when vLLM builds its config.

Everything a user can get wrong is rejected at start-up with the bad value and what
would be accepted, never later in the middle of a request.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .drafter.checkpoint import check_checkpoint
from .drafter.config import DrafterConfigError, DSparkDrafterConfig
from .gate import WARM_BURSTS
from .heap import TRIM_INTERVAL_S
from .lookup import MAX_NGRAM

SUPPORTED_VLLM = ((0, 32), (0, 33))  # [min, max) of (major, minor)
SCHEDULER_CLS = "dspark_vllm.scheduler.DSparkScheduler"
LEDGER_SCHEDULER_CLS = "dspark_vllm.ledger_scheduler.LedgerScheduler"  # plain + step ledger
BLOCK_DROP_ENV = "DSPARK_EAGLE_BLOCK_DROP"  # "1": vLLM's EAGLE prefix-cache block drop
DEFER_ENV = "DSPARK_DEFER_CONTEXT"  # "0": write the drafter's context K/V every step
GRAPHS_ENV = "DSPARK_BLOCK_GRAPHS"  # "0": on a GPU the drafted block's walk runs eagerly
HANDOVER_ENV = "DSPARK_DRAFT_HANDOVER"  # "0": drafts reach the engine by vLLM's extra RPC
GATE_ENV = "DSPARK_GATE_VERDICT"  # what the draft gate measures by (gate.py)
FRAME_STACK_ENV = "DSPARK_FRAME_STACK"  # "0": off; "1": every engine (patches/frame_stack)
TRACE_ENV = "DSPARK_STEP_TRACE"  # a directory: every engine step as a JSON line (ledger_scheduler)
DRIFT_ENV = "DSPARK_CONFIDENCE_DRIFT"  # "1": rescale confidences to the acceptance served
HEAP_TRIM_ENV = "DSPARK_HEAP_TRIM"  # "1": the worker hands freed heap back (heap.py)
LOOKUP_ENV = "DSPARK_PROMPT_LOOKUP"  # N: prompt lookup beside the drafter, n-grams <= N
MAX_LOOKUP_NGRAM = 16
PRICE_ENV = "DSPARK_STEP_PRICE"  # how Algorithm 1 prices a step (budget.step_prices)
STEP_PRICES = {"hull": "the convex hull of the cheapest reachable step, the default",
               "envelope": "the cheapest reachable step alone"}
WARM_ENV = "DSPARK_GATE_WARM_BURSTS"  # the draft gate's warm bursts per load (gate.WARM_BURSTS)
WARM_CAPS = {str(WARM_BURSTS): f"up to {WARM_BURSTS} warm bursts per load until its verdict is "
             "in, the default", "4": "up to 4, the cap until 2026-12-06"}
GATE_VERDICTS = {"paired": "each exploration burst against the steps just before it, the default",
                 "arms": "each arm's running mean"}
ACTIVE_ENV = "DSPARK_VLLM_ACTIVE"  # set once a dspark config is validated; inherited by
# the engine and worker processes so the plugin patches only engines that serve DSpark


class DSparkConfigError(ValueError):
    pass


def _check_prompt_lookup(dcfg: DSparkDrafterConfig, vc, model: str) -> int:
    """DSPARK_PROMPT_LOOKUP (the longest n-gram matched; 0 or unset: off) switches prompt
    lookup on beside the drafter (lookup.py) -> that length. An environment switch, not
    vLLM's `prompt_lookup_max`: vLLM clears that key for every method with a draft model."""
    raw = os.environ.get(LOOKUP_ENV, "0")
    if not raw.isdigit() or int(raw) > MAX_LOOKUP_NGRAM:
        raise DSparkConfigError(
            f"{LOOKUP_ENV}={raw!r}: the longest n-gram prompt lookup matches, 1..{MAX_LOOKUP_NGRAM} "
            f"(lookup.MAX_NGRAM = {MAX_NGRAM} is what the tables are measured to), or 0 / "
            "unset for the drafter alone")
    n = int(raw)
    if n and (not dcfg.enable_confidence_head or dcfg.dspark_lookup_acceptance is None):
        raise DSparkConfigError(
            f"{LOOKUP_ENV}={n}: the drafter at {model!r} needs a confidence head and prompt "
            "lookup's acceptance table (dspark_lookup_acceptance in its config.json) to "
            "choose between the two blocks; measure the table with `dspark calibrate "
            "--lookup-only --drafter DIR --cache CACHE`")
    if n and vc.scheduler_config.async_scheduling:
        raise DSparkConfigError(
            f"{LOOKUP_ENV}={n} needs synchronous scheduling (lookup reads each request's "
            "tokens as the step leaves them); add --no-async-scheduling")
    return n


def _choice(name: str, default: str, meanings: dict[str, str]) -> str:
    """An environment choice (unset: `default`) -> its value; anything but a key of
    `meanings` is refused with what each value means."""
    value = os.environ.get(name, default)
    if value not in meanings:
        raise DSparkConfigError(f"{name}={value!r}: use " + " or ".join(
            f"{k}{' / unset' if k == default else ''} ({v})" for k, v in meanings.items()))
    return value


def _switch(name: str, default: str, one: str, zero: str) -> bool:
    """A 0/1 environment switch (unset: `default`) -> whether it is 1."""
    return _choice(name, default, {"1": one, "0": zero}) == "1"


def vllm_version_ok(version: str) -> bool:
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return False
    return SUPPORTED_VLLM[0] <= (major, minor) < SUPPORTED_VLLM[1]


def supported_range() -> str:
    (a, b), (c, d) = SUPPORTED_VLLM
    return f">={a}.{b},<{c}.{d}"


def _check_target_exposes_layers(mc) -> None:
    """vLLM hands a target's inner layers to a drafter only for models implementing its
    SupportsEagle3 interface (Llama, Qwen2/3, Mistral, Granite, ...); for any other it fails
    while loading, with a message that names neither the target nor what would work."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_eagle3

    try:
        cls, arch = ModelRegistry.resolve_model_cls(mc.architectures, mc)
    except Exception:  # an architecture vLLM cannot serve: vLLM says so itself
        return
    if not supports_eagle3(cls):
        raise DSparkConfigError(
            f"target {mc.model!r} ({arch}): vLLM cannot pass this architecture's inner layers "
            "to a drafter (its model class does not implement SupportsEagle3), so DSpark "
            "cannot serve it; Llama, Qwen2/Qwen3, Mistral and the other EAGLE-3-capable "
            "families can. Training and `dspark eval-acceptance` work for any causal LM.")


@dataclass
class DSparkServeConfig:
    drafter_dir: Path
    drafter: DSparkDrafterConfig
    num_speculative_tokens: int
    adaptive: bool
    """Load-aware verification budget (upstream's `enable_adaptive_verification`)."""
    probabilistic: bool
    """Drafts sampled from the draft distribution, verified with its probabilities."""
    keep_cached_block: bool = True
    """Keep the last cached prompt block vLLM drops for EAGLE-like drafters (BLOCK_DROP_ENV)."""
    prompt_lookup_max: int = 0
    """Prompt lookup beside the drafter up to this n-gram length (LOOKUP_ENV); 0: off."""

    @classmethod
    def from_vllm_config(cls, vc) -> DSparkServeConfig:
        sc = vc.speculative_config
        where = "--speculative-config"
        model = getattr(sc.draft_model_config, "model", None) or sc.model
        path = Path(str(model))
        if not path.is_dir():
            raise DSparkConfigError(
                f"{where} model={str(model)!r}: not a local drafter directory (a "
                "Qwen3DSparkModel checkpoint: config.json + *.safetensors)")
        _check_target_exposes_layers(vc.model_config)  # before any drafter-vs-target check
        try:
            dcfg = DSparkDrafterConfig.load(path)
            t = vc.model_config.hf_config
            t = getattr(t, "get_text_config", lambda: t)()
            dcfg.check_target(hidden_size=t.hidden_size, vocab_size=t.vocab_size,
                              num_hidden_layers=t.num_hidden_layers,
                              source=f"target {vc.model_config.model!r}")
            check_checkpoint(path, dcfg)
        except DrafterConfigError as e:
            raise DSparkConfigError(f"{where} model={str(model)!r}: {e}") from None
        k = sc.num_speculative_tokens
        if not 1 <= k <= dcfg.block_size:
            raise DSparkConfigError(
                f"{where} num_speculative_tokens={k}: the drafter was trained with "
                f"block_size={dcfg.block_size}; use 1..{dcfg.block_size}")
        if dcfg.markov_rank == 0:
            raise DSparkConfigError(
                f"{where} model={str(model)!r}: markov_rank=0 is a purely parallel drafter; "
                "serving needs the transition head (use it with `dspark eval-acceptance`)")
        pc = vc.parallel_config
        if pc.tensor_parallel_size != 1 or pc.pipeline_parallel_size != 1:
            raise DSparkConfigError(
                f"--tensor-parallel-size {pc.tensor_parallel_size} / --pipeline-parallel-size "
                f"{pc.pipeline_parallel_size}: the V1 DSpark proposer runs the drafter and its "
                "sequential head unsharded on one worker; use 1 for both")
        adaptive = bool(sc.enable_adaptive_verification)
        if adaptive and vc.scheduler_config.async_scheduling:
            raise DSparkConfigError(
                f"{where} enable_adaptive_verification=true needs synchronous scheduling "
                "(the budget reads each step's confidences); add --no-async-scheduling")
        lookup_max = _check_prompt_lookup(dcfg, vc, str(model))
        drop = _switch(BLOCK_DROP_ENV, "0", "drop the last cached prompt block, vLLM's EAGLE "
                       "behaviour", "keep it, DSpark's default")
        # Read in the worker (proposer) and in each process (plugin); validated here, once.
        _switch(DEFER_ENV, "1", "steps that draft nothing defer the drafter's context K/V to "
                "one batched write, the default", "write it every step")
        _switch(GRAPHS_ENV, "1", "on a GPU the drafted block's walk replays from CUDA graphs "
                "(block_graph.py), the default", "it runs eagerly")
        _switch(HANDOVER_ENV, "1", "a step's drafts ride its output to the engine, the default",
                "vLLM's separate take_draft_token_ids RPC")
        _switch(FRAME_STACK_ENV, "1", "the forward at a frame depth that keeps CPython's frame "
                "stack from thrashing (patches/frame_stack.py), the default", "as vLLM calls it")
        _switch(HEAP_TRIM_ENV, "0", "the worker hands its freed heap back to the system every "
                f"{TRIM_INTERVAL_S:g} s (heap.py: flatter memory, 3-8% less throughput)",
                "glibc keeps it, the default")
        _choice(GATE_ENV, "paired", GATE_VERDICTS)
        _choice(PRICE_ENV, "hull", STEP_PRICES)
        _choice(WARM_ENV, str(WARM_BURSTS), WARM_CAPS)
        _switch(DRIFT_ENV, "0", "confidences rescaled per position to the acceptance served "
                "(budget.ConfidenceDrift, experimental)", "the drafter's confidences as they "
                "are, the default")
        return cls(drafter_dir=path, drafter=dcfg, num_speculative_tokens=k, adaptive=adaptive,
                   probabilistic=sc.draft_sample_method == "probabilistic",
                   keep_cached_block=not drop, prompt_lookup_max=lookup_max)

    def activate(self) -> None:
        os.environ[ACTIVE_ENV] = "1"
