"""The random stream of `kernels/rng.py`, step for step in Triton (uint32 arithmetic wraps
mod 2^32 natively here; the torch twin emulates it in int64).  The constants are imported
from rng.py, so the two cannot drift apart."""

from __future__ import annotations

import triton
import triton.language as tl

from . import rng

FMIX_MUL_1 = tl.constexpr(rng.FMIX_MUL_1)
FMIX_MUL_2 = tl.constexpr(rng.FMIX_MUL_2)
GOLDEN = tl.constexpr(rng.GOLDEN)
KEY_SALT = tl.constexpr(rng.KEY_SALT)
UNIFORM_SHIFT = tl.constexpr(rng.UNIFORM_SHIFT)
UNIFORM_SCALE = tl.constexpr(rng.UNIFORM_SCALE)


@triton.jit
def fmix32(x):  # uint32 -> uint32
    x = x ^ (x >> 16)
    x = x * FMIX_MUL_1
    x = x ^ (x >> 13)
    x = x * FMIX_MUL_2
    return x ^ (x >> 16)


@triton.jit
def row_key(seed, position):  # int64 [...] -> uint32 [...]
    k = fmix32(seed.to(tl.uint32) ^ KEY_SALT)
    k = fmix32(k ^ (seed >> 32).to(tl.uint32))
    k = fmix32(k ^ position.to(tl.uint32))
    return fmix32(k ^ (position >> 32).to(tl.uint32))


@triton.jit
def gumbel(key, index):  # key uint32, index integer vocab ids (broadcast) -> float32
    x = fmix32((index.to(tl.uint32) * GOLDEN) ^ key)
    x = fmix32(x + key)
    u = ((x >> UNIFORM_SHIFT).to(tl.float32) + 0.5) * UNIFORM_SCALE
    return -tl.log(-tl.log(u))
