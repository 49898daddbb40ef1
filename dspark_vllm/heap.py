"""Hand the worker's freed heap back to the operating system, at most once an interval.

Why: a DSpark step batches a different number of tokens nearly every step (each request
verifies its own number of drafts), so the CPU matmuls keep meeting new row counts M.
vLLM's oneDNN handlers keep 32 primitives per weight shape and oneDNN's own primitive cache
1,024 (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`); each new M creates a primitive (~0.2 MB of
descriptors and JIT code) and, once a cache is full, frees an old one. glibc keeps what is
freed inside its arenas, scattered between live chunks, and does not return it on its own:
under the soak's load the worker's resident memory grew ~30 MB a minute, where plain vLLM,
meeting far fewer row counts, grew ~5 (benchmarks/results/soak-1206-memory/).
`malloc_trim(0)` releases the free pages inside the arenas (14-23 ms a trim in the soak).
What is left is mostly the primitive cache filling, bounded by its capacity: over a 20-minute
soak the worker still grew ~6 MB a minute in the second half, against ~18 untrimmed.
It is not free: the soak served 3-8% fewer tokens a second with it (the freed pages fault back
in as the heap reuses them), so it is off unless DSPARK_HEAP_TRIM=1 asks for it
(benchmarks/results/memory-1207/).

The default instead: `bound_primitive_cache` caps oneDNN's primitive cache at
ONEDNN_CACHE_CAP for the engine and worker a DSpark server starts on CPU (a capacity the user
set is kept). Capped, the worker's memory grew like plain vLLM's (in process: resident +100 MB
over 16 rounds, flat from round 8, against plain's +90 and +355 rising at 1,024); in the soak
it held flat from minute 2 (tree +1.4%) at 196.0 tok/s against 193.1 uncapped the same hour
(+5.7%, still creeping).

What would remove both: an allocator that returns memory itself (vLLM's CPU guide preloads
tcmalloc), or row counts bucketed so few primitives are ever made.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time

log = logging.getLogger("vllm.dspark.heap")

TRIM_INTERVAL_S = 10.0  # seconds between trims, the one interval measured; rarer is untried
ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"  # read by oneDNN once, at its first primitive
ONEDNN_CACHE_CAP = 64  # primitives (oneDNN's default: 1,024). vLLM's handlers keep 32 per weight
    # shape themselves, so this cache only spares a re-made primitive (0.31 ms) its JIT; at
    # 1,024 it holds ~200 MB that churn once full, at 64 ~13 MB


def bound_primitive_cache(on_cpu: bool) -> int | None:
    """Cap oneDNN's primitive cache for the processes started from here on (the engine and
    its worker inherit the environment) unless the user set a capacity. -> the capacity in
    effect; None off CPU. A capacity that is not a whole number >= 0 is refused by name."""
    if not on_cpu:
        return None
    value = os.environ.setdefault(ONEDNN_CACHE_ENV, str(ONEDNN_CACHE_CAP))
    if not value.isdigit():
        raise ValueError(f"{ONEDNN_CACHE_ENV}={value!r}: use a whole number of primitives >= 0 "
                         f"(unset: {ONEDNN_CACHE_CAP} for a DSpark server on CPU)")
    return int(value)


def _glibc_trim():
    """libc's malloc_trim, or None where the C library has none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class HeapTrimmer:
    """`maybe_trim()` once a step; it trims when `interval_s` has passed since the last."""

    def __init__(self, interval_s: float = TRIM_INTERVAL_S, clock=time.monotonic, trim=None):
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s!r}: use a number of seconds above 0")
        self.interval_s = interval_s
        self._clock = clock
        self._trim = _glibc_trim() if trim is None else trim
        self._last = clock()
        self.trims = 0  # how many times it has trimmed
        self.trim_seconds = 0.0  # their total wall time

    @property
    def available(self) -> bool:
        return self._trim is not None

    def maybe_trim(self) -> bool:
        """Trim if the interval has passed; whether it did."""
        now = self._clock()
        if self._trim is None or now - self._last < self.interval_s:
            return False
        t0 = time.perf_counter()
        self._trim(0)
        self.trim_seconds += time.perf_counter() - t0
        self.trims += 1
        self._last = now
        if self.trims in (1, 10) or self.trims % 100 == 0:
            log.info("heap trimmed %d times, %.2f ms each on average", self.trims,
                     self.trim_seconds / self.trims * 1e3)
        return True
