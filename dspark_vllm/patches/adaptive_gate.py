"""Patch: VllmConfig._validate_adaptive_verification.

Why: upstream's check is written for its V2 implementation, which trims the verification
batch inside full CUDA graphs; it rejects `enable_adaptive_verification` without them,
which a CPU engine never has. On the V1 runner the DSpark scheduler trims drafts before
the step is scheduled, so no graph constraint applies (pipeline parallelism is refused by
DSparkServeConfig). V2 engines keep upstream's check unchanged.
Removed by: upstream scoping the check to the V2 runner.
"""

from __future__ import annotations

import functools

from . import is_patched, mark


def apply() -> None:
    from vllm.config import VllmConfig

    orig = VllmConfig._validate_adaptive_verification
    if is_patched(orig):
        return

    @functools.wraps(orig)
    def _validate_adaptive_verification(self):
        sc = self.speculative_config
        if sc is not None and sc.method == "dspark" and not self.use_v2_model_runner:
            return
        return orig(self)

    VllmConfig._validate_adaptive_verification = mark(_validate_adaptive_verification,
                                                      "adaptive_gate")
