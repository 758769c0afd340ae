# test_bench_scaling.py -- the thread-scaling bench: one command, a full table of sane figures, rtkit planned; the census pattern.
import json
import os
import re
import subprocess
import sys

import pytest

from rtkit.bench import census, scaling
from conftest import requires_tf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench(*args, tmp_path):
    out = str(tmp_path / "scaling")
    cmd = [sys.executable, "-m", "rtkit.bench.scaling", "--out", out, "--no-progress", *args]
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    return proc, out


def _table_rows(text):
    """The replay table's body rows as lists of cells."""
    rows = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| threads") and re.match(r"^\| \d+ \|", line):
            rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_one_command_gives_every_row_sane_figures_and_rtkit_plans(tmp_path):
    proc, out = _bench("--threads", "1,2", "--steps", "2", "--warmup", "0", "--rounds", "1", "--scale", "0.001",
                       "--peers", "glibc,rtkit", "--no-workload", "--set", "malloc_profile_start=0",
                       "--set", "malloc_profile_stable=1", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = _table_rows(proc.stdout)
    assert [(r[0], r[1]) for r in rows] == [("1", "glibc"), ("1", "rtkit"), ("2", "glibc"), ("2", "rtkit")]
    for r in rows:
        step_ms, ratio, faults, waits, preempt = r[2], r[3], r[4], r[5], r[6]
        assert float(step_ms) > 0
        assert ratio.endswith("x") and float(ratio[:-1]) > 0
        assert float(faults) >= 0 and float(waits) >= 0 and float(preempt) >= 0
        assert r[8] == "1/1"
        assert re.fullmatch(r"planned \(\d+\)", r[7]) if r[1] == "rtkit" else r[7] == "-"
    bench = json.load(open(os.path.join(out, "scaling.json")))
    runs = bench["replay"]["runs"]
    assert len(runs) == 4 and all(r["status"] == "ok" for r in runs)
    for r in runs:
        assert len(r["result"]["step_ms"]) == 2 and r["result"]["threads"] == r["threads"]
        if r["peer"] == "rtkit":
            # the allocator's own stats file in the run's directory says it planned from the step marks
            stats = [f for f in os.listdir(r["run_dir"]) if f.startswith("allocator-") and f.endswith(".json")]
            assert stats and json.load(open(os.path.join(r["run_dir"], stats[0])))["state"] == "planned"
        else:
            assert r["result"]["rtkit_state"] == -1  # no step mark reached an allocator there
    assert os.path.exists(os.path.join(out, "scaling.md"))


def test_bad_thread_list_is_one_line_and_exit_2(tmp_path):
    proc, _ = _bench("--threads", "0,two", "--no-workload", tmp_path=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--threads" in proc.stderr


def test_default_threads_double_up_to_the_cores():
    assert scaling.default_threads(1) == [1]
    assert scaling.default_threads(2) == [1, 2]
    assert scaling.default_threads(6) == [1, 2, 4, 6]
    assert scaling.default_threads(16) == [1, 2, 4, 8, 16]
    assert scaling.parse_threads("1,2,4,8,16") == [1, 2, 4, 8, 16]
    with pytest.raises(scaling.BenchError):
        scaling.parse_threads("2,2")


def test_default_warmup_is_past_rtkits_longest_profiling():
    assert scaling.default_warmup({}) == 2 + 20 + 1
    assert scaling.default_warmup({"RTKIT_MALLOC_PROFILE_MAX": "5"}) == 2 + 5 + 1


def _check_steady_step(rec):
    """The pattern of a census record is its longer run's steady step; returns the rows."""
    rows = census.pattern(rec)
    long_run = max(rec["runs"], key=lambda r: r["steps"])
    # the large sizes are the plan's classes, as many blocks as the planner saw live together
    large = [(s, c) for s, c, _ in rows if s >= long_run["min_size_bytes"]]
    assert large == [(c["size_bytes"], float(c["blocks"])) for c in long_run["plan_classes"]]
    # the differenced small buckets account for the steady steps' allocations (start-up cancelled)
    steady = sorted(e["allocs"] for e in long_run["per_step"] if e["step"] >= 2)
    per_step = steady[len(steady) // 2]
    small = sum(c for s, c, _ in rows if s < long_run["min_size_bytes"])
    assert 0.8 * per_step < small < 1.25 * per_step
    return rows


def test_pattern_of_the_bundled_census_is_the_steady_wdl_step():
    rows = _check_steady_step(census.load())
    # long-lived blocks come only from the hash-node buckets
    assert {s for s, _, k in rows if k == census.LONG} and all(16 <= s < 64 for s, _, k in rows if k == census.LONG)
    assert all(c >= 1 for _, c, _ in census.scaled(rows, 0.0001))


@requires_tf
def test_recorded_census_of_real_wdl_runs_gives_a_pattern(tmp_path):
    path = str(tmp_path / "census.json")
    proc = subprocess.run([sys.executable, "-m", "rtkit.bench.scaling", "--record-census", path], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    rec = census.load(path)
    # the allocator's marks: one per step once the step signature has recurred (its first call is not yet known
    # to be the step), so each run has its steps or one fewer, and the two runs differ by exactly their difference
    marks = [r["steps"] for r in rec["runs"]]
    assert all(s - 1 <= m <= s for m, s in zip(marks, census.RECORD_STEPS)), marks
    assert marks[1] - marks[0] == census.RECORD_STEPS[1] - census.RECORD_STEPS[0], marks
    _check_steady_step(rec)
    # the same record again is refused: its runs' folder exists
    again = subprocess.run([sys.executable, "-m", "rtkit.bench.scaling", "--record-census", path], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert again.returncode == 2 and "--record-census" in again.stderr
