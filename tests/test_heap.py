"""The worker's heap trimmer (dspark_vllm/heap.py): trims once an interval, never more,
and does nothing where the C library has no malloc_trim; the oneDNN primitive cache cap a
DSpark server on CPU sets for its engine and worker."""

import ctypes
import os

import pytest

from dspark_vllm.heap import HeapTrimmer


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_it_trims_once_an_interval_and_not_in_between():
    clock, calls = Clock(), []
    h = HeapTrimmer(interval_s=10.0, clock=clock, trim=calls.append)
    steps = []
    for _ in range(60):  # 30 s of 0.5 s steps
        clock.now += 0.5
        steps.append(h.maybe_trim())
    assert calls == [0, 0, 0] and h.trims == 3  # at 10, 20 and 30 s; malloc_trim(pad=0)
    assert [i for i, did in enumerate(steps) if did] == [19, 39, 59]
    assert h.trim_seconds >= 0


def test_without_malloc_trim_it_does_nothing(monkeypatch):
    monkeypatch.setattr("dspark_vllm.heap._glibc_trim", lambda: None)
    clock = Clock()
    h = HeapTrimmer(interval_s=1.0, clock=clock)
    clock.now += 5
    assert not h.available and not h.maybe_trim() and h.trims == 0


def test_on_glibc_it_hands_freed_pages_back():
    """Holes between live chunks stay resident after free(); a trim returns them: free every
    other one of 16,384 8-KiB chunks (64 MiB of holes) and the resident set falls."""
    psutil = pytest.importorskip("psutil")
    h = HeapTrimmer(interval_s=1e-9)
    if not h.available:
        pytest.skip("this C library has no malloc_trim")
    proc = psutil.Process()
    chunks = [ctypes.create_string_buffer(8192) for _ in range(16384)]  # touched: zero-filled
    del chunks[::2]  # the holes
    before = proc.memory_info().rss
    assert h.maybe_trim() and h.trims == 1
    assert before - proc.memory_info().rss > 16 << 20  # at least a quarter of the holes back
    del chunks


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_a_bad_interval_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"interval_s=.*use a number of seconds above 0"):
        HeapTrimmer(interval_s=bad)


def test_a_dspark_server_on_cpu_caps_onednns_primitive_cache(monkeypatch):
    """Unset, the cap is set for the processes started next; a user's capacity is kept;
    off CPU nothing is touched."""
    from dspark_vllm.heap import ONEDNN_CACHE_CAP, ONEDNN_CACHE_ENV, bound_primitive_cache

    monkeypatch.delenv(ONEDNN_CACHE_ENV, raising=False)
    assert bound_primitive_cache(on_cpu=False) is None
    assert ONEDNN_CACHE_ENV not in os.environ
    assert bound_primitive_cache(on_cpu=True) == ONEDNN_CACHE_CAP == 64
    assert os.environ[ONEDNN_CACHE_ENV] == "64"
    monkeypatch.setenv(ONEDNN_CACHE_ENV, "1024")
    assert bound_primitive_cache(on_cpu=True) == 1024 and os.environ[ONEDNN_CACHE_ENV] == "1024"


@pytest.mark.parametrize("bad", ["lots", "-1", "6.4", ""])
def test_a_bad_onednn_capacity_is_refused_by_name(monkeypatch, bad):
    from dspark_vllm.heap import bound_primitive_cache

    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", bad)
    with pytest.raises(ValueError, match=r"ONEDNN_PRIMITIVE_CACHE_CAPACITY=.*whole number"):
        bound_primitive_cache(on_cpu=True)
