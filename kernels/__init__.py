"""Fused DSpark transition-head kernels (Triton) beside their torch references.

  transition_step, transition_step_topk, confidence   dispatching entry points (kernels.dispatch);
  transition_argmax, confidence_block                 the all-greedy loop's lighter forms
  *_ref                                               torch references (kernels.reference)
  launching_as_captured                               launch as a CUDA-graph capture would
  *_triton                                            Triton wrappers, imported on first use so
                                                      that importing this package never needs
                                                      a working Triton
"""

from __future__ import annotations

from .dispatch import (confidence, confidence_block, launching_as_captured, transition_argmax,
                       transition_step, transition_step_topk)
from .reference import (confidence_block_ref, confidence_ref, transition_argmax_ref,
                        transition_step_ref, transition_step_topk_ref)

_LAZY = {
    "transition_step_triton": "transition",
    "transition_step_topk_triton": "topk",
    "confidence_triton": "confidence_head",
}

__all__ = ["transition_step", "transition_step_topk", "confidence", "transition_argmax",
           "confidence_block", "launching_as_captured", "transition_step_ref",
           "transition_step_topk_ref", "confidence_ref", "transition_argmax_ref",
           "confidence_block_ref", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
