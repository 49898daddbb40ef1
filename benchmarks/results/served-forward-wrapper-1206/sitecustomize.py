# Scratch: wall-clock timers on the V1 worker's methods in every process (served diagnosis).
import os, sys, threading, time, json, functools, collections
_T = collections.defaultdict(lambda: [0.0, 0])
_OUT = os.environ.get("SPY_TIMERS")
_MODE = os.environ.get("SPY_MODE", "wrap")
if _MODE == "none": _OUT = None
def _wrap(cls, name, label):
    f = getattr(cls, name, None)
    if f is None or getattr(f, "_spy", False): return
    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally:
            r = _T[label]; r[0] += time.perf_counter() - t; r[1] += 1
    w._spy = True
    setattr(cls, name, w)
_SETS = {"1": {"runner.execute_model"}, "2": {"runner._model_forward"}, "3": {"worker.execute_model", "worker.sample_tokens"},"A": {"runner.execute_model", "runner._model_forward", "worker.execute_model", "worker.sample_tokens"},
         "B": {"runner.sample_tokens", "runner._sample", "runner.propose_draft_token_ids", "runner._bookkeeping_sync"},
         "C": {"runner._prepare_inputs", "runner._update_states", "runner._preprocess", "runner._build_attention_metadata",
               "runner._calc_spec_decode_metadata", "runner._get_positions", "llama.compute_logits"}}
_ONLY = set().union(*[_SETS[c] for c in _MODE[4:]]) if _MODE.startswith("wrap") and len(_MODE) > 4 else None
_orig_wrap = _wrap
def _wrap(cls, name, label):
    if _ONLY is None or label in _ONLY: _orig_wrap(cls, name, label)
def _watch():
    try:
        _watch1()
    except AttributeError:
        time.sleep(0.5); _watch()
def _watch1():
    done = set()
    while True:
        if _MODE == "thread":
            time.sleep(1.0); continue
        m = sys.modules.get("vllm.v1.worker.gpu_model_runner")
        if m and "runner" not in done:
            C = m.GPUModelRunner
            for n in ("execute_model", "_model_forward", "sample_tokens", "_sample", "propose_draft_token_ids",
                      "_prepare_inputs", "_update_states", "_bookkeeping_sync", "_preprocess", "_build_attention_metadata",
                      "_calc_spec_decode_metadata", "compute_logits_wrapper", "_get_positions"):
                _wrap(C, n, "runner." + n)
            done.add("runner")
        m3 = sys.modules.get("vllm.v1.worker.cpu_worker")
        if m3 and "worker" not in done:
            for n in ("execute_model", "sample_tokens"):
                _wrap(m3.CPUWorker, n, "worker." + n)
            done.add("worker")
        m4 = sys.modules.get("vllm.model_executor.models.llama")
        if m4 and "llama" not in done:
            _wrap(m4.LlamaForCausalLM, "compute_logits", "llama.compute_logits")
            done.add("llama")
        if _T and _OUT:
            with open(f"{_OUT}/{os.getpid()}.json", "w") as fh:
                json.dump({"argv": sys.argv[:3], "t": time.time(), "timers": dict(_T)}, fh)
        time.sleep(1.0)
if _OUT:
    threading.Thread(target=_watch, daemon=True).start()
if _OUT:
    os.register_at_fork(after_in_child=lambda: threading.Thread(target=_watch, daemon=True).start())
