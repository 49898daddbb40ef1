"""The benchmark scripts keep working: their --quick modes and the report math."""

import collections
import json
import os

import pytest

from benchmarks.report import at_speed, matched, per_user_at, speed_table, throughput_at


def _points(pairs):
    return {str(c): {"median": {"throughput_tok_s": t, "per_user_tok_s": u}}
            for c, (t, u) in zip((1, 2, 4), pairs)}


def test_matched_throughput_interpolates_the_frontier():
    base = _points([(10, 10), (18, 9), (30, 7.5)])
    fast = _points([(16, 16), (28, 14), (40, 10)])
    assert per_user_at(fast, 22) == pytest.approx(15.0)
    assert per_user_at(fast, 10) is None  # outside the measured range
    assert throughput_at(fast, 15.0) == pytest.approx(22.0)
    m = matched({"mtp-1": {"points": base}, "dspark": {"points": fast}})
    ratios = [r["ratio"] for r in m["dspark"]]
    assert ratios[0] is None and ratios[1] == pytest.approx((16 - 2 * 2 / 12) / 9)


def test_throughput_at_a_speed_target_walks_the_frontier_in_throughput_order():
    # per-user speed rises from 1 to 2 requests, then falls: the most throughput still at
    # >= 41 tok/s per user lies on the 2 -> 4 segment, not between 1 and 4 requests
    budget = _points([(43.0, 45.2), (74.2, 45.3), (95.2, 32.2)])
    assert throughput_at(budget, 41.2) == pytest.approx(74.2 + 4.1 / 13.1 * 21.0)
    assert throughput_at(budget, 50.0) is None  # never served a user that fast
    assert throughput_at(budget, 20.0) == pytest.approx(95.2)  # never that slow: a lower bound
    base = _points([(40.0, 41.2), (68.0, 38.2), (85.0, 28.3)])
    rows = at_speed({"mtp-1": {"points": base}, "dspark": {"points": budget}})["dspark"]
    assert [r["baseline_concurrency"] for r in rows] == [1, 2, 4]
    assert rows[0]["ratio"] == pytest.approx(throughput_at(budget, 41.2) / 40.0)
    assert rows[2]["ratio"] == pytest.approx(throughput_at(budget, 28.3) / 85.0)
    assert rows[0]["at_least"] is False
    assert rows[2]["at_least"] is True and rows[2]["throughput"] == pytest.approx(95.2)
    own = at_speed({"mtp-1": {"points": base}})["mtp-1"]
    assert [r["ratio"] for r in own] == pytest.approx([1.0, 1.0, 1.0])
    table = "\n".join(speed_table({"mtp-1": {"points": base}, "dspark": {"points": budget}}))
    assert "| dspark | 81 (2.02x) |" in table
    assert speed_table({"dspark": {"points": budget}}) == []  # no baseline, no table


def test_the_report_reader_names_a_missing_or_corrupt_sweep_and_baseline(tmp_path, capsys):
    from benchmarks.report import main

    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert f"{tmp_path / 'sweep.json'}: no sweep.json there" in capsys.readouterr().err
    (tmp_path / "sweep.json").write_text('{"results": ')  # cut off mid-write
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "not a serving sweep's result (JSONDecodeError" in capsys.readouterr().err
    (tmp_path / "sweep.json").write_text(json.dumps(
        {"results": {"no-spec": {"points": _points([(10, 10)])}}}))
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "--baseline mtp-1: not in this sweep; it has no-spec" in capsys.readouterr().err


def test_every_load_window_reads_the_whole_prompt_mix():
    """A one-request point reads a few consecutive prompts: each source must be in every
    window of three, and the Spec-Bench third must span its categories."""
    from benchmarks.serving_sweep import prompt_set
    from dspark_vllm.datasets import gsm8k_heldout, humaneval, load_eval_set

    prompts = prompt_set(48)
    gsm = {json.dumps(p["messages"]) for p in gsm8k_heldout()}
    code = {json.dumps(p["messages"]) for p in humaneval()}
    spec = {json.dumps(p["messages"]): p["category"] for p in load_eval_set("spec_bench")}
    source = ["gsm8k" if json.dumps(m) in gsm else "humaneval" if json.dumps(m) in code
              else spec[json.dumps(m)] for m in prompts]
    assert len(prompts) == 48 and len(set(map(json.dumps, prompts))) == 48
    for i in range(len(prompts) - 2):
        window = source[i:i + 3]
        assert "gsm8k" in window and "humaneval" in window, (i, window)
    assert set(source[2::3]) == {p["category"] for p in load_eval_set("spec_bench")}


@pytest.mark.parametrize("n", [2, 118])
def test_a_prompt_count_outside_the_mix_is_refused_by_name(n, capsys, tmp_path):
    from benchmarks.serving_sweep import main

    with pytest.raises(SystemExit):  # refused before any server starts
        main(["--prompts", str(n), "--out", str(tmp_path / "never-written")])
    assert not (tmp_path / "never-written").exists()
    err = capsys.readouterr().err
    assert f"--prompts {n}: use 3 to 117" in err


def test_a_bad_instance_count_is_refused_by_name(capsys, tmp_path):
    from benchmarks.serving_sweep import main

    with pytest.raises(SystemExit):  # refused before any server starts
        main(["--instances", "0", "--out", str(tmp_path / "never-written")])
    assert not (tmp_path / "never-written").exists()
    assert "--instances 0: use 1 or more" in capsys.readouterr().err


def test_a_second_drafter_is_served_as_its_own_configuration(capsys, tmp_path):
    from benchmarks.serving_sweep import DRAFTER_B, configs, main

    cfgs = configs("A", "no-head-here", (3,), drafter_b="B")
    assert cfgs[DRAFTER_B] == {**cfgs["dspark-adaptive"], "model": "B"}
    assert cfgs["dspark-adaptive"]["model"] == "A" and DRAFTER_B not in configs("A", "x", (3,))
    with pytest.raises(SystemExit):  # named without a second drafter: refused before any server
        main(["--only", DRAFTER_B, "--out", str(tmp_path / "never-written")])
    assert f"--only {DRAFTER_B}: not a configuration here" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--drafter-b", str(tmp_path / "nowhere"), "--out", str(tmp_path / "never-written")])
    assert "nowhere: no drafter there" in capsys.readouterr().err
    assert not (tmp_path / "never-written").exists()


def test_budget_servers_are_the_ones_with_the_load_aware_budget():
    """The sweep starts these first, alone, so their start-up cost profile is not timed
    beside other servers compiling."""
    from benchmarks.serving_sweep import DRAFTER_B, budget_server, configs

    cfgs = configs("A", "no-head-here", (2, 3), drafter_b="B")
    budget = {n for n, spec in cfgs.items() if budget_server(spec)}
    assert {"dspark-adaptive", DRAFTER_B} <= budget
    assert not budget & {"no-spec", "dspark-k2", "dspark-k3", "vllm-batch-schedule"}


def test_eager_controls_serve_their_base_configuration_with_enforce_eager(tmp_path):
    """Servers are compiled (vLLM's default) unless --eager; the -eager controls, named only,
    serve the same configuration eagerly beside them."""
    import argparse

    from benchmarks.serving_sweep import EAGER, EAGER_CONTROLS, NAMED_ONLY, _server, configs

    cfgs = configs("A", "no-head-here", (3,))
    args = argparse.Namespace(eager=False, prefix_caching=False, executor=None, ledger=False,
                              dtype="float32", concurrency=[1, 4])

    def eager(name, **kw):
        return "--enforce-eager" in _server("T", name, cfgs[name], tmp_path,
                                            argparse.Namespace(**{**vars(args), **kw})).cmd

    for name in EAGER_CONTROLS:
        base = name.removesuffix(EAGER)
        assert name in NAMED_ONLY and cfgs[name] == cfgs[base]
        assert eager(name) and not eager(base) and eager(base, eager=True)


def test_ledger_summary_prices_one_window():
    from benchmarks.ledger_window import ledger_summary

    row = dict(steps=0, seconds=0.0, generated_tokens=0, prefill_tokens=0, cycle_seconds=0.0)
    before = {"decode_noverify_nodraft": {**row, "steps": 5, "seconds": 0.4,
                                          "generated_tokens": 40, "cycle_seconds": 0.5}}
    after = {"decode_noverify_nodraft": {**row, "steps": 15, "seconds": 1.3,
                                         "generated_tokens": 140, "cycle_seconds": 1.5},
             "prefill_noverify_nodraft": {**row, "steps": 2, "seconds": 0.9,
                                          "generated_tokens": 4, "prefill_tokens": 300,
                                          "cycle_seconds": 1.0}}
    s = ledger_summary(before, after)  # the window: 10 decode steps, 2 prefill steps
    assert s["ledger_decode_tok_s"] == pytest.approx(100 / 1.0)
    assert s["ledger_prefill_share"] == pytest.approx(1.0 / 2.0)
    assert s["ledger_overhead_ms"] == pytest.approx(1e3 * (2.0 - 1.8) / 12)
    assert "ledger_busy_share" not in s  # no wall time given
    busy = ledger_summary(before, after, wall=2.5)  # 2.0 s of cycles in a 2.5 s window
    assert busy["ledger_busy_share"] == pytest.approx(0.8)
    assert busy["ledger_engine_tok_s"] == pytest.approx(104 / 2.0)
    assert s["ledger_prefill_steps"] == 2
    assert ledger_summary({}, {}) == {}


def test_load_split_parts_full_load_steps_from_the_ramp():
    from benchmarks.ledger_window import load_split

    def row(seconds, tokens):
        return {"steps": 1, "seconds": seconds, "generated_tokens": tokens, "prefill_tokens": 0}

    before = {"16": {"decode_noverify_nodraft": row(1.0, 100)}}
    after = {"16": {"decode_noverify_nodraft": row(4.0, 400),  # bucket(14..16) = 16
                    "prefill_noverify_nodraft": row(1.0, 20)},
             "8": {"decode_noverify_nodraft": row(1.0, 60)},
             "2": {"decode_verify_draft": row(0.5, 15)}}
    s = load_split(before, after, 15)  # window: 4 s at full load, 1.5 s below it
    assert s["ledger_full_load_time_share"] == pytest.approx(4.0 / 5.5)
    assert s["ledger_full_load_tok_s"] == pytest.approx(320 / 4.0)
    assert s["ledger_part_load_tok_s"] == pytest.approx(75 / 1.5)
    assert "ledger_part_load_tok_s" not in load_split({}, {"2": after["2"]}, 2)  # all full
    assert load_split(after, after, 16) == {}  # an empty window


def test_offline_acceptance_quick(tmp_path):
    from benchmarks.offline_acceptance import main

    main(["--quick", "--drafter", "random=random", "--out", str(tmp_path)])
    r = json.loads((tmp_path / "acceptance.json").read_text())
    assert set(r["random@t0"]) == {"spec_bench", "humaneval", "gsm8k"}
    md = (tmp_path / "acceptance.md").read_text()
    assert md.count("| random@t0 |") == 3
    # The random drafter drafts over the whole vocabulary: no token is outside it.
    share_row = md.strip().splitlines()[-1].split("|")[2:-1]
    assert share_row and all(c.strip() == "0.0" for c in share_row)
    assert (tmp_path / "per_position.png").stat().st_size > 0


def test_outside_vocabulary_share_reads_dash_for_results_that_lack_it():
    from benchmarks.offline_acceptance import _share

    assert _share({"outside_vocab": 0.157}) == "15.7"
    assert _share({"tau": 1.5}) == "-" and _share(None) == "-"


def test_server_groups_rotate_the_start_order_per_instance():
    from benchmarks.serving_sweep import server_groups

    assert server_groups(["a", "b", "c"], True, 1) == [["a", "b", "c"]]
    assert server_groups(["a", "b"], True, 3) == [["a", "b"], ["b", "a"], ["a", "b"]]
    assert server_groups(["a", "b"], False, 2) == [["a"], ["b"], ["b"], ["a"]]
    with pytest.raises(ValueError, match="--instances 0: use 1 or more"):
        server_groups(["a"], True, 0)


def test_paired_ratios_pair_each_instance_with_the_base_server_up_beside_it():
    from benchmarks.report import paired_ratios

    def res(*tput):
        return {"points": {"16": {"instance_throughput_tok_s": list(tput)}}}

    r = paired_ratios({"no-spec": res(100.0, 120.0), "dspark": res(110.0, 114.0),
                       "no-spec-aa": res(105.0, 120.0)})
    assert r["dspark"]["16"] == pytest.approx([1.10, 0.95])
    assert r["no-spec-aa"]["16"] == pytest.approx([1.05, 1.0])
    assert paired_ratios({"dspark": res(1.0)}) == {}  # no base, no pairs
    # Any per-instance reading pairs the same way (the full-concurrency throughput).
    full = {n: {"points": {"16": {"instance_full_concurrency_throughput_tok_s": [x]}}}
            for n, x in (("no-spec", 200.0), ("dspark", 210.0))}
    assert paired_ratios(full, key="full_concurrency_throughput_tok_s")["dspark"]["16"] == \
        pytest.approx([1.05])
    assert paired_ratios(full) == {}  # the whole window's throughput was not measured


def test_gate_rows_put_the_gates_readings_beside_the_ledger(tmp_path):
    from benchmarks.report import gate_rows, write_report

    def row(steps, seconds, tokens):
        return {"steps": steps, "seconds": seconds, "generated_tokens": tokens, "prefill_tokens": 0}

    status = {"gate": {"verdict_by": "paired",
                       "decided_by": {"prediction": {"drafted": 7, "undrafted": 2},
                                      "exploration": {"drafted": 0, "undrafted": 4}},
                       "tokens_per_second_by_batch": {
                           "16": {"drafted_tok_s": 120.0, "undrafted_tok_s": 100.0},
                           "4": {"drafted_tok_s": 50.0, "undrafted_tok_s": None}},
                       "paired_bursts_by_batch": {"16": {"pairs": 5, "gain": 0.97,
                                                         "log_gain_stderr": 0.02,
                                                         "verdict": False}}},
              "steps_by_load": {"16": {"decode_verify_draft": row(10, 1.0, 100),
                                       "decode_noverify_nodraft": row(30, 3.0, 330),
                                       "prefill_verify_draft": row(5, 2.0, 50)}}}
    results = {"no-spec": {"spec": None, "points": {}},
               "dspark": {"spec": {}, "points": {}, "instance_status": [None, status]}}
    rows = gate_rows(results)
    assert [(r["instance"], r["batch"]) for r in rows] == [(2, 4), (2, 16)]
    low, busy = rows
    assert low["arms_gain"] is None and low["paired_gain"] is None and low["drafted_share"] is None
    assert busy["arms_gain"] == pytest.approx(1.2) and busy["paired_verdict"] is False
    assert busy["ledger_gain"] == pytest.approx(100 / 110)  # clean steps only, no prefill
    assert busy["drafted_share"] == pytest.approx(0.25) and busy["pairs"] == 5
    write_report(tmp_path, results)
    text = (tmp_path / "sweep.md").read_text()
    assert "| dspark | 2 | 16 | 1.20 | 0.97x (±2%, 5) | 0.91 | 25 |" in text
    assert "| dspark | 2 | paired | 7 / 2 | 0 / 0 | 0 / 0 | 0 / 4 | 0 / 0 |" in text
    assert "Closed loop: conc users" in text and "cores, float32)" in text.splitlines()[0]
    write_report(tmp_path, results, poisson=0.065, dtype="bfloat16")  # load and dtype named
    text = (tmp_path / "sweep.md").read_text()
    assert "Open loop: Poisson arrivals at 0.065 x conc requests per second." in text
    assert text.splitlines()[0].endswith("cores, bfloat16)")


@pytest.mark.engine
@pytest.mark.slow
def test_serving_sweep_quick(tmp_path):
    """One quick interleaved sweep (the sequential order is the same loop with one server per
    group: test_server_groups_...); plain decoding on the step-ledger scheduler (--ledger)."""
    from benchmarks.serving_sweep import main
    from tests.engine_utils import drafter_for_tests

    drafter = drafter_for_tests(tmp_path)
    main(["--quick", "--drafter", str(drafter), "--out", str(tmp_path / "sweep"),
          "--interleave", "--ledger"])
    r = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["results"]
    assert set(r) == {"no-spec", "dspark-adaptive"}
    for name in r:
        assert set(r[name]["points"]) == {"1", "2"} and r[name]["instances"] == 1
        assert r[name]["points"]["1"]["median"]["throughput_tok_s"] > 0
        assert len(r[name]["points"]["2"]["instance_throughput_tok_s"]) == 1
    # The budget's server exposes its status (cost lines, gate arms); plain decoding the
    # ledger's, without a budget.
    assert "gate" in r["dspark-adaptive"]["points"]["2"]["scheduler_status"]
    assert "steps_by_load" in r["dspark-adaptive"]["instance_status"][0]
    plain = r["no-spec"]["points"]["2"]
    assert "gate" not in plain["scheduler_status"]
    assert plain["median"]["ledger_decode_tok_s"] > 0
    md = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "step ledger" in md and "| dspark-adaptive | 2 |" in md
    assert "paired by server instance" in md
    assert (tmp_path / "sweep" / "frontier.png").stat().st_size > 0


def test_a_resumed_sweep_keeps_its_dtype(tmp_path, capsys):
    """--resume into a sweep measured in float32 with --dtype bfloat16 is refused by name,
    before any server starts (it would mix two dtypes in one report)."""
    from benchmarks.serving_sweep import main

    (tmp_path / "sweep.json").write_text(json.dumps({"args": {}, "results": {}}))  # pre-dtype
    with pytest.raises(SystemExit):
        main(["--resume", "--out", str(tmp_path), "--dtype", "bfloat16"])
    assert "was measured with --dtype float32" in capsys.readouterr().err


@pytest.mark.parametrize("argv, bad", [(["fixed", "--batch", "0"], "--batch 0: use 1 to 16"),
                                       (["fixed", "--k", "9"], "--k 9: use 1 to 7"),
                                       (["adaptive", "--k", "0"], "--k 0: use 1 to 7"),
                                       (["capped", "--k", "8"], "--k 8: use 1 to 7"),
                                       (["plain", "--offset", "16"], "--offset 16: use 0 to 15"),
                                       (["plain", "--offset", "12", "--batch", "8"],
                                        "--batch 8: use 1 to 4"),
                                       (["plain", "--dtype", "auto"], "invalid choice: 'auto'")])
def test_engine_profile_refuses_a_bad_size_by_name(argv, bad, capsys):
    from benchmarks.engine_profile import main

    with pytest.raises(SystemExit):  # before any engine starts
        main(argv)
    assert bad in capsys.readouterr().err


def test_engine_profile_adds_up_the_timers_of_the_processes_vllm_spawns(tmp_path, monkeypatch):
    """Under VLLM_ENABLE_V1_MULTIPROCESSING=1 the engine core and the worker each write
    their totals after every outermost timed call; the profile sums the files it finds,
    and a nested call writes nothing until the outer one returns."""
    from benchmarks import engine_profile as ep

    seen = []  # inner calls on file when an inner call starts: only finished outer ones

    class Engine:
        def step(self):
            self.inner()
            return self.inner()

        def inner(self):
            files = list(tmp_path.glob("*.json"))
            seen.append(json.loads(files[0].read_text())["core.inner"][1] if files else 0)
            return 7

    monkeypatch.setattr(ep, "TIMERS", collections.defaultdict(lambda: [0.0, 0]))
    monkeypatch.setattr(ep, "_dump_dir", tmp_path)
    monkeypatch.setenv(ep.SPAWNED_DIR_ENV, str(tmp_path))
    ep._time(Engine, "step", "core.step")
    ep._time(Engine, "inner", "core.inner")
    assert [Engine().step() for _ in range(3)] == [7, 7, 7]
    assert seen == [0, 0, 2, 2, 4, 4]  # the first inner call of a step is not on file yet
    gone = tmp_path / "removed-at-exit"  # the parent's atexit removed the folder: the
    monkeypatch.setattr(ep, "_dump_dir", gone)  # engine's shutdown steps still return
    assert Engine().step() == 7 and not gone.exists()
    (tmp_path / "999.json").write_text(json.dumps({"core.step": [1.5, 3]}))  # another process
    totals = ep._spawned_timers()
    assert totals["core.step"][1] == 6 and totals["core.inner"][1] == 6
    assert totals["core.step"][0] >= 1.5


def test_kernel_benchmark_quick_on_cpu(tmp_path):
    """bench_kernels --quick times the torch paths on a CPU and writes its report; the
    draft-block loop through the dispatcher draws the unfused loop's greedy tokens."""
    import torch

    from benchmarks import bench_kernels

    assert bench_kernels.main(["--quick", "--device", "cpu", "--threads", "1",
                               "--out", str(tmp_path / "k")]) == 0
    report = json.loads((tmp_path / "k.json").read_text())
    assert len(report["rows"]) == 8 and report["copy_GBps"] is None
    assert all(r["unfused_ms"] > 0 and r["reference_ms"] > 0 for r in report["rows"])
    assert "| fp32 | 64 | 4096 | 8 | sample |" in (tmp_path / "k.md").read_text()
    x = bench_kernels.block_inputs(3, 64, 200, 8, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(0)
    fused = bench_kernels.block_loop(x, True, True, gen)  # [B, K] target ids
    assert fused.shape == (3, bench_kernels.BLOCK_K)
    assert torch.equal(fused, bench_kernels.block_loop(x, False, True, gen))
    from dspark_vllm.block_graph import BlockGraphs  # eager on a CPU: the wrapper's plumbing
    for greedy in (True, False):
        assert torch.equal(bench_kernels.graphed_block(x, greedy, BlockGraphs()),
                           bench_kernels.block_loop(x, True, greedy, gen))


@pytest.mark.parametrize("argv, bad", [(["--host", "--device", "cpu"], "--host times CUDA"),
                                       (["--device", "tpu"], "invalid choice: 'tpu'")])
def test_kernel_benchmark_refuses_a_bad_device_by_name(argv, bad, capsys):
    from benchmarks import bench_kernels

    with pytest.raises(SystemExit):
        bench_kernels.main(argv)
    assert bad in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU refusal")
def test_block_graph_cost_refuses_a_machine_without_cuda(capsys):
    from benchmarks import block_graph_cost

    with pytest.raises(SystemExit):
        block_graph_cost.main([])
    assert "CUDA graphs need a CUDA device" in capsys.readouterr().err


def test_step_trace_sets_drafted_steps_beside_plain_ones_by_batch(tmp_path, capsys):
    import json

    from benchmarks import step_trace

    def row(batch, seconds, generated, prefill=0, verified=0, slots=0):
        return {"t": 0.0, "kind": "", "batch": batch, "waiting": 0, "tokens": batch,
                "prefill": prefill, "verified": verified, "slots": slots,
                "generated": generated, "seconds": seconds}

    plain = [row(8, 0.05, 8), row(8, 0.05, 8), row(8, 0.4, 9, prefill=300)]
    spec = [row(8, 0.1, 16, verified=16, slots=16),  # drafted: 160 tok/s against 160
            row(8, 0.05, 8),  # undrafted
            row(8, 0.08, 12, verified=16),  # a transition: left out
            row(2, 0.04, 4, verified=4, slots=4)]
    d = tmp_path / "trace"
    d.mkdir()
    for name, rows in (("steps-1.jsonl", plain), ("steps-2.jsonl", spec)):
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = step_trace.by_batch([plain, spec])
    assert table[8] == {"plain": [2, 0.1, 16], "drafted": [1, 0.1, 16], "undrafted": [1, 0.05, 8]}
    assert table[2]["plain"] == [0, 0.0, 0] and list(table) == [2, 8]
    step_trace.main([str(d)])
    out = capsys.readouterr().out
    assert "2 traces: 1 plain, 1 speculative" in out
    assert out.strip().splitlines()[-1].endswith("| 1.00x |")
    with pytest.raises(SystemExit, match="no steps"):
        step_trace.main([str(tmp_path)])


def test_step_trace_by_kind_reads_gzipped_traces_and_the_gap_between_steps(tmp_path, capsys):
    """--by-kind: each file alone, steps of at least --min-batch requests by kind, the engine
    time between two steps (an idle wait left out); a results folder's gzipped trace too."""
    import gzip
    import json

    from benchmarks import step_trace

    def row(t, batch, seconds, slots=0, verified=0, source=None):
        r = {"t": t, "batch": batch, "prefill": 0, "verified": verified, "slots": slots,
             "generated": batch, "seconds": seconds, "tokens": batch + verified}
        return r if source is None else {**r, "source": source}

    rows = [row(0.0, 16, 0.05), row(0.051, 16, 0.05),  # 1 ms around the second
            row(0.103, 16, 0.05, slots=32, source="lean"),  # 2 ms around a drafted one
            row(0.5, 16, 0.05),  # after an idle wait: left out
            row(0.551, 4, 0.05)]  # under --min-batch: left out
    table = step_trace.by_kind(rows, 14)
    assert list(table) == ["decode", "decode+draft"]
    assert table["decode"][:3] == [1, 0.05, 16] and table["decode"][3] == pytest.approx(0.001)
    assert table["decode+draft"][3] == pytest.approx(0.002)
    with gzip.open(tmp_path / "adaptive-steps.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    step_trace.main(["--by-kind", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.startswith("== budget adaptive-steps.jsonl.gz: steps 2 ")
    (tmp_path / "adaptive-steps.jsonl.gz").write_text("not gzip")  # a damaged file: named
    with pytest.raises(SystemExit, match="adaptive-steps.jsonl.gz: not a readable step trace"):
        step_trace.main(["--by-kind", str(tmp_path)])


def test_step_traces_are_named_by_the_server_whose_log_holds_their_engine_pid(tmp_path, capsys):
    """The sweep names each trace file's server from the engine pid its log prints (only
    files that exist, merged with names written before); --by-kind then prints the name,
    for a gzipped copy of the file too."""
    import gzip
    import json

    from benchmarks import step_trace

    logs, traces = tmp_path / "out", tmp_path / "trace"
    logs.mkdir(), traces.mkdir()
    (logs / "no-spec.log").write_text("(EngineCore pid=101) INFO start\n(APIServer pid=99) x\n")
    (logs / "dspark-k0-2.log").write_text("(EngineCore_DP0 pid=202) INFO start\n")
    (logs / "mtp-1.log").write_text("(EngineCore pid=303) INFO no trace of its own\n")
    row = {"t": 0.0, "batch": 16, "prefill": 0, "verified": 0, "slots": 0, "generated": 16,
           "seconds": 0.05, "tokens": 16}
    for pid in (101, 202):
        (traces / f"steps-{pid}.jsonl").write_text(json.dumps(row) + "\n")
    (traces / "servers.txt").write_text("steps-7.jsonl.gz earlier-run\n")
    names = step_trace.name_servers(logs, traces)
    assert names == {"steps-101.jsonl": "no-spec", "steps-202.jsonl": "dspark-k0-2",
                     "steps-7.jsonl": "earlier-run"}
    assert step_trace.read_servers(traces) == names
    assert step_trace.read_servers(logs) == {}  # no servers.txt: nothing named
    with gzip.open(traces / "steps-202.jsonl.gz", "wt") as f:
        f.write(json.dumps(row) + "\n")
    (traces / "steps-202.jsonl").unlink()
    step_trace.main(["--by-kind", str(traces)])
    out = capsys.readouterr().out
    assert "== no-spec steps-101.jsonl:" in out and "== dspark-k0-2 steps-202.jsonl.gz:" in out
    (traces / "servers.txt").write_text("steps-101.jsonl\n")  # a damaged line: named
    with pytest.raises(SystemExit, match="'steps-101.jsonl' is not '<trace file> <server>'"):
        step_trace.read_servers(traces)


@pytest.mark.parametrize("eager", [True, False])
def test_engine_profile_builds_an_eager_or_a_compiled_engine(monkeypatch, eager):
    """`--compiled` profiles the engine `vllm serve` runs by default (torch.compile); eager
    stays the default. A fake LLM records what the profile asks vLLM for."""
    import vllm

    from benchmarks.engine_profile import in_process_llm

    for var in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE",
                "VLLM_CPU_NUM_OF_RESERVED_CPU"):  # set here, so restored for later servers
        monkeypatch.setenv(var, os.environ.get(var, "0"))
    seen = {}
    monkeypatch.setattr(vllm, "LLM", lambda **kw: seen.update(kw))
    monkeypatch.setattr("dspark_vllm.target.prepare_target", lambda: "/target")
    in_process_llm(None, "bfloat16", eager=eager, max_num_seqs=4)
    assert seen["enforce_eager"] is eager and seen["dtype"] == "bfloat16"
    assert seen["model"] == "/target" and seen["max_num_seqs"] == 4


def test_the_never_drafting_control_is_named_only_and_drafts_nothing_at_any_batch():
    from benchmarks.serving_sweep import NAMED_ONLY, NEVER_DRAFTS, configs

    spec = configs("A", "no-head-here", (3,))[NEVER_DRAFTS]
    assert NEVER_DRAFTS in NAMED_ONLY and spec["method"] == "dspark" and spec["model"] == "A"
    schedule = spec["num_speculative_tokens_per_batch_size"]
    for batch in (1, 2, 16, 1024):  # vLLM's schedule: [first batch, last batch, drafts]
        assert [k for lo, hi, k in schedule if lo <= batch <= hi] == [0]


def test_soak_refuses_a_drafter_for_plain_vllm(capsys):
    from benchmarks import soak

    with pytest.raises(SystemExit):
        soak.main(["--plain", "--drafter", "some/drafter"])
    assert "--plain with --drafter some/drafter" in capsys.readouterr().err


def test_soak_memory_reads_as_one_mean_a_minute():
    """The soak's resident-memory samples become one mean a minute (MB), so a plateau after
    warm-up reads apart from a slope that a longer run would carry on."""
    from benchmarks.soak import rss_by_minute

    mb = 2**20
    samples = [(100.0, 10 * mb), (130.0, 20 * mb), (159.9, 30 * mb), (160.0, 40 * mb),
               (250.0, 50 * mb)]  # minutes 0, 0, 0, 1, 2 of the run
    assert rss_by_minute(samples) == [20.0, 40.0, 50.0]
    assert rss_by_minute([]) == []


def test_fixed_lengths_with_prompt_lookup_are_named_only_and_serve_with_the_switch(tmp_path):
    """dspark-kK-lookup: the fixed length K with DSPARK_PROMPT_LOOKUP on, run only when named,
    so the budget with lookup meets fixed lengths with lookup; the plain fixed length and the
    budget keep the defaults."""
    import argparse

    from benchmarks.serving_sweep import _server, configs, named_only

    cfgs = configs("A", "no-head-here", (3, 5))
    args = argparse.Namespace(eager=True, prefix_caching=False, executor=None, ledger=False,
                              dtype="float32", concurrency=[1])

    def env(name):
        return _server("T", name, cfgs[name], tmp_path, args).env.get("DSPARK_PROMPT_LOOKUP")

    for k in (3, 5):
        assert cfgs[f"dspark-k{k}-lookup"] == cfgs[f"dspark-k{k}"]
        assert named_only(f"dspark-k{k}-lookup") and not named_only(f"dspark-k{k}")
        assert env(f"dspark-k{k}-lookup") == "6" and env(f"dspark-k{k}") is None
    assert env("dspark-adaptive-lookup") == "6" and env("dspark-adaptive") is None
    assert not named_only("no-spec") and not named_only("dspark-adaptive")
