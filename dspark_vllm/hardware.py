"""What this machine computes fast: the serving dtype depends on native bf16 support."""

from __future__ import annotations

import functools
from pathlib import Path

NAMED_DTYPES = ("float32", "bfloat16")  # a dtype named outright (a benchmark names its own)
DTYPES = ("auto", *NAMED_DTYPES)  # what preferred_dtype accepts
FEAT_DTYPES = ("float16", "float8")  # how build-cache may store the drafter's input features


@functools.cache
def cpu_has_native_bf16() -> bool:
    """AMX or AVX512-BF16. Without them bf16 matmuls are emulated (4x slower than fp32
    on the AVX512 machine this was measured on)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags for f in ("amx_bf16", "avx512_bf16"))


def preferred_dtype(requested: str = "auto") -> str:
    """`auto` -> 'bfloat16' on CUDA or a CPU with native bf16, else 'float32'."""
    if requested != "auto":
        return requested
    try:
        import torch

        if torch.cuda.is_available():
            return "bfloat16"
    except ImportError:
        pass
    return "bfloat16" if cpu_has_native_bf16() else "float32"
