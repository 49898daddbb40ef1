"""`dspark demo` (the README's main job) serves as `vllm serve` does by default: compiled, in
the dtype this CPU computes fast; --eager and --dtype reach the server. No server starts here
(the engine tests serve the same drafter)."""

from __future__ import annotations

import pytest

from dspark_vllm import demo
from dspark_vllm.cli import build_parser
from dspark_vllm.hardware import preferred_dtype


class _Started(Exception):
    pass


@pytest.fixture
def served(monkeypatch, tmp_path):
    """The keyword arguments the demo builds its server with (it stops at the first start)."""
    seen = {}

    class FakeServer:
        def __init__(self, target, **kw):
            seen.update(kw, target=target)
            self.cmd = ["vllm", "serve", str(target)]

        def __enter__(self):
            raise _Started

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(demo, "prepare_target", lambda: tmp_path)
    monkeypatch.setattr(demo, "VllmServer", FakeServer)
    return seen


def _run(argv):
    args = build_parser().parse_args(["demo", *argv])
    with pytest.raises(_Started):
        args.fn(args)


def test_the_demo_serves_compiled_in_the_preferred_dtype(served):
    _run([])
    assert served["enforce_eager"] is False
    assert served["dtype"] == preferred_dtype("auto") in ("bfloat16", "float32")
    assert served["spec"]["enable_adaptive_verification"] is True
    assert served["env"] == {"DSPARK_PROMPT_LOOKUP": "6"}  # the bundled drafter has its table


def test_the_demo_serves_the_drafter_alone_on_request(served):
    _run(["--no-prompt-lookup"])
    assert served["env"] == {}


def test_the_demo_passes_eager_and_a_named_dtype(served):
    _run(["--eager", "--dtype", "float32", "--fixed"])
    assert served["enforce_eager"] is True and served["dtype"] == "float32"
    assert served["spec"]["enable_adaptive_verification"] is False


def test_the_demo_refuses_a_dtype_it_does_not_serve(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--dtype", "float16"])
    err = capsys.readouterr().err
    assert "float16" in err and "bfloat16" in err and "auto" in err
