"""vLLM plugin registration: thin, lazy, safe to call any number of times.

In every process vLLM starts, `register()` installs only the config gate (cheap). When a
config with method "dspark" is validated, the gate marks the environment and installs the
engine patches; engine and worker processes started afterwards inherit the mark and
install them at their own `register()`. Processes serving anything else stay untouched.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("vllm.dspark.plugin")
_state = {"registered": False, "engine": False}


def register() -> None:
    if _state["registered"]:
        return
    _state["registered"] = True
    import vllm

    from .config import ACTIVE_ENV, supported_range, vllm_version_ok
    from .patches import adaptive_gate, cpu_expand_batch, v1_gate

    ok = vllm_version_ok(vllm.__version__)
    if not ok:
        log.warning("dspark-vllm supports vllm%s, found %s: method 'dspark' will be refused",
                    supported_range(), vllm.__version__)
    v1_gate.apply(ok, vllm.__version__)
    # A correctness fix for every speculative method at temperature > 0 on CPU (the
    # MTP-1 baseline included), so it is not limited to DSpark engines.
    cpu_expand_batch.apply()
    if ok:
        adaptive_gate.apply()
    if ok and os.environ.get(ACTIVE_ENV) == "1":
        install_engine_patches()
    if ok:  # the CPython frame-stack fix, for engines that are not DSpark's when asked
        from .patches import frame_stack

        frame_stack.apply_if_wanted(dspark_engine=False)


def install_engine_patches() -> None:
    if _state["engine"]:
        return
    _state["engine"] = True
    from .patches import (cost_profile, cpu_seeded_sampling, draft_confidences,
                          draft_handover, frame_stack, undrafted_inputs, v1_drafter,
                          zero_draft_sampling)

    v1_drafter.apply()
    draft_confidences.apply()
    draft_handover.apply()
    zero_draft_sampling.apply()
    undrafted_inputs.apply()
    cpu_seeded_sampling.apply()
    cost_profile.apply()
    frame_stack.apply_if_wanted(dspark_engine=True)
    log.info("dspark-vllm: DSpark proposer installed on the V1 model runner")
