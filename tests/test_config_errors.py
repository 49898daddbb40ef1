"""Start-up refusals: each bad setup is rejected when vLLM builds its config, with a
message that names the value (no engine is started)."""

import subprocess
import sys

import pytest
import torch

from dspark_vllm.drafter.checkpoint import save_drafter
from dspark_vllm.target import prepare_target
from tests.conftest import make_drafter
from tests.engine_utils import drafter_for_tests


@pytest.fixture(scope="module")
def target():
    return str(prepare_target())


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return str(drafter_for_tests(tmp_path_factory.mktemp("d")))


def _build(target, spec, **kw):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=target, speculative_config=spec, dtype="float32",
                      max_model_len=512, **kw).create_engine_config()


def _refused(target, spec, needle, **kw):
    with pytest.raises(Exception) as e:
        _build(target, spec, **kw)
    assert needle in str(e.value), str(e.value)[:600]


def test_valid_setup_builds_and_selects_the_scheduler(target, good):
    vc = _build(target, {"method": "dspark", "model": good, "num_speculative_tokens": 4,
                         "enable_adaptive_verification": True})
    assert vc.speculative_config.method == "dspark"
    assert vc.scheduler_config.scheduler_cls == "dspark_vllm.scheduler.DSparkScheduler"
    assert not vc.speculative_config.use_eagle_block_drop()  # prefix hits keep their last block


def test_block_drop_switch_is_validated(target, good, monkeypatch):
    spec = {"method": "dspark", "model": good, "num_speculative_tokens": 4}
    monkeypatch.setenv("DSPARK_EAGLE_BLOCK_DROP", "1")  # vLLM's EAGLE behaviour back
    assert _build(target, spec).speculative_config.use_eagle_block_drop()
    monkeypatch.setenv("DSPARK_EAGLE_BLOCK_DROP", "yes")
    _refused(target, spec, "DSPARK_EAGLE_BLOCK_DROP='yes': use 1")


@pytest.mark.parametrize("name, value, accepted", [
    ("DSPARK_DEFER_CONTEXT", "off", "use 1 / unset"),
    ("DSPARK_DRAFT_HANDOVER", "rpc", "use 1 / unset"),
    ("DSPARK_BLOCK_GRAPHS", "cuda", "use 1 / unset"),
    ("DSPARK_FRAME_STACK", "yes", "use 1 / unset"),
    ("DSPARK_HEAP_TRIM", "never", "use 1"),
    ("DSPARK_GATE_VERDICT", "bursts", "use paired / unset"),
    ("DSPARK_CONFIDENCE_DRIFT", "on", "use 1"),
    ("DSPARK_STEP_PRICE", "convex", "use hull / unset"),
    ("DSPARK_GATE_WARM_BURSTS", "16", "use 8 / unset"),
])
def test_environment_switches_are_validated(target, good, monkeypatch, name, value, accepted):
    spec = {"method": "dspark", "model": good, "num_speculative_tokens": 4,
            "enable_adaptive_verification": True}
    monkeypatch.setenv(name, value)
    _refused(target, spec, f"{name}={value!r}: {accepted}")


def test_the_collector_follows_schedulers_that_keep_the_ledger():
    from vllm.v1.core.sched.scheduler import Scheduler

    from dspark_vllm.ledger_scheduler import LedgerScheduler
    from dspark_vllm.patches.v1_gate import _keeps_ledger
    from dspark_vllm.scheduler import DSparkScheduler

    assert _keeps_ledger("dspark_vllm.ledger_scheduler.LedgerScheduler")
    assert _keeps_ledger("dspark_vllm.scheduler.DSparkScheduler")
    assert _keeps_ledger(LedgerScheduler) and _keeps_ledger(DSparkScheduler)
    assert not _keeps_ledger(None) and not _keeps_ledger(Scheduler)
    assert not _keeps_ledger("vllm.v1.core.sched.scheduler.Scheduler")


def test_too_many_speculative_tokens(target, good):
    _refused(target, {"method": "dspark", "model": good, "num_speculative_tokens": 9},
             "num_speculative_tokens=9: the drafter was trained with block_size=7; use 1..7")


def test_drafter_for_another_target(target, tiny_target, tmp_path):
    save_drafter(make_drafter(tiny_target), tmp_path)
    _refused(target, {"method": "dspark", "model": str(tmp_path), "num_speculative_tokens": 3},
             "hidden_size=64 but the target")


def test_corrupt_weights(target, good, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    (bad / "model.safetensors").write_bytes(b"\x00" * 64)
    _refused(target, {"method": "dspark", "model": str(bad), "num_speculative_tokens": 3},
             "not a readable safetensors file")


def test_missing_drafter_directory(target):
    _refused(target, {"method": "dspark", "model": "/nonexistent/drafter",
                      "num_speculative_tokens": 3}, "/nonexistent/drafter")


def test_purely_parallel_drafter_is_refused_for_serving(target, tmp_path):
    from dspark_vllm.target import load_target

    t, _ = load_target(tokenizer=False)
    torch.manual_seed(0)
    save_drafter(make_drafter(t, markov_rank=0, conf=False, draft_vocab=None), tmp_path)
    _refused(target, {"method": "dspark", "model": str(tmp_path), "num_speculative_tokens": 3},
             "markov_rank=0")


def test_tensor_parallel_two_is_refused(target, good):
    _refused(target, {"method": "dspark", "model": good, "num_speculative_tokens": 3},
             "tensor parallel size (2)", tensor_parallel_size=2)


def test_adaptive_budget_needs_synchronous_scheduling(target, good):
    from dspark_vllm.config import DSparkConfigError, DSparkServeConfig

    # CPU engines always schedule synchronously; on GPUs async scheduling is the default.
    vc = _build(target, {"method": "dspark", "model": good, "num_speculative_tokens": 3,
                         "enable_adaptive_verification": True})
    vc.scheduler_config.async_scheduling = True
    with pytest.raises(DSparkConfigError, match="--no-async-scheduling"):
        DSparkServeConfig.from_vllm_config(vc)


def test_prompt_lookup_switch_is_validated_and_needs_the_table(target, good, tmp_path,
                                                              monkeypatch):
    import json
    import shutil

    from dspark_vllm.config import DSparkServeConfig

    spec = {"method": "dspark", "model": good, "num_speculative_tokens": 4}
    assert DSparkServeConfig.from_vllm_config(_build(target, spec)).prompt_lookup_max == 0
    monkeypatch.setenv("DSPARK_PROMPT_LOOKUP", "6")
    assert DSparkServeConfig.from_vllm_config(_build(target, spec)).prompt_lookup_max == 6
    for bad in ("yes", "-1", "99"):
        monkeypatch.setenv("DSPARK_PROMPT_LOOKUP", bad)
        _refused(target, spec, f"DSPARK_PROMPT_LOOKUP={bad!r}")
    monkeypatch.setenv("DSPARK_PROMPT_LOOKUP", "6")
    bare = tmp_path / "no-table"
    shutil.copytree(good, bare)
    cfg = json.loads((bare / "config.json").read_text())
    cfg.pop("dspark_lookup_acceptance", None)
    (bare / "config.json").write_text(json.dumps(cfg))
    _refused(target, {**spec, "model": str(bare)}, "calibrate --lookup-only")


@pytest.mark.slow
def test_vllm_serve_command_reports_the_bad_value(target, good):
    from dspark_vllm.serving import vllm_command

    r = subprocess.run(vllm_command() + ["serve", target, "--dtype", "float32",
                                         "--speculative-config",
                                         f'{{"method": "dspark", "model": "{good}", '
                                         '"num_speculative_tokens": 12}'],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "num_speculative_tokens=12" in r.stdout + r.stderr


def test_a_target_vllm_cannot_take_layers_from_is_named(good, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=64, n_layer=2, n_head=4,
                               n_positions=512)).save_pretrained(tmp_path)
    _refused(str(tmp_path), {"method": "dspark", "model": good, "num_speculative_tokens": 3},
             "(GPT2LMHeadModel): vLLM cannot pass this architecture's inner layers",
             skip_tokenizer_init=True)
