# test_lookahead_alone.py -- tier mode with the scheduler off (the capacity profile): the lookahead of fed ids alone.
import glob
import re
import sys

import pytest

from conftest import load_report, requires_tf, run_rtkit
from rtkit import config as cfg
from rtkit.report import sections, summary

pytestmark = pytest.mark.timeout(900)
MIB = 1 << 20


def _capacity(run_dir, pool, api="run", sets=(), profile="capacity", variables="resource"):
    """The user-style script (a table past the placement size, Adagrad, fed power-law ids) as the capacity profile's
    docs have a user run it: no scheduler setting; a small resident budget so that rows are out of DRAM. The heat
    budget's passes run inside the step marks (tier_heat_worker=0), so which pages are out of DRAM at a step does
    not depend on when a worker got to its pass. The pool has room for a dozen of the table's size: until the first
    step's sparse update the initializers' temporaries (initial values, constant kernels' buffers, the update's copy)
    are table-sized too, a request the full pool refuses goes to DRAM, where no lookahead finds it, and how many of
    them live at once depends on TensorFlow's order under load (400 MiB was refused so)."""
    args = ["run", "--quiet", "--run-dir", str(run_dir), "--profile", profile, "--set", f"tier_pool_path={pool}",
            "--set", "tier_pool_size=1G", "--set", f"tier_resident_max={16 * MIB}", "--set", "tier_dram_head=0",
            "--set", "tier_heat_worker=0"] + \
        [a for kv in sets for a in ("--set", kv)] + [
            "--", sys.executable, "-m", "rtkit.bench.user_table", "--rows", "300000", "--dim", "64", "--steps", "6",
            "--batch", "1024", "--api", api, "--variables", variables]
    proc = run_rtkit(args, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return re.findall(r"^loss \d+ \S+$", proc.stdout, re.M), load_report(str(run_dir))


@requires_tf
@pytest.mark.parametrize("api,variables", [("run", "resource"), ("callable", "resource"), ("monitored", "resource"),
                                           ("run", "reference")])
def test_capacity_profile_runs_the_fed_lookahead_without_the_scheduler(tmp_path, api, variables):
    """`rtkit run --profile capacity --set tier_pool_path=...` (sched=0): each step's fed rows are asked for just
    before it, for Session.run feed_dicts, make_callable callables (positional feeds) and MonitoredTrainingSession
    runs alike, and for a TF1 reference variable's table as for a resource variable's; nothing else of the
    scheduler runs (no session's ConfigProto is changed, nothing staged or tuned), and the summary says exactly
    that."""
    losses, report = _capacity(tmp_path / "on", tmp_path / "pool", api, variables=variables)
    sc = report["scheduler"]
    assert report["run"]["settings"]["sched"]["value"] is False
    assert sc is not None and sc["lookahead_only"] is True, sc
    la = sc["pipeline"]["lookahead"]
    assert la["state"] == "on" and la["rows_from"] == "feeds" and la["errors"] == 0, la
    assert la["batches"] == 6 and la["pages_requested"] > 0 and la["tables_measured"] == 1, la
    assert la["pages_checked"] > 0 and la["budget_pages_told"] > 0, la
    assert report["pmem"]["heat"]["on_worker"] is False, report["pmem"]["heat"]   # tier_heat_worker=0 held
    # only the pages not resident at the check are read; every page of the step's rows was checked
    assert 0 < la["pages_read_ahead"] <= la["pages_checked"] - la["pages_resident"], la
    # the pages requested are those of the rows where the table lies: the pages checked (at its address)
    assert la["pages_requested"] == la["pages_checked"], la
    # the rest of the scheduler did nothing: no session was given rtkit's threads, no step staged, no tuner
    assert "sessions" not in sc and sc["chosen"] is None and sc["tuning"] is None and sc["errors"] == [], sc
    line = summary.scheduler_line(report)
    assert line.startswith("rtkit: scheduler: off (sched=0: no thread pools, staging or tuning); only its "
                           "lookahead of fed ids ran (tier mode); lookahead "), line
    assert re.search(r"requested together just before their steps \(rows from the steps' feeds\) over 6 steps, "
                     r"[\d.]+% of the step's pages resident already \(mincore, 1 table\)", line), line
    rows = dict(sections.scheduler_section(report).rows)
    assert rows["state"].startswith("off (sched=0") and rows["lookahead"] in line, rows
    assert len(losses) == 6


@requires_tf
def test_the_lookahead_alone_trains_the_same_and_turns_off(tmp_path):
    """The lookahead changes no value the step computes: the same losses to the bit with it on and with
    sched_lookahead=off, which leaves nothing of the scheduler in the process (no scheduler report)."""
    on, _ = _capacity(tmp_path / "on", tmp_path / "pool")
    off, report = _capacity(tmp_path / "off", tmp_path / "pool", sets=["sched_lookahead=off"])
    assert len(on) == 6 and on == off
    assert report["scheduler"] is None and not glob.glob(str(tmp_path / "off" / "scheduler-*.json"))


def _paged(run_dir, pool, sets=()):
    """The user-style script under the capacity profile as it ships (tier_pager: rtkit pages the table itself), with
    16 MiB of room for it and a heat scan at every step from the first: the lookahead's pages are the scans' heat."""
    args = ["run", "--quiet", "--run-dir", str(run_dir), "--profile", "capacity", "--set", f"tier_pool_path={pool}",
            "--set", "tier_pool_size=1G", "--set", f"tier_pager_max={16 * MIB}", "--set", "tier_pager_heat_every=1",
            "--set", "tier_pager_heat_from=0"] + [a for kv in sets for a in ("--set", kv)] + [
            "--", sys.executable, "-m", "rtkit.bench.user_table", "--rows", "300000", "--dim", "64", "--steps", "10",
            "--batch", "1024"]
    proc = run_rtkit(args, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return re.findall(r"^loss \d+ \S+$", proc.stdout, re.M), load_report(str(run_dir))


@requires_tf
def test_the_fed_lookahead_tells_the_pager_its_pages_and_the_losses_stay(tmp_path):
    """Where rtkit's pager holds the table, each step's fed rows' pages are told to it (rtkit_tier_pager_heat): the
    table's region, told at every step, is write-protected at fewer heat scans than it is scanned, the eviction still
    runs, and the losses are those of the same run without the lookahead, to the bit."""
    on, report = _paged(tmp_path / "on", tmp_path / "pool")
    off, report_off = _paged(tmp_path / "off", tmp_path / "pool", sets=["sched_lookahead=off"])
    pg, pg_off = report["pmem"]["pager"], report_off["pmem"]["pager"]
    if not pg["on"]:
        pytest.skip(pg["note"])   # a kernel without userfaultfd's move and asynchronous write-protect
    assert len(on) == 10 and on == off
    la = report["scheduler"]["pipeline"]["lookahead"]
    assert la["state"] == "on" and la["rows_from"] == "feeds" and la["tables_measured"] == 1, la
    assert pg["told_pages"] > 0 and pg["regions_armed"] < pg["regions_scanned"], pg
    assert pg_off["told_pages"] == 0 and pg_off["regions_armed"] == pg_off["regions_scanned"], pg_off
    assert pg["evicted_pages"] > 0 and pg["read_errors"] == 0 and pg["write_errors"] == 0, pg


@requires_tf
def test_without_a_tier_pool_the_scheduler_off_leaves_nothing_running(tmp_path):
    """A user who does not use a tier pool sees no change: with sched=0 (the default profile) no part of the
    scheduler runs, whatever sched_lookahead says."""
    args = ["run", "--quiet", "--run-dir", str(tmp_path / "r"), "--set", "sched_lookahead=on", "--",
            sys.executable, "-m", "rtkit.bench.user_table", "--rows", "5000", "--dim", "4", "--steps", "3",
            "--batch", "64"]
    proc = run_rtkit(args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert load_report(str(tmp_path / "r"))["scheduler"] is None
    assert not glob.glob(str(tmp_path / "r" / "scheduler-*.json"))


def test_the_lookahead_runs_alone_only_in_tier_mode_with_the_scheduler_off():
    from rtkit.scheduler import feeds_only

    base = {s.key: s.default for s in cfg.SETTINGS}
    assert not feeds_only.wanted(base)                                   # no pool: nothing
    assert feeds_only.wanted(dict(base, tier_pool_path="/p"))            # the capacity profile's case
    assert feeds_only.wanted(dict(base, tier_pool_path="/p", sched_lookahead="measure"))
    assert not feeds_only.wanted(dict(base, tier_pool_path="/p", sched_lookahead="off"))
    assert not feeds_only.wanted(dict(base, tier_pool_path="/p", sched=True))   # the whole scheduler runs instead
    # the capacity profile, as its docs have a user run it, is that case
    assert feeds_only.wanted(cfg.resolve(env={}, profile="capacity").values)
