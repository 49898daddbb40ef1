"""Patch: VllmConfig._get_v1_model_runner_unsupported_features.

Why: vLLM 0.32 implements DSpark (and adaptive verification) only in its V2 GPU runner and
lists both as unsupported on V1, so `vllm serve --speculative-config '{"method": "dspark"}'`
fails on CPUs. This plugin implements both on V1; the wrapper drops exactly those two
entries when the method is dspark, after validating the DSpark setup (clear errors at
start-up), selecting the DSpark scheduler unless the user chose one, and keeping the last
cached prompt block that vLLM drops for EAGLE-like drafters (DSpark's drafter does not
need it recomputed; upstream excluding "dspark" from that drop removes this). It is also the one
hook vLLM runs on every config in the API server before the engine starts, so a server that
names the plain LedgerScheduler gets the /metrics collector for its step ledger here.
Removed by: upstream V1 support for method "dspark" (or a plugin hook for speculative
methods on the V1 runner).
"""

from __future__ import annotations

import functools
import logging
import os

from . import is_patched, mark

log = logging.getLogger("vllm.dspark.plugin")
REFUSED = ("dspark speculative decoding", "adaptive draft verification")
BLOCK_DROP_ENV = "DSPARK_EAGLE_BLOCK_DROP"


def apply(version_ok: bool, version: str) -> None:
    from vllm.config import VllmConfig

    orig = VllmConfig._get_v1_model_runner_unsupported_features
    if is_patched(orig):
        return

    @functools.wraps(orig)
    def _get_v1_model_runner_unsupported_features(self):
        unsupported = orig(self)
        sc = self.speculative_config
        if sc is None or sc.method != "dspark":
            if _names_ledger(self.scheduler_config.scheduler_cls):
                from ..metrics import register_collector

                register_collector()  # before the engine starts: it inherits the snapshot path
            return unsupported
        from ..config import SCHEDULER_CLS, DSparkServeConfig, supported_range

        if not version_ok:
            raise ValueError(f"dspark-vllm supports vllm{supported_range()}; this is vllm "
                             f"{version}. Install a supported vLLM or upgrade dspark-vllm.")
        serve = DSparkServeConfig.from_vllm_config(self)
        if serve.adaptive and self.scheduler_config.scheduler_cls is None:
            self.scheduler_config.scheduler_cls = SCHEDULER_CLS
        # Prefix caching: vLLM drops the last cached block for EAGLE-like methods, whose
        # drafter reads the hidden state of the token before the first new one. DSpark's
        # drafter reads only its own context K/V, cached with the block, so the block is
        # kept: with CPU's 128-token blocks dropping it loses most prompts' hits.
        # DSPARK_EAGLE_BLOCK_DROP=1 restores vLLM's behaviour (benchmarks/prefix_cache.py).
        if os.environ.get(BLOCK_DROP_ENV) != "1":
            sc.disable_eagle_block_drop = True
        serve.activate()
        from .. import plugin
        from ..metrics import register_collector

        if serve.adaptive:
            register_collector()  # before the engine starts: it inherits the snapshot path

        plugin.install_engine_patches()  # this process may host the engine (in-process mode)
        return [u for u in unsupported if u not in REFUSED]

    VllmConfig._get_v1_model_runner_unsupported_features = mark(
        _get_v1_model_runner_unsupported_features, "v1_gate")


def _names_ledger(cls) -> bool:
    """Whether --scheduler-cls is the step-ledger scheduler (a dotted path or the class)."""
    from ..config import LEDGER_SCHEDULER_CLS

    if not isinstance(cls, str):
        cls = f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', '')}"
    return cls == LEDGER_SCHEDULER_CLS
