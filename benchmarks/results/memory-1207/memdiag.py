"""Where the DSpark worker's memory goes: engine and worker in this process, rounds of 32
chat requests (the soak's prompts, random max_tokens and temperatures), and after each round
the resident set, glibc's heap (mallinfo2: live bytes, free bytes held in its arenas) and the
count of objects Python's collector tracks. Run from the repository root:

    python benchmarks/results/memory-1207/memdiag.py --rounds 17 --out dspark.jsonl
    python benchmarks/results/memory-1207/memdiag.py --plain ...          # no speculation
    python benchmarks/results/memory-1207/memdiag.py --trim ...           # malloc_trim(0) a round
    python benchmarks/results/memory-1207/memdiag.py --tracemalloc ...    # Python's own growth
    ONEDNN_PRIMITIVE_CACHE_CAPACITY=64 python benchmarks/results/memory-1207/memdiag.py ...
    ONEDNN_VERBOSE=profile_create python ...    # every oneDNN primitive created, with its shape

The runs in this folder were taken on commit 7e2dd41, before the worker trimmed its heap;
on later commits set DSPARK_HEAP_TRIM=0 to see the heap as it was.
"""
import argparse
import ctypes
import gc
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
p = argparse.ArgumentParser()
p.add_argument("--plain", action="store_true")
p.add_argument("--rounds", type=int, default=17)
p.add_argument("--seqs", type=int, default=32)
p.add_argument("--trim", action="store_true", help="malloc_trim(0) after each round")
p.add_argument("--tracemalloc", action="store_true", help="trace Python allocations from round 2")
p.add_argument("--onednn-cache", type=int, default=0,
               help="vLLM's oneDNN handlers keep this many primitives per weight shape (vLLM: 32)")
p.add_argument("--out", default=None)
a = p.parse_args()
import psutil  # noqa: E402

if a.onednn_cache:
    from vllm import _custom_ops as _ops
    _orig = _ops.create_onednn_mm
    _ops.create_onednn_mm = lambda w, size=128, **k: _orig(w, a.onednn_cache, **k)
from vllm import SamplingParams  # noqa: E402

from benchmarks.engine_profile import in_process_llm  # noqa: E402
from benchmarks.soak import PROMPTS  # noqa: E402
from dspark_vllm.serving import BUNDLED_DRAFTER  # noqa: E402


class MallInfo(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks",
                                               "keepcost")]


libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo
spec = None if a.plain else {"method": "dspark", "model": str(BUNDLED_DRAFTER),
                             "num_speculative_tokens": 7, "enable_adaptive_verification": True}
llm = in_process_llm(spec, "float32", eager=True, max_num_seqs=a.seqs, enable_prefix_caching=True)
rng = random.Random(0)
proc = psutil.Process()
out = open(a.out, "w") if a.out else sys.stdout
first = None
t0 = time.time()
for r in range(a.rounds):
    msgs = [[{"role": "user", "content": rng.choice(PROMPTS)}] for _ in range(a.seqs)]
    params = [SamplingParams(max_tokens=rng.randint(1, 160),
                             temperature=rng.choice([0.0, 0.0, 0.7, 1.0]),
                             seed=rng.randint(0, 10**6)) for _ in msgs]
    llm.chat(msgs, params, use_tqdm=False)
    if a.tracemalloc and r == 1:
        import tracemalloc
        tracemalloc.start(10)
    m = libc.mallinfo2()
    row = {"round": r, "t": round(time.time() - t0, 1), "rss_mb": proc.memory_info().rss >> 20,
           "in_use_mb": (m.uordblks + m.hblkhd) >> 20, "mmap_mb": m.hblkhd >> 20,
           "free_mb": m.fordblks >> 20, "arena_mb": m.arena >> 20, "gc_objs": len(gc.get_objects())}
    if a.trim:
        libc.malloc_trim(0)
        row["rss_after_trim_mb"] = proc.memory_info().rss >> 20
    if a.tracemalloc and r >= 2:
        snap = tracemalloc.take_snapshot()
        row["py_mb"] = round(sum(x.size for x in snap.statistics("filename")) / 2**20, 1)
        first = first or (snap if r == 3 else None)
        if first is not None and r % 5 == 4:
            for st in snap.compare_to(first, "traceback")[:8]:
                print("DIFF", st, *st.traceback.format()[-8:], sep="\n    ", file=sys.stderr)
    print(json.dumps(row), file=out, flush=True)
