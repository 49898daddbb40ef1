"""Patch: VllmConfig._get_v1_model_runner_unsupported_features.

Why: vLLM 0.32 implements DSpark (and adaptive verification) only in its V2 GPU runner and
lists both as unsupported on V1, so `vllm serve --speculative-config '{"method": "dspark"}'`
fails on CPUs. This plugin implements both on V1; the wrapper drops exactly those two
entries when the method is dspark, after validating the DSpark setup (clear errors at
start-up), selecting the DSpark scheduler unless the user chose one, and keeping the last
cached prompt block that vLLM drops for EAGLE-like drafters (DSpark's drafter does not
need it recomputed; upstream excluding "dspark" from that drop removes this). It is also the one
hook vLLM runs on every config in the API server before the engine starts, so every server
whose scheduler keeps the step ledger (DSpark's, or the plain LedgerScheduler under any
speculative method or none) gets the /metrics collector here.
Removed by: upstream V1 support for method "dspark" (or a plugin hook for speculative
methods on the V1 runner).
"""

from __future__ import annotations

import functools
import logging

from . import is_patched, mark

log = logging.getLogger("vllm.dspark.plugin")
REFUSED = ("dspark speculative decoding", "adaptive draft verification")


def apply(version_ok: bool, version: str) -> None:
    from vllm.config import VllmConfig

    orig = VllmConfig._get_v1_model_runner_unsupported_features
    if is_patched(orig):
        return

    @functools.wraps(orig)
    def _get_v1_model_runner_unsupported_features(self):
        unsupported = orig(self)
        sc = self.speculative_config
        if sc is not None and sc.method == "dspark":
            unsupported = _admit_dspark(self, unsupported, version_ok, version)
        if _keeps_ledger(self.scheduler_config.scheduler_cls):
            from ..metrics import register_collector

            register_collector()  # before the engine starts: it inherits the snapshot path
        return unsupported

    VllmConfig._get_v1_model_runner_unsupported_features = mark(
        _get_v1_model_runner_unsupported_features, "v1_gate")


def _admit_dspark(vc, unsupported: list[str], version_ok: bool, version: str) -> list[str]:
    """Validate a DSpark setup (clear errors at start-up), pick its scheduler, keep the last
    cached block, mark the environment; -> vLLM's list without the two DSpark refusals."""
    from .. import plugin
    from ..config import SCHEDULER_CLS, DSparkServeConfig, supported_range

    if not version_ok:
        raise ValueError(f"dspark-vllm supports vllm{supported_range()}; this is vllm "
                         f"{version}. Install a supported vLLM or upgrade dspark-vllm.")
    serve = DSparkServeConfig.from_vllm_config(vc)
    if serve.adaptive and vc.scheduler_config.scheduler_cls is None:
        vc.scheduler_config.scheduler_cls = SCHEDULER_CLS
    # Prefix caching: vLLM drops the last cached block for EAGLE-like methods, whose drafter
    # reads the hidden state of the token before the first new one. DSpark's drafter reads
    # only its own context K/V, cached with the block, so the block is kept: with CPU's
    # 128-token blocks dropping it loses most prompts' hits (benchmarks/prefix_cache.py).
    if serve.keep_cached_block:
        vc.speculative_config.disable_eagle_block_drop = True
    from vllm.platforms import current_platform

    from ..heap import bound_primitive_cache

    # Before the environment is marked (a bad capacity refuses the whole config) and
    # before the engine and worker start (they inherit it).
    bound_primitive_cache(current_platform.is_cpu())
    serve.activate()
    plugin.install_engine_patches()  # this process may host the engine (in-process mode)
    return [u for u in unsupported if u not in REFUSED]


def _keeps_ledger(cls) -> bool:
    """Whether the server's scheduler (a dotted path or the class) publishes the DSpark
    snapshot: the DSpark scheduler or the plain step-ledger scheduler."""
    from ..config import LEDGER_SCHEDULER_CLS, SCHEDULER_CLS

    if isinstance(cls, str):
        return cls in (SCHEDULER_CLS, LEDGER_SCHEDULER_CLS)
    from ..ledger_scheduler import LedgerScheduler

    return isinstance(cls, type) and issubclass(cls, LedgerScheduler)
