"""The CPython frame-stack fix: the cliff it removes, the padding choice, the wrapped forward."""

import sys

import pytest

from dspark_vllm.patches import frame_stack as fs


def _op(k=3):
    """An op called from the hot frame: a few frames deep, like vLLM's Python custom ops."""
    return _op(k - 1) if k else 1


def _step(ops=50):
    """The hot frame (the compiled graph's call): it calls `ops` ops a step."""
    return sum(_op() for _ in range(ops))


def _step_at(n):
    """_step run `n` frames below here."""
    return _step_at(n - 1) if n else _step()


def _faults_per_step(fn, *args, steps=20):
    fn(*args)  # settle
    before = fs.thread_faults()
    for _ in range(steps):
        fn(*args)
    return (fs.thread_faults() - before) / steps


@pytest.mark.skipif(sys.version_info < (3, 11), reason="chunked frame stack since CPython 3.11")
def test_ops_called_across_a_frame_stack_chunk_fault_every_call_and_a_pad_avoids_it():
    # At some depth a chunk boundary falls between the hot frame and its ops: each op call
    # then maps and unmaps a fresh chunk (faults), 50 a step; elsewhere at most one a step.
    per_step = {d: _faults_per_step(_step_at, d) for d in range(0, 240, 2)}
    worst = max(per_step, key=per_step.get)
    assert per_step[worst] >= 40, per_step  # the cliff
    assert min(per_step.values()) <= 1, per_step
    chooser = fs.PadChooser(pads=(0, 3, 6, 9, 12), tries=2)
    while chooser.chosen is None:  # the chooser, fed the real faults at the worst depth
        pad = chooser.next_pad()
        before = fs.thread_faults()
        fs.padded(pad, _step_at, (worst,), {})
        chooser.record(pad, fs.thread_faults() - before)
    # padded: at most the one chunk a step (4 pages), not one an op
    assert chooser.scores[chooser.chosen] <= 8 and chooser.scores[0] >= 40, chooser.scores


def test_the_chooser_tries_each_pad_then_keeps_the_fewest_faults_smallest_on_ties():
    c = fs.PadChooser(pads=(0, 3, 6), tries=2)
    seen = []
    for faults in (50, 400, 9, 9, 9, 700):  # pad 0: first touch then the cliff
        seen.append(c.next_pad())
        c.record(seen[-1], faults)
    assert seen == [0, 0, 3, 3, 6, 6]
    assert c.scores == {0: 50, 3: 9, 6: 9} and c.chosen == 3
    c.record(3, 10_000)  # fixed once chosen
    assert c.chosen == 3 and c.next_pad() == 3


def test_padded_calls_n_frames_deeper_with_the_arguments():
    def depth(tag, k=0):
        n, f = 0, sys._getframe()
        while f:
            n, f = n + 1, f.f_back
        return tag, k, n

    tag, k, base = fs.padded(0, depth, ("a",), {"k": 2})
    assert (tag, k) == ("a", 2)
    assert fs.padded(7, depth, ("a",), {})[2] == base + 7


def test_the_patched_forward_returns_the_models_output_and_settles_per_call_site(monkeypatch):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    monkeypatch.setattr(GPUModelRunner, "_model_forward", GPUModelRunner._model_forward)
    monkeypatch.setattr(fs, "_applied", fs._applied)  # restored after: no leak to later tests
    monkeypatch.setattr(fs, "_choosers", {})
    fs.apply()
    fs.apply()  # idempotent
    forward = GPUModelRunner._model_forward
    assert getattr(forward, "_dspark_patch", None) == "frame_stack"

    class Runner:
        def model(self, **kw):
            return kw

    calls = len(fs.PADS) * fs.TRIES + 2  # every candidate tried, then the chosen pad
    out = [forward(Runner(), input_ids=i, positions=-i) for i in range(calls)]
    assert out[-1] == {"input_ids": out[-1]["input_ids"], "positions": -out[-1]["input_ids"],
                       "intermediate_tensors": None, "inputs_embeds": None}
    assert [o["input_ids"] for o in out] == list(range(len(out)))


@pytest.mark.parametrize("env, dspark, applied", [
    (None, True, True), ("0", True, False), ("1", True, True),
    (None, False, False), ("0", False, False), ("1", False, True)])
def test_dspark_engines_get_the_fix_unless_switched_off_others_when_asked(
        env, dspark, applied, monkeypatch):
    calls = []
    monkeypatch.setattr(fs, "apply", lambda: calls.append(1))
    if env is None:
        monkeypatch.delenv("DSPARK_FRAME_STACK", raising=False)
    else:
        monkeypatch.setenv("DSPARK_FRAME_STACK", env)
    fs.apply_if_wanted(dspark_engine=dspark)
    assert bool(calls) is applied
