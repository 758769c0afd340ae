# test_recommend.py -- `rtkit recommend` on real reports of the bundled workloads that show each rule's condition.
import json
import os
import shlex
import sys

import pytest

from conftest import RTKIT, load_report, requires_tf, run_rtkit

SMALL = ["--batch", "256", "--rows", "4096", "--capacity", "4096", "--no-progress"]
PLAN_SIZE = ["--rows", "16384", "--capacity", "16384", "--no-progress"]


def _workload(data_dir, *args, small=SMALL):
    return [sys.executable, "-m", "rtkit.workloads", "wdl", *args, *small, "--data-dir", data_dir]


def _recommend(run_dir, *extra):
    proc = run_rtkit(["recommend", run_dir, "--json", *extra], check_rc=0)
    return {r["rule"]: r for r in json.loads(proc.stdout)}


def _follow(rec, run_dir):
    """Run the recommended command as printed (its `rtkit` is this checkout's), into `run_dir`."""
    argv = shlex.split(rec["command"])
    assert argv[:2] == ["rtkit", "run"] and "--" in argv
    run_rtkit(["run", "--run-dir", run_dir, *argv[2:]], check_rc=0)
    return load_report(run_dir)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, data_dir):
    """A plain run at the default batch (2048): the allocator profiles its first steps, which fault ~100 times
    a step, then plans (a fraction of a fault a step after). At batch 256 the profiled steps fault a few times
    a step: too little for the rule to call for a rerun, rightly."""
    run_dir = str(tmp_path_factory.mktemp("rec") / "profiled")
    run_rtkit(["run", "--run-dir", run_dir, "--", *_workload(data_dir, "--steps", "30", small=PLAN_SIZE)],
              check_rc=0)
    return run_dir


@requires_tf
def test_plan_rule_names_the_runs_plan_and_the_rerun_serves_it_from_the_start(profiled, tmp_path):
    report = load_report(profiled)
    recs = _recommend(profiled, "--mem-available", "100G")
    assert set(recs) == {"plan"}
    before = report["allocator"]["minor_faults_per_step_before_plan"]
    assert f"{os.path.join(profiled, 'malloc-plan.txt')}" in recs["plan"]["change"]
    assert f"{before:.3g}"[:3] in recs["plan"]["reason"]
    again = _follow(recs["plan"], str(tmp_path / "rerun"))
    assert again["allocator"]["plan"]["source"] == "loaded"
    # the claim: planned sizes are served from the first step, so the whole run's hit rate rises
    assert again["allocator"]["hit_rate"] > report["allocator"]["hit_rate"]
    # nothing left to gain on the rerun (a loaded plan; the scheduler off; memory given as plenty)
    nothing = _recommend(str(tmp_path / "rerun"), "--mem-available", "100G")
    assert set(nothing) == {"none"} and "nothing to gain" in nothing["none"]["reason"]
    assert nothing["none"]["command"] is None


@requires_tf
@requires_tf
def test_plan_rule_is_not_given_after_a_re_plan(profiled, tmp_path):
    """A re-planned run's plan file holds its last phase's sizes only: a rerun loading it would serve none of the
    earlier phases' blocks, so no rerun with it is recommended (the same run, its report saying one re-plan)."""
    import shutil

    copy = str(tmp_path / "replanned")
    shutil.copytree(profiled, copy)
    path = os.path.join(copy, "report.json")
    with open(path) as f:
        report = json.load(f)
    report["allocator"]["replans"] = dict(report["allocator"]["replans"], count=1)
    with open(path, "w") as f:
        json.dump(report, f)
    assert "plan" in _recommend(profiled, "--mem-available", "100G")
    assert "plan" not in _recommend(copy, "--mem-available", "100G")


def test_capacity_rule_sizes_the_pool_from_the_peak_rss(profiled):
    report = load_report(profiled)
    peak = report["process"]["peak_rss_bytes"]
    recs = _recommend(profiled, "--mem-available", str(peak))   # the job fills the memory it may use
    cap = recs["capacity"]
    want_g = max(1, -(-int(peak * 1.5) // (1 << 30)))
    assert f"--set tier_pool_size={want_g}G" in cap["command"] and "--profile capacity" in cap["command"]
    assert "100% of the memory available" in cap["reason"]
    text = run_rtkit(["recommend", profiled, "--mem-available", str(peak)], check_rc=0).stdout
    assert "--profile capacity" in text and "run: rtkit run" in text


def _head_for(report, available):
    """The DRAM head the capacity rule should give on a machine with `available` bytes: half of what is left
    after the run's non-table memory (its peak RSS less the tables, filled whole at initialisation here)."""
    rows = report["rows"]
    assert rows["table_fill"] == "eager" and rows["table_bytes"] > 0
    other = max(0, report["process"]["peak_rss_bytes"] - rows["table_bytes"])
    return (max(0, available - other) // 2) >> 20


@requires_tf
def test_capacity_rule_bounds_the_dram_head_from_the_memory_given(profiled):
    report = load_report(profiled)
    peak = report["process"]["peak_rss_bytes"]
    for available in (peak, 2 * peak):
        cap = _recommend(profiled, "--mem-available", str(available))["capacity"]
        head = _head_for(report, available)
        assert head > 0 and f"--set tier_dram_head={head}M" in cap["command"].split(" -- ")[0]
        assert "the DRAM head bounded from the memory available" in cap["reason"]
    # nothing left after the run's non-table memory: no anonymous head at all, whatever this machine has
    other = peak - report["rows"]["table_bytes"]
    assert other >= peak // 2     # small tables: the rule still fires on a machine with only the rest
    cap = _recommend(profiled, "--mem-available", str(other))["capacity"]
    assert "--set tier_dram_head=0 " in cap["command"] and "tier_dram_head=0, every table row" in cap["reason"]
    argv = shlex.split(cap["command"])
    assert argv.count("--profile") == 1 and sum(a.startswith("tier_dram_head=") for a in argv) == 1


@requires_tf
def test_input_rule_on_a_legacy_input_with_read_latency(tmp_path, data_dir):
    run_dir = str(tmp_path / "legacy")
    run_rtkit(["run", "--run-dir", run_dir, "--set", "sched=on", "--",
               *_workload(data_dir, "--steps", "30", "--input", "legacy", "--input-latency-ms", "20")], check_rc=0)
    share = load_report(run_dir)["scheduler"]["input_share_pct"]
    recs = _recommend(run_dir, "--mem-available", "100G")
    rec = recs["input"]
    assert rec["change"] == "--profile throughput" and f"{share:.0f}% of the op time" in rec["reason"]
    argv = shlex.split(rec["command"])
    # the run's own command, and the scheduler switches the profile sets are left to it
    assert argv[argv.index("--") + 1:] == _workload(data_dir, "--steps", "30", "--input", "legacy",
                                                    "--input-latency-ms", "20")
    assert "sched=on" not in rec["command"] and argv[2:4] == ["--profile", "throughput"]


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    proc = run_rtkit(["recommend", str(tmp_path)])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    proc = run_rtkit(["recommend", str(tmp_path), "--mem-available", "lots"])
    assert proc.returncode == 2 and "--mem-available" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


ROWS_SIZE = ["--batch", "256", "--rows", "4096", "--capacity", "65536", "--steps", "10", "--no-progress"]


@requires_tf
def test_rows_rule_on_hashed_rows_names_a_vocabulary_lookup_and_the_rerun_packs_them(tmp_path, data_dir):
    run_dir = str(tmp_path / "hashed")
    run_rtkit(["run", "--run-dir", run_dir, "--",
               *_workload(data_dir, "--table-fill", "lazy", "--row-assign", "hashed", small=ROWS_SIZE)], check_rc=0)
    rows = load_report(run_dir)["rows"]
    assert rows["not_measured"] is None and rows["row_pages"] > 4 * rows["packed_pages"]
    rec = _recommend(run_dir, "--mem-available", "100G")["rows"]
    assert "vocabulary lookup" in rec["change"] and "IntegerLookup" in rec["expect"]
    assert f"{rows['row_pages']:,} pages" in rec["reason"] and f"fill {rows['packed_pages']:,} pages" in rec["expect"]
    argv = shlex.split(rec["command"])
    assert argv[-2:] == ["--row-assign", "first-seen"] and "hashed" not in argv
    again = _follow(rec, str(tmp_path / "first-seen"))
    # the claim: the same rows packed, on about the pages the rule named (ids may collide a little differently)
    packed = again["rows"]
    assert packed["row_pages"] == packed["packed_pages"] <= 1.1 * rows["packed_pages"]
    assert "rows" not in _recommend(str(tmp_path / "first-seen"), "--mem-available", "100G")
    from rtkit.report import summary

    # the summary names scattered rows, and says nothing of packed ones
    assert any(line.startswith("rtkit: table rows: row scatter (pages / packed pages) ")
               for line in summary.lines(load_report(run_dir)))
    assert not any(line.startswith("rtkit: table rows:") for line in summary.lines(again))


@requires_tf
def test_rows_layout_not_measured_is_said_not_guessed(tmp_path, data_dir):
    run_dir = str(tmp_path / "hashed-eager")
    proc = run_rtkit(["run", "--run-dir", run_dir, "--",
                      *_workload(data_dir, "--row-assign", "hashed", small=ROWS_SIZE)], check_rc=0)
    rows = load_report(run_dir)["rows"]
    assert rows["row_pages"] is None and "keeps no record" in rows["not_measured"]
    assert "rtkit: table rows: layout not measured (hashed rows in tables filled at initialisation" in proc.stderr
    assert "rows" not in _recommend(run_dir, "--mem-available", "100G")


KERAS_FIT = """
import numpy as np
import tensorflow as tf
x = np.random.default_rng(0).random((320, 8)).astype("float32")
y = (x.sum(axis=1) > 4).astype("float32")
model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
model.fit(x, y, batch_size=32, epochs=2, verbose=0)
"""


@requires_tf
def test_input_share_not_measured_under_the_scheduler_says_why_not_that_it_was_off(tmp_path):
    """DeepCTR's Keras examples under --profile throughput (sched on): recommend's "nothing to gain" said "input stage
    share not measured (the scheduler was off: --set sched=on measures it)". The scheduler was on; it measures the
    stages on session steps, and Keras fit runs none. Without the scheduler the old words stay."""
    script = tmp_path / "fit.py"
    script.write_text(KERAS_FIT)
    words = {}
    for name, extra in (("on", ["--profile", "throughput"]), ("off", [])):
        run_dir = str(tmp_path / name)
        run_rtkit(["run", "--quiet", "--run-dir", run_dir, *extra, "--", sys.executable, str(script)], check_rc=0)
        assert load_report(run_dir)["steps"]["count"] == 20
        recs = _recommend(run_dir, "--mem-available", "100G")
        assert set(recs) == {"none"}, recs
        words[name] = recs["none"]["reason"]
    assert "the scheduler was off" not in words["on"], words["on"]
    assert "input stage share not measured (the scheduler measures it on session steps; Keras fit runs none)" \
        in words["on"], words["on"]
    assert "input stage share not measured (the scheduler was off: --set sched=on measures it)" in words["off"], words
