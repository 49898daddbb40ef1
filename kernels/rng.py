"""Counter-based random stream for Gumbel-max sampling, in plain PyTorch.

Every draft token at temperature t > 0 is drawn as argmax_i(logits_i / t + g_i) with Gumbel
noise g_i = -log(-log(u_i)).  The uniform u_i is a pure function of (seed, position, i) so
the draw is reproducible, needs no generator state, and the Triton kernels (which
re-implement these exact integer steps in `kernels/rng_triton.py`) see the same stream:

  fmix32(x)         = murmur3's 32-bit finaliser:
                      x ^= x >> 16; x *= 0x85EBCA6B; x ^= x >> 13; x *= 0xC2B2AE35; x ^= x >> 16
  row_key(s, p)     = fmix32(fmix32(fmix32(fmix32(lo(s) ^ KEY_SALT) ^ hi(s)) ^ lo(p)) ^ hi(p))
  bits(key, i)      = fmix32(fmix32((i * GOLDEN) ^ key) + key)
  u(key, i)         = ((bits >> 9) + 0.5) * 2^-23          (23 bits: exact in float32, in (0, 1))

All arithmetic is modulo 2^32; lo/hi are the low/high 32 bits of the int64 (two's
complement), i is the vocabulary index (draft vocabulary).  The uniform's bits are identical
in both implementations; only the two logs may differ by an ulp between libm and the GPU.

Torch has no general uint32 arithmetic, so the values live in int64 in [0, 2^32) and every
product is split in 16-bit halves so that no intermediate overflows int64.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
FMIX_MUL_1 = 0x85EBCA6B  # murmur3 fmix32 constants (full avalanche)
FMIX_MUL_2 = 0xC2B2AE35
GOLDEN = 0x9E3779B9  # 2^32 / phi: odd, so i -> i * GOLDEN is a bijection mod 2^32
KEY_SALT = 0x6A09E667  # first word of SHA-256's IV: keeps seed 0 away from the zero state
UNIFORM_SHIFT = 9  # keep 23 bits: (m + 0.5) * 2^-23 is exact in float32 and never 0 or 1
UNIFORM_SCALE = 2.0 ** -23


def mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32) and a constant c < 2^32, without overflow."""
    lo = (x & 0xFFFF) * c  # < 2^48
    hi = (((x >> 16) * c) & 0xFFFF) << 16  # only the low 16 bits survive the shift mod 2^32
    return (lo + hi) & MASK32


def fmix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = mul32(x, FMIX_MUL_1)
    x = x ^ (x >> 13)
    x = mul32(x, FMIX_MUL_2)
    return x ^ (x >> 16)


def row_key(seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """[...] int64 seed, position -> [...] int64 key in [0, 2^32)."""
    k = fmix32((seed & MASK32) ^ KEY_SALT)
    k = fmix32(k ^ ((seed >> 32) & MASK32))
    k = fmix32(k ^ (position & MASK32))
    return fmix32(k ^ ((position >> 32) & MASK32))


def random_bits(key: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """key [...] and vocabulary index [...] (broadcast) -> uint32 values held in int64."""
    x = fmix32(mul32(index & MASK32, GOLDEN) ^ key)
    return fmix32((x + key) & MASK32)


def uniform(key: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Float32 uniforms in (0, 1), bit-identical to the Triton stream."""
    m = (random_bits(key, index) >> UNIFORM_SHIFT).to(torch.float32)
    return (m + 0.5) * UNIFORM_SCALE


def gumbel(seed: torch.Tensor, position: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """seed [B], position [B] int64; index [B, N] int64 vocab ids -> [B, N] float32 noise."""
    key = row_key(seed, position)[:, None]
    return -torch.log(-torch.log(uniform(key, index)))
