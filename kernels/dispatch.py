"""What the proposer calls: the Triton kernel when it can run, the torch reference otherwise.

The fast path needs CUDA tensors on an Ampere-or-newer GPU and a Triton with a working CUDA
backend (vLLM swaps in a placeholder `triton` module on machines without one).  When it
declines, the reason is logged once per function and reason, and the reference (same
signature, same random stream) runs instead.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os

import torch

from . import reference
from .reference import Outputs

log = logging.getLogger(__name__)
_told: set[tuple[str, str]] = set()
_as_captured = contextvars.ContextVar("dspark_launch_as_captured", default=False)


@contextlib.contextmanager
def launching_as_captured():
    """Launch the kernels as a CUDA-graph capture records them (transition: two launches,
    no arrival counters). A warm-up before a capture runs under it, so it compiles and
    caches the very kernels the capture then records (dspark_vllm/block_graph.py)."""
    token = _as_captured.set(True)
    try:
        yield
    finally:
        _as_captured.reset(token)


def capturing(device: torch.device) -> bool:
    """Whether launches on `device` are (or are warming up to be) recorded in a CUDA graph."""
    return device.type == "cuda" and (_as_captured.get()
                                      or torch.cuda.is_current_stream_capturing())


@functools.lru_cache(maxsize=None)
def _backend_problem() -> str | None:
    """Why Triton cannot launch GPU kernels in this process (checked once), or None."""
    try:
        import triton
    except Exception as e:  # noqa: BLE001 - any import failure means no fast path
        return f"triton is not importable ({type(e).__name__}: {e})"
    if getattr(triton, "__file__", None) is None or not hasattr(triton, "runtime"):
        return "triton is a placeholder module (vLLM found no usable Triton backend)"
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "TRITON_INTERPRET=1 is set (the interpreter runs on host memory only)"
    try:
        target = triton.runtime.driver.active.get_current_target()
    except Exception as e:  # noqa: BLE001
        return f"triton has no active GPU driver ({type(e).__name__}: {e})"
    if target.backend != "cuda":
        return f"triton's active backend is {target.backend!r}; the kernels are tested on cuda"
    return None


@functools.lru_cache(maxsize=None)
def _device_problem(device: torch.device) -> str | None:
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:  # bf16 tensor-core dots and the tile plan assume Ampere or newer
        return f"{device} has compute capability {major}.{minor}, the kernels need >= 8.0"
    return None


def _why_not(*tensors: torch.Tensor) -> str | None:
    """None when the Triton kernel may run on these tensors, else the reason it may not."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        return f"tensors are on several devices {sorted(map(str, devices))}"
    device = devices.pop()
    if device.type != "cuda":
        return f"tensors are on {device}, the Triton kernels run on CUDA devices only"
    bad = [t.dtype for t in tensors if t.is_floating_point() and t.dtype not in
           (torch.float32, torch.bfloat16, torch.float16)]
    if bad:
        return f"unsupported dtype {bad[0]}"
    return _backend_problem() or _device_problem(device)


def _declined(name: str, *tensors: torch.Tensor) -> bool:
    why = _why_not(*tensors)
    if why is not None and (name, why) not in _told:
        _told.add((name, why))
        on_gpu = any(t.is_cuda for t in tensors)  # a slow path on a GPU deserves attention
        log.log(logging.WARNING if on_gpu else logging.INFO,
                "dspark %s: using the torch reference: %s", name, why)
    return why is not None


def _dense(*vectors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The per-row vectors as the Triton wrappers take them: contiguous (a column of a
    [B, K] tensor is strided; the references accept it, the kernels index it densely)."""
    return tuple(v.contiguous() for v in vectors)


def transition_step(
    base_logits: torch.Tensor,  # [B, V] U_k
    prev_ids: torch.Tensor,  # [B] int64 target-vocabulary id of x_{k-1}
    w1: torch.Tensor,  # [Vt, r]
    w2: torch.Tensor,  # [V, r]
    temperature: torch.Tensor,  # [B] float32, 0 = greedy
    seed: torch.Tensor,  # [B] int64
    position: torch.Tensor,  # [B] int64
    want_probs: bool = False,
    out_probs: torch.Tensor | None = None,  # [B, V] float32
    *,
    out: Outputs | None = None,  # preallocated (token, logprob, lse)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """-> token [B] int64, logprob [B] f32, lse [B] f32, probs [B, V] f32 or None
    (kernels.transition.transition_step_triton / kernels.reference.transition_step_ref)."""
    args = (base_logits, prev_ids, w1, w2, temperature, seed, position)
    if _declined("transition_step", *args):
        return reference.transition_step_ref(*args, want_probs, out_probs, out=out)
    from .transition import transition_step_triton
    return transition_step_triton(base_logits, *_dense(prev_ids), w1, w2,
                                  *_dense(temperature, seed, position), want_probs, out_probs,
                                  out=out)


@functools.lru_cache(maxsize=64)
def _greedy_rows(b: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero temperature [B] f32 and zero seed/position [B] int64 for an all-greedy step, made
    once per batch size: the kernel only reads them, and two fresh zero-filled tensors a
    step were a measurable part of its launch cost (README, kernels on a GPU)."""
    return (torch.zeros(b, device=device), torch.zeros(b, dtype=torch.int64, device=device))


def transition_argmax(
    base_logits: torch.Tensor,  # [B, V] U_k
    prev_ids: torch.Tensor,  # [B] int64
    w1: torch.Tensor,  # [Vt, r]
    w2: torch.Tensor,  # [V, r]
) -> torch.Tensor:
    """An all-greedy step's token [B] int64 alone (the same token transition_step gives at
    temperature 0); the Triton kernel where it runs, else reference.transition_argmax_ref."""
    if _declined("transition_step", base_logits, prev_ids, w1, w2):
        return reference.transition_argmax_ref(base_logits, prev_ids, w1, w2)
    from .transition import transition_step_triton
    temperature, seed_and_position = _greedy_rows(base_logits.shape[0], base_logits.device)
    return transition_step_triton(base_logits, *_dense(prev_ids), w1, w2, temperature,
                                  seed_and_position, seed_and_position)[0]


def transition_step_topk(
    topk_values: torch.Tensor,  # [B, k] base logits of the candidates
    topk_ids: torch.Tensor,  # [B, k] int64 draft-vocabulary ids
    prev_ids: torch.Tensor,  # [B] int64
    w1: torch.Tensor,  # [Vt, r]
    w2: torch.Tensor,  # [V, r]
    temperature: torch.Tensor,  # [B] float32
    seed: torch.Tensor,  # [B] int64
    position: torch.Tensor,  # [B] int64
    *,
    out: Outputs | None = None,
) -> Outputs:
    """-> token [B] int64 (draft id), logprob [B], lse [B] over the candidates
    (kernels.topk.transition_step_topk_triton / kernels.reference.transition_step_topk_ref)."""
    args = (topk_values, topk_ids, prev_ids, w1, w2, temperature, seed, position)
    if _declined("transition_step_topk", *args):
        return reference.transition_step_topk_ref(*args, out=out)
    from .topk import transition_step_topk_triton
    return transition_step_topk_triton(topk_values, topk_ids, *_dense(prev_ids), w1, w2,
                                       *_dense(temperature, seed, position), out=out)


def confidence(
    h: torch.Tensor,  # [B, H]
    prev_ids: torch.Tensor,  # [B] int64
    w1: torch.Tensor,  # [Vt, r]
    w: torch.Tensor,  # [H + r]
    b: torch.Tensor,  # [1]
) -> torch.Tensor:
    """-> c [B] float32 (kernels.confidence_head.confidence_triton / reference.confidence_ref)."""
    args = (h, prev_ids, w1, w, b)
    if _declined("confidence", *args):
        return reference.confidence_ref(*args)
    from .confidence_head import confidence_triton
    return confidence_triton(h, *_dense(prev_ids), w1, w, b)


def confidence_block(
    h: torch.Tensor,  # [B, K, H]
    prev_ids: torch.Tensor,  # [B, K] int64: x_{k-1} of every slot
    w1: torch.Tensor,  # [Vt, r]
    w: torch.Tensor,  # [H + r]
    b: torch.Tensor,  # [1]
    temps: torch.Tensor,  # [K]
) -> torch.Tensor:
    """Every slot's calibrated confidence -> [B, K] float32: one vectorised reference call,
    or the Triton kernel slot by slot (its weights carry the slot's temperature)."""
    if _declined("confidence", h, prev_ids, w1, w, b):
        return reference.confidence_block_ref(h, prev_ids, w1, w, b, temps)
    return torch.stack([confidence(h[:, k], prev_ids[:, k], w1, w / temps[k], b / temps[k])
                        for k in range(h.shape[1])], 1)
