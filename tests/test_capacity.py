# test_capacity.py -- tier mode as a capacity feature, scaled down: a pool larger than the resident budget the test sets.
import json
import os
import subprocess
import sys

import pytest

from conftest import load_report, requires_tf, run_rtkit

pytestmark = pytest.mark.timeout(600)
MIB = 1 << 20


def _wdl(run_dir, data_dir, sets, table_gb="0.25", row_assign="first-seen"):
    args = ["run", "--run-dir", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    args += ["--", sys.executable, "-m", "rtkit.workloads", "wdl", "--table-gb", table_gb, "--steps", "25",
             "--batch", "256", "--rows", "4000", "--data-dir", str(data_dir), "--print-losses", "--no-progress",
             "--row-assign", row_assign, "--table-fill", "lazy"]
    proc = run_rtkit(args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, [line for line in proc.stdout.splitlines() if line.startswith("loss ")]


@requires_tf
def test_pool_larger_than_resident_budget_trains_like_dram(tmp_path):
    """256 MiB of tables and slots in a pool whose resident pages are held to 24 MiB: the pages past the
    budget are written out and dropped, training reads them back, the losses are DRAM's to the bit. Rows are
    hashed (scattered over the tables) so that the steps touch more pages than the budget holds (rows are
    filled on first use, so only touched pages count)."""
    data_dir = tmp_path / "data"
    _, dram_losses = _wdl(tmp_path / "dram", data_dir, [], row_assign="hashed")
    budget = 24 * MIB
    proc, tier_losses = _wdl(tmp_path / "tier", data_dir, [f"pmem_path={tmp_path / 'pool'}", "pmem_size=600M",
                                                           f"pmem_resident_max={budget}"], row_assign="hashed")
    assert len(dram_losses) == 25 and tier_losses == dram_losses
    report = load_report(tmp_path / "tier")
    p = report["pmem"]
    assert p["state"] == "on" and p["pmem_resident_max"] == budget
    assert p["tier_last_step_bytes"] >= 240 * MIB            # the tables and slots sat in the pool ...
    assert p["budget_passes"] >= 1 and p["budget_dropped_bytes"] >= 24 * MIB, (   # ... mostly out of DRAM
        p["budget_passes"], p["budget_dropped_bytes"], [x["resident_bytes"] for x in p["timeline"]])
    training = [x for x in p["timeline"] if x["tier_bytes"] >= p["tier_last_step_bytes"] // 2]
    # checked at most once a second: between checks the pool may go over, after a check it is under
    assert training and training[-1]["resident_bytes"] <= budget
    assert p["records"] and all(r["resident_bytes"] <= r["bytes"] + 4096 for r in p["records"])
    assert not (tmp_path / "pool").exists()                   # unlinked at create: nothing left behind
    # the summary line says what the tier held and what it cost
    tier_lines = [line for line in proc.stderr.splitlines() if line.startswith("rtkit: tier: ")]
    assert len(tier_lines) == 1 and "tier bytes held" in tier_lines[0] and "major faults/step (mean)" in tier_lines[0]
    assert isinstance(report["process"].get("disk_written_bytes"), int)


@requires_tf
def test_tables_are_filled_row_by_row_not_at_init(tmp_path):
    """First-seen rows: 1 GiB of tables and slots in the pool, of which the run's ~4000 ids per feature touch a
    few MiB. Nothing fills the tables at initialisation, so the pool's resident pages and the disk writes
    stay a small fraction of the tables; a 4x smaller table trains to the same losses (a row's initial
    value depends on the row, not on the table size)."""
    data_dir = tmp_path / "data"
    _, small_losses = _wdl(tmp_path / "small", data_dir, [], table_gb="0.25")
    proc, tier_losses = _wdl(tmp_path / "tier", data_dir, [f"pmem_path={tmp_path / 'pool'}", "pmem_size=2G"],
                             table_gb="1")
    assert len(small_losses) == 25 and tier_losses == small_losses
    report = load_report(tmp_path / "tier")
    p = report["pmem"]
    assert p["state"] == "on" and p["tier_last_step_bytes"] >= 1000 * MIB
    # the ~100k rows in use (26 features x 4 variables) and the pages around them, not the 1 GiB
    assert p["timeline"] and max(x["resident_bytes"] for x in p["timeline"]) <= 128 * MIB, p["timeline"][:3]
    assert report["process"]["disk_written_bytes"] <= 128 * MIB


def test_pool_bigger_than_its_disk_is_refused_before_the_run(tmp_path):
    marker = tmp_path / "ran"
    proc = run_rtkit(["run", "--quiet", "--set", f"pmem_path={tmp_path / 'pool'}", "--set", "pmem_size=1000000G",
                      "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"], timeout=60)
    assert proc.returncode == 2 and not marker.exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pmem_size" in lines[0] and "pmem_path" in lines[0], proc.stderr


def test_capacity_bench_refuses_what_cannot_fit(tmp_path):
    for args, word in ((["--dram-gb", "100000", "--pool-dir", str(tmp_path)], "pool"),
                       (["--dram-gb", "1", "--pool-dir", str(tmp_path / "nope")], "--pool-dir"),
                       (["--dram-gb", "1", "--pool-dir", str(tmp_path), "--resident-gb", "100000"], "--resident-gb")):
        proc = subprocess.run([sys.executable, "-m", "rtkit.bench.capacity", "--out", str(tmp_path / "o"), *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and word in lines[0], (args, proc.stderr)
    assert not (tmp_path / "o").exists()


def test_workload_refuses_tables_that_fit_neither_memory_nor_pool(tmp_path):
    """--table-gb past memory plus tier mode's pool: one line naming the knob, exit 2, before any data or TF work."""
    base = [sys.executable, "-m", "rtkit.workloads", "wdl", "--steps", "2", "--data-dir", str(tmp_path / "data")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTKIT_PMEM")}
    proc = subprocess.run(base + ["--table-gb", "100000"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "--table-gb 100000" in proc.stderr and "tier mode" in proc.stderr
    env.update(RTKIT_PMEM_PATH=str(tmp_path / "pool"), RTKIT_PMEM_SIZE="4G")
    proc = subprocess.run(base + ["--table-gb", "4000"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "4.0G pool (pmem_size)" in proc.stderr
    assert not (tmp_path / "data").exists()
