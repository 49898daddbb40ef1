"""Launch-time contract checks shared by the Triton wrappers (nano-vllm style: assert
shapes, dtypes, strides and devices before a kernel ever sees a pointer)."""

from __future__ import annotations

import functools
import os

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Debug aid for the parity tests: fill kernel scratch with NaN / -1 so a partial result that
# was never written poisons the output instead of silently reading stale memory.
POISON_SCRATCH = os.environ.get("DSPARK_KERNEL_POISON") == "1"


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def prev_pow2(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 1 elsewhere (the Triton interpreter)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def vector(name: str, t: torch.Tensor, n: int, dtype: torch.dtype, device: torch.device) -> None:
    assert t.shape == (n,), f"{name}: expected shape ({n},), got {tuple(t.shape)}"
    assert t.dtype == dtype, f"{name}: expected {dtype}, got {t.dtype}"
    assert t.is_contiguous(), f"{name}: must be contiguous"
    assert t.device == device, f"{name}: on {t.device}, expected {device}"


def rows(name: str, t: torch.Tensor, shape: tuple[int, ...], device: torch.device,
         dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES) -> None:
    """A 2-D operand read row by row: unit stride along the last dimension."""
    assert t.dim() == 2 and tuple(t.shape) == shape, \
        f"{name}: expected shape {shape}, got {tuple(t.shape)}"
    assert t.dtype in dtypes, f"{name}: dtype {t.dtype} not in {dtypes}"
    assert t.stride(1) == 1, f"{name}: last dimension must have stride 1, got {t.stride()}"
    assert t.device == device, f"{name}: on {t.device}, expected {device}"


def outputs(out, b: int, device: torch.device):
    """Preallocated (token int64 [B], logprob f32 [B], lse f32 [B]) or fresh ones."""
    if out is None:
        return (torch.empty(b, dtype=torch.int64, device=device),
                torch.empty(b, dtype=torch.float32, device=device),
                torch.empty(b, dtype=torch.float32, device=device))
    token, logprob, lse = out
    vector("out token", token, b, torch.int64, device)
    vector("out logprob", logprob, b, torch.float32, device)
    vector("out lse", lse, b, torch.float32, device)
    return out


def scratch(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if POISON_SCRATCH:
        return torch.full(shape, float("nan") if dtype.is_floating_point else -1, dtype=dtype,
                          device=device)
    return torch.empty(shape, dtype=dtype, device=device)
