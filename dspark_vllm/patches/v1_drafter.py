"""Patch: GPUModelRunner.__init__ (also the base of the CPU model runner).

Why: the V1 runner picks its proposer from a fixed if/elif chain; for method "dspark" it
falls through to EagleProposer (use_eagle() includes dspark). After the runner is built we
replace that proposer with DSparkProposer and turn on the auxiliary hidden-state outputs
the drafter reads (as the chain does for DFlash).
Removed by: a proposer registry (or a DSpark branch) in GPUModelRunner.__init__.
"""

from __future__ import annotations

import functools

from . import is_patched, mark


def apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    orig = GPUModelRunner.__init__
    if is_patched(orig):
        return

    @functools.wraps(orig)
    def __init__(self, vllm_config, device, *args, **kwargs):
        orig(self, vllm_config, device, *args, **kwargs)
        sc = self.speculative_config
        if sc is not None and sc.method == "dspark" and hasattr(self, "drafter"):
            from ..proposer import DSparkProposer

            self.drafter = DSparkProposer(self.vllm_config, self.device, self)
            self.use_aux_hidden_state_outputs = True

    GPUModelRunner.__init__ = mark(__init__, "v1_drafter")
