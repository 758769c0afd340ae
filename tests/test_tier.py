# test_tier.py -- PMEM tier mode of librtkit_malloc.so: placement, frees/realloc/fork, pool full, bad paths, TF run.
import fcntl
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys

import pytest

from conftest import load_report, requires_tf, run_rtkit
from rtkit.report import fmt

pytestmark = pytest.mark.timeout(300)

PMEM_FIELDS = ("tier_pool_path", "tier_pool_size", "tier_min_size", "tier_resident_max", "tier_bytes",
               "tier_peak_bytes", "tier_allocs", "tier_frees", "tier_fallbacks", "dram_bytes_saved_estimate",
               "state", "notes", "pool", "placed_before_first_step", "placed_long_lived", "process_rss_anon_bytes")


def run_tier(native, mode, extra, program="prmalloc_tier", timeout=120):
    """A tier-mode C test program (tests/<program>) under the preloaded library, with only `extra`'s RTKIT_* set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTKIT_") and k != "LD_PRELOAD"}
    env.pop("_RTKIT_MALLOC_ROOT", None)
    env["LD_PRELOAD"] = os.path.join(native, "librtkit_malloc.so")
    env.update(extra)
    return subprocess.run([os.path.join(native, "tests", program), mode], env=env, capture_output=True,
                          text=True, timeout=timeout)


def pmem_doc(run_dir):
    files = glob.glob(os.path.join(run_dir, "pmem-*.json"))
    assert len(files) == 1, os.listdir(run_dir)
    with open(files[0]) as fh:
        return json.load(fh)


def alloc_doc(run_dir):
    files = glob.glob(os.path.join(run_dir, "allocator-*.json"))
    assert len(files) == 1, os.listdir(run_dir)
    with open(files[0]) as fh:
        return json.load(fh)


def test_placement_frees_realloc_fork_long_lived(prm, tmp_path):
    run_dir, pool = tmp_path / "run", tmp_path / "pool"
    run_dir.mkdir()
    proc = run_tier(prm, "basic", {"RTKIT_RUN_DIR": str(run_dir), "RTKIT_TIER_POOL_PATH": str(pool)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "prmalloc_tier basic: ok\n"
    assert proc.stderr == ""
    doc = pmem_doc(run_dir)
    for key in PMEM_FIELDS:
        assert key in doc, key
    assert doc["state"] == "on" and doc["tier_pool_path"] == str(pool) and doc["tier_pool_size"] == 1 << 30
    assert doc["placed_before_first_step"]["allocs"] >= 4 * 5 * 40 + 5
    ll = doc["placed_long_lived"]
    assert ll["allocs"] >= 1 and ll["bytes"] == ll["allocs"] * 777777 and ll["sizes_known"] == 1
    # the file is written last at exit, after every free: nothing left in the pool, nothing lost
    assert doc["tier_allocs"] == doc["tier_frees"] and doc["tier_bytes"] == 0
    assert doc["tier_peak_bytes"] >= 3 << 20 and doc["tier_fallbacks"] == 0 and doc["bad_frees"] == 0
    assert doc["pool"]["extents"] == 0 and doc["pool"]["segments_free"] == doc["pool"]["segments"]
    assert "background_moves" in doc["pool"] and "background_moves" not in doc  # one place for the pool's figure
    assert doc["dram_bytes_saved_estimate"] >= 3 << 20  # the 3 MiB parameter sat in the pool through the steps
    assert not pool.exists()  # volatile scratch: removed at exit
    assert "pmem" not in alloc_doc(run_dir)  # one source per figure: the tier's own file


def test_table_sized_requests_are_placed_after_churn_stopped_placement(prm, tmp_path):
    """Churn before the first step keeps later requests in DRAM, but not a table-sized one (64 MiB or more): a
    script's initialised table is allocated after temporaries of its own size were freed."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = run_tier(prm, "churn", {"RTKIT_RUN_DIR": str(run_dir), "RTKIT_TIER_POOL_PATH": str(tmp_path / "pool")})
    assert proc.returncode == 0 and proc.stdout == "prmalloc_tier churn: ok\n", proc.stdout + proc.stderr
    pre = pmem_doc(run_dir)["placed_before_first_step"]
    assert pre["stopped_for_churn"] and pre["allocs"] == 257 and pre["bytes"] == (256 << 20) + (64 << 20), pre
    assert pre["still_placed_min_bytes"] == 64 << 20, pre


def test_dram_heads_keep_data_and_survive_fork_and_free(prm, tmp_path):
    # tier_dram_head, heat off: at the first mark the leading quarter of each 8 MiB record becomes a private mapping of
    # the pool file, and a step's writes there the process's own pages (the C program checks data, fork, free and the
    # written bytes while the heads live); here: what the report says of it
    run_dir, pool = tmp_path / "run", tmp_path / "pool"
    run_dir.mkdir()
    proc = run_tier(prm, "heads", {"RTKIT_RUN_DIR": str(run_dir), "RTKIT_TIER_POOL_PATH": str(pool),
                                   "RTKIT_TIER_DRAM_HEAD": str(4 << 20), "RTKIT_TIER_HEAT_EVERY": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "prmalloc_tier heads: ok\n" and proc.stderr == ""
    doc = pmem_doc(run_dir)
    head = doc["dram_head"]
    assert head["setting_bytes"] == 4 << 20 and head["budget_bytes"] == 4 << 20
    assert head["records"] == 2 and 3 << 20 <= head["bytes"] <= 4 << 20, head
    # nothing is copied at the mark (a copy would lose what other threads write meanwhile: heads_race); at exit
    # every head was given back, so none of its pages is the process's own any more
    assert "copied_bytes" not in head and head["written_bytes"] == 0, head
    assert head["restored_bytes"] == head["bytes"] and head["not_given_back"] == 0, head
    # the first sample (right after the mark) counts the file pages outside the heads (at least b's 6 MiB past
    # its head and a's two rows there); each record's DRAM is its file pages plus its head's
    first = doc["timeline"][0]
    assert first["resident_bytes"] >= (6 << 20) + (100 << 10), doc["timeline"][:2]
    b_rec = max(doc["records"], key=lambda r: r["resident_bytes"])
    assert b_rec["resident_bytes"] >= 8 << 20 and b_rec["dram_head_bytes"] == head["bytes"] // 2, doc["records"]
    # what the steps wrote of the heads is anonymous memory (the rest of them is the file's page cache): not saved
    assert 0 < head["written_peak_bytes"] < head["bytes"], head
    assert doc["dram_bytes_saved_estimate"] == doc["tier_last_step_bytes"] - head["written_peak_bytes"] > 0, doc


@pytest.mark.parametrize("heat,by_heat_pct", [("0", "50"), ("1", "50"), ("1", "0")])
def test_dram_heads_lose_no_write_of_a_thread_that_updates_the_table_through_the_mark(prm, tmp_path, heat,
                                                                                       by_heat_pct):
    """A thread keeps adding to a 64 MiB table while another marks steps, whose first makes the table's head and,
    with page heat, whose passes promote its written chunks (a parameter server's updates arrive so, and so do a
    Hogwild trainer's other threads): every update is in the table afterwards. Heads made by copying the range and
    moving the copy over it lost 23-32% of them (3 runs)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = run_tier(prm, "heads_race", {"RTKIT_RUN_DIR": str(run_dir), "RTKIT_TIER_POOL_PATH": str(tmp_path / "pool"),
                                        "RTKIT_TIER_DRAM_HEAD": str(64 << 20), "RTKIT_TIER_HEAT_EVERY": heat,
                                        "RTKIT_TIER_HEAT_WORKER": "0", "RTKIT_TIER_DRAM_HEAD_HEAT_PCT": by_heat_pct})
    assert proc.returncode == 0 and proc.stdout == "prmalloc_tier heads_race: ok\n", proc.stdout + proc.stderr
    head = pmem_doc(run_dir)["dram_head"]
    assert head["records"] == 1, head
    if heat == "0" or by_heat_pct == "0":  # the whole table was its head while it was written
        assert head["bytes"] >= 63 << 20 and head["by_heat"]["bytes"] == 0, head
    else:  # half of it the head, half promoted by the heat passes while it was written
        assert 31 << 20 <= head["bytes"] <= 32 << 20 and head["by_heat"]["bytes"] >= 31 << 20, head


def test_heat_promotes_the_written_tables_chunks_with_the_heads_other_half(prm, tmp_path):
    """Two tables, one written at every step and one never: the heat passes give the half of tier_dram_head the
    leading shares leave to the written table's chunks; data, fork and free as with heads (the C program)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = run_tier(prm, "heads_heat", {"RTKIT_RUN_DIR": str(run_dir), "RTKIT_TIER_POOL_PATH": str(tmp_path / "pool"),
                                        "RTKIT_TIER_DRAM_HEAD": str(8 << 20), "RTKIT_TIER_HEAT_EVERY": "1",
                                        "RTKIT_TIER_HEAT_WORKER": "0", "RTKIT_TIER_DRAM_HEAD_HEAT_PCT": "50"})
    assert proc.returncode == 0 and proc.stdout == "prmalloc_tier heads_heat: ok\n", proc.stdout + proc.stderr
    head = pmem_doc(run_dir)["dram_head"]
    heat = head["by_heat"]
    assert heat["bytes"] == 4 << 20 and heat["chunks"] == 64 and heat["restored_bytes"] == 4 << 20, head
    assert heat["runs"] == 0 and heat["runs_refused"] == 0, head  # every run given back at the free
    # the steps wrote a page in 4 KiB of the written table's 2 MiB head and of its 4 MiB promoted
    assert (6 << 20) - 8192 <= head["written_peak_bytes"] <= 6 << 20, head
    from rtkit.report.tier_view import tier_view
    line = dict(tier_view({"pmem": pmem_doc(run_dir)})["rows"])["heads in DRAM (tier_dram_head)"]
    assert "2 records of 1 MiB or more (tables or other long-lived memory), made in" in line, line
    assert "plus 4.00 MiB of the hottest chunks chosen by page heat; up to" in line, line


def test_heat_share_of_a_large_head_budget_is_what_its_promotions_can_hold(tmp_path):
    """A 768 MiB head budget over 1.5 GiB of tables: heat's half would be 384 MiB, more than the 4,096 promotions a
    process may make can hold when they are single chunks (256 MiB), so heat takes 256 MiB and the leading shares
    the other 512 MiB (uncapped, a scattered pool left most of heat's half unspent). Nothing is written: the heads
    are mappings of the file, no memory."""
    run_dir = tmp_path / "run"
    script = ("import rtkit\n"
              "tables = [bytearray(512 << 20) for _ in range(3)]\n"
              "for i in range(3):\n"
              "    tables[0][i * 4096] = 1\n"
              "    rtkit.step()\n")
    run_rtkit(["run", "--quiet", "--run-dir", str(run_dir), "--set", f"tier_pool_path={tmp_path / 'pool'}",
               "--set", "tier_pool_size=2G", "--set", "tier_min_size=1M", "--set", "tier_dram_head=768M",
               "--set", "tier_heat_every=1", "--set", "tier_dram_head_heat_pct=50", "--", sys.executable, "-c", script],
              timeout=300, check_rc=0)
    pmem = load_report(run_dir)["pmem"]
    unavailable = [n for n in pmem.get("notes") or [] if "page heat unavailable" in n]
    if unavailable:  # no heat: the leading shares take the whole budget, nothing to cap
        pytest.skip(unavailable[0])
    head = pmem["dram_head"]
    assert head["records"] == 3 and (512 << 20) - 3 * 4096 <= head["bytes"] <= 512 << 20, head


def test_report_says_how_much_of_the_heads_the_steps_wrote(tmp_path):
    """rtkit run, a table made before the first step and its first MiB rewritten every step: the head's written
    pages are the process's own (anonymous), the rest of the head stays the file's; the tier view says how much.
    (Heat off: the whole budget is the leading share.)"""
    from rtkit.report import sections as sec
    run_dir = tmp_path / "run"
    script = ("import rtkit\n"
              "table = bytearray(8 << 20)\n"
              "for i in range(6):\n"
              "    table[0:1 << 20] = bytes([i + 1]) * (1 << 20)\n"
              "    rtkit.step()\n"
              "assert table[(1 << 20) - 1] == 6 and table[1 << 20] == 0\n")
    run_rtkit(["run", "--quiet", "--run-dir", str(run_dir), "--set", f"tier_pool_path={tmp_path / 'pool'}",
               "--set", "tier_min_size=1M", "--set", "tier_dram_head=4M", "--set", "tier_heat_every=0", "--",
               sys.executable, "-c", script],
              timeout=180, check_rc=0)
    report = load_report(run_dir)
    head = report["pmem"]["dram_head"]
    assert head["records"] == 1 and (4 << 20) - 4096 <= head["bytes"] <= 4 << 20, head
    # Python frees the table at exit, its head with it: the figure of a live head is the most seen
    assert head["restored_bytes"] == head["bytes"] and head["written_bytes"] == 0, head
    assert (1 << 20) - 8192 <= head["written_peak_bytes"] <= 1 << 20, head
    rows = dict((k.strip(), v) for s in sec.build_sections(report) if s.key == "tier" for k, v in s.rows)
    line = rows["heads in DRAM (tier_dram_head)"]
    assert f"up to {fmt.nbytes(head['written_peak_bytes'])} of them written by the steps" in line, line


@pytest.mark.parametrize("budget,warned", [("4M", True), ("64M", False)])
def test_summary_says_when_the_pool_stayed_above_its_resident_budget(tmp_path, budget, warned):
    """A pool on tmpfs with no swap: its pages cannot be dropped, so a 4 MiB resident budget over a 32 MiB table is
    never met, whatever the passes do; the summary's tier line gives the median beside the budget and warns. A
    budget the table fits in: the same figures, no warning."""
    if not os.path.isdir("/dev/shm") or any(line.split()[0] != "Filename" for line in open("/proc/swaps")):
        pytest.skip("needs /dev/shm and no swap (tmpfs pages that cannot be dropped)")
    run_dir = tmp_path / "run"
    pool = f"/dev/shm/rtkit-test-budget-{os.getpid()}-{budget}"
    # samples come at steps 1, 2, 4, 8, 16, each spaced past 50x the last one's cost (microseconds here): the
    # sleep keeps that spacing whatever the machine's load, so steps 4, 8 and 16 are sampled while training
    script = ("import time, rtkit\n"
              "table = bytearray(32 << 20)\n"
              "for i in range(20):\n"
              "    table[::4096] = bytes([i + 1]) * (len(table) // 4096)\n"
              "    time.sleep(0.1)\n"
              "    rtkit.step()\n")
    try:
        proc = run_rtkit(["run", "--run-dir", str(run_dir), "--set", f"tier_pool_path={pool}", "--set", "tier_min_size=1M",
                          "--set", f"tier_resident_max={budget}", "--", sys.executable, "-c", script],
                         timeout=180, check_rc=0)
    finally:
        if os.path.exists(pool):
            os.unlink(pool)
    tier_line = [line for line in proc.stderr.splitlines() if line.startswith("rtkit: tier: ")]
    assert len(tier_line) == 1, proc.stderr[-3000:]
    assert f"budget (tier_resident_max) {fmt.nbytes(int(budget[:-1]) << 20)}" in tier_line[0], tier_line
    assert re.search(r"median (3[0-9]\.\d|32\.\d) MiB", tier_line[0]), tier_line
    assert ("warning: the pool's pages in DRAM stayed above tier_resident_max (4.00 MiB)" in tier_line[0]) == warned, \
        tier_line


def test_pool_pages_in_dram_count_a_page_small_records_share_once(prm, tmp_path):
    """8192 written records of 1,500 bytes (12 MiB) lie on about 3,000 pages: the report's pool pages in DRAM say so.
    Summed record by record, a page two records share counted twice (about 1.9x the bytes)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = run_tier(prm, "small", {"RTKIT_RUN_DIR": str(run_dir), "RTKIT_TIER_POOL_PATH": str(tmp_path / "pool"),
                                   "RTKIT_TIER_MIN_SIZE": "256"})
    assert proc.returncode == 0 and proc.stdout == "prmalloc_tier small: ok\n", proc.stdout + proc.stderr
    doc = pmem_doc(run_dir)
    live = 8192 * 1500
    training = [x for x in doc["timeline"] if x["tier_bytes"] >= live]
    assert training, doc["timeline"]
    # every record is written, so at least their bytes are in DRAM; the pool's headers and rounding add a little
    assert all(live <= x["resident_bytes"] <= live * 1.35 for x in training), (training, doc["records_live"])


def test_pool_full_falls_back_to_dram(prm, tmp_path):
    proc = run_tier(prm, "full", {"RTKIT_RUN_DIR": str(tmp_path), "RTKIT_TIER_POOL_PATH": str(tmp_path / "pool"),
                                  "RTKIT_TIER_POOL_SIZE": "4M"})
    assert proc.returncode == 0, proc.stderr
    doc = pmem_doc(tmp_path)
    assert doc["tier_pool_size"] == 4 << 20
    assert doc["tier_fallbacks"] >= 1 and doc["tier_fallback_bytes"] == doc["tier_fallbacks"] * 1000000
    assert doc["tier_allocs"] >= 2 and doc["tier_allocs"] == doc["tier_frees"]
    # the largest request refused, with what the pool held then (no step mark in this program: before the first)
    assert doc["tier_fallback_largest"] == 1000000 and 0 < doc["tier_fallback_largest_held"] <= 4 << 20, doc
    assert doc["tier_fallback_largest_before_first_step"] is True


@requires_tf
def test_summary_says_a_table_found_no_room_in_the_pool_and_how_large_a_pool_gives_it_room(tmp_path):
    """A 73 MiB table and its 73 MiB Adagrad slot cannot both go in a 128 MiB pool: what fell back to DRAM is a
    warning on the tier line with the pool's size grown by every byte that fell back, rounded up to 256 MiB."""
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--profile", "capacity",
                      "--set", f"tier_pool_path={tmp_path / 'pool'}", "--set", "tier_pool_size=128M",
                      "--set", "tier_dram_head=0", "--", sys.executable, "-m", "rtkit.bench.user_table",
                      "--rows", "300000", "--dim", "64", "--steps", "3", "--batch", "256"], timeout=600, check_rc=0)
    p = load_report(str(tmp_path / "r"))["pmem"]
    assert p["tier_fallback_largest"] >= 300000 * 64 * 4 and p["tier_fallback_bytes"] >= p["tier_fallback_largest"], p
    enough = -(-((128 << 20) + p["tier_fallback_bytes"]) // (256 << 20)) * (256 << 20)
    tier_line = [line for line in proc.stderr.splitlines() if line.startswith("rtkit: tier: ")]
    assert len(tier_line) == 1, proc.stderr[-3000:]
    assert (f"found no room in the pool and stayed in DRAM ({fmt.nbytes(p['tier_fallback_bytes'])}; the largest "
            f"{fmt.nbytes(p['tier_fallback_largest'])}, when the pool held "
            f"{fmt.nbytes(p['tier_fallback_largest_held'])} of its {fmt.nbytes(128 << 20)}, before the first step: ") in tier_line[0], \
        tier_line
    assert f"tier_pool_size={enough >> 20}M ({fmt.nbytes(enough)}) or more gives them room" in tier_line[0], tier_line
    # `rtkit recommend` gives the same size; its command, followed, puts in the pool what went to DRAM (a pool
    # 4x as large: TensorFlow's order under load may vary what lives at once, never by 5 tables' worth)
    recs = {r["rule"]: r for r in json.loads(run_rtkit(["recommend", str(tmp_path / "r"), "--json", "--mem-available",
                                                        "100G"], check_rc=0).stdout)}
    assert recs["pool"]["change"] == f"--set tier_pool_size={enough >> 20}M", recs
    argv = shlex.split(recs["pool"]["command"])
    run_rtkit(["run", "--run-dir", str(tmp_path / "again"), *argv[2:]], timeout=600, check_rc=0)
    again = load_report(str(tmp_path / "again"))["pmem"]
    assert again["tier_pool_size"] == enough and again["tier_fallback_bytes"] < p["tier_fallback_bytes"], again


@pytest.mark.parametrize("where", ["missing_dir", "proc", "not_a_pool"])
def test_bad_path_one_line_job_runs(prm, tmp_path, where):
    path = {"missing_dir": tmp_path / "no" / "such" / "pool", "proc": "/proc/rtkit-tier-pool",
            "not_a_pool": tmp_path / "precious.txt"}[where]
    if where == "not_a_pool":
        path.write_text("user data\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = run_tier(prm, "plain", {"RTKIT_RUN_DIR": str(run_dir), "RTKIT_TIER_POOL_PATH": str(path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "prmalloc_tier plain: ok\n"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "RTKIT_TIER_POOL_PATH" in lines[0] and str(path) in lines[0], proc.stderr
    doc = pmem_doc(run_dir)
    assert doc["state"] == "failed" and doc["tier_allocs"] == 0 and doc["notes"]
    if where == "not_a_pool":
        assert path.read_text() == "user data\n"


def test_long_pool_path_works_and_too_long_says_one_line(prm, tmp_path):
    deep = tmp_path.joinpath(*(["d" * 200] * 3))   # ~700 bytes: legal on Linux (PATH_MAX 4096)
    deep.mkdir(parents=True)
    pool = deep / "pool"
    assert len(str(pool)) >= 600
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = run_tier(prm, "basic", {"RTKIT_RUN_DIR": str(run_dir), "RTKIT_TIER_POOL_PATH": str(pool)})
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout == "prmalloc_tier basic: ok\n", proc.stderr
    doc = pmem_doc(run_dir)
    assert doc["state"] == "on" and doc["tier_pool_path"] == str(pool) and doc["tier_allocs"] >= 1, doc
    too_long = str(tmp_path / ("x" * 5000))
    run2 = tmp_path / "run2"
    run2.mkdir()
    proc = run_tier(prm, "plain", {"RTKIT_RUN_DIR": str(run2), "RTKIT_TIER_POOL_PATH": too_long})
    assert proc.returncode == 0 and proc.stdout == "prmalloc_tier plain: ok\n"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "RTKIT_TIER_POOL_PATH" in lines[0] and "longer than" in lines[0], proc.stderr
    assert pmem_doc(run2)["state"] == "failed"


def test_pool_held_by_another_process_stays_in_dram(prm, tmp_path):
    pool = tmp_path / "pool"
    pool.write_bytes(b"RTKPMEM1" + bytes(4088))
    with open(pool, "rb+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        proc = run_tier(prm, "plain", {"RTKIT_RUN_DIR": str(tmp_path), "RTKIT_TIER_POOL_PATH": str(pool)})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert pmem_doc(tmp_path)["state"] == "busy"
    assert pool.read_bytes()[:8] == b"RTKPMEM1"


def test_existing_file_at_pool_path_is_left_alone_and_bad_size_reported(prm, tmp_path):
    pool = tmp_path / "pool"
    pool.write_bytes(b"RTKPMEM1" + bytes(4088))  # left by a job that died: not created by this run, kept
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = run_tier(prm, "plain", {"RTKIT_RUN_DIR": str(run_dir), "RTKIT_TIER_POOL_PATH": str(pool),
                                  "RTKIT_TIER_POOL_SIZE": "4M", "RTKIT_TIER_MIN_SIZE": "lots"})
    assert proc.returncode == 0, proc.stderr
    bad = [line for line in proc.stderr.splitlines() if "RTKIT_TIER_MIN_SIZE" in line]
    assert len(bad) == 1 and "lots" in bad[0]
    doc = pmem_doc(run_dir)
    assert doc["state"] == "failed" and doc["tier_min_size"] == 64 << 10 and "exists" in " ".join(doc["notes"]), doc
    assert pool.read_bytes() == b"RTKPMEM1" + bytes(4088)


def test_the_old_setting_names_still_work_with_one_line_each(prm, tmp_path):
    """The tier's settings were pmem_*: the old variables are read for one release, each said once per run."""
    run_dir, pool = tmp_path / "run", tmp_path / "pool"
    run_dir.mkdir()
    old = {"RTKIT_RUN_DIR": str(run_dir), "RTKIT_PMEM_PATH": str(pool), "RTKIT_PMEM_SIZE": "4M"}
    proc = run_tier(prm, "plain", old)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "is renamed" in line]
    assert len(said) == 2 and any("RTKIT_PMEM_PATH is renamed RTKIT_TIER_POOL_PATH" in l for l in said), proc.stderr
    doc = pmem_doc(run_dir)
    assert doc["state"] == "on" and doc["tier_pool_path"] == str(pool) and doc["tier_pool_size"] == 4 << 20, doc
    assert len([n for n in doc["notes"] if "is renamed" in n]) == 2, doc["notes"]
    again = run_tier(prm, "plain", old)  # a second process of the run stays silent
    assert again.returncode == 0 and "is renamed" not in again.stderr, again.stderr


def test_off_writes_no_pmem_file(prm, tmp_path):
    proc = run_tier(prm, "plain", {"RTKIT_RUN_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert not glob.glob(os.path.join(tmp_path, "pmem-*.json"))
    assert "pmem" not in alloc_doc(tmp_path)


@pytest.mark.parametrize("mode,line", [("double_free", "free(): double free of"),
                                       ("realloc_freed", "realloc(): invalid pointer")])
def test_a_freed_pool_block_freed_or_reallocated_again_aborts_with_one_line(prm, tmp_path, mode, line):
    # the pool counted the second free and went on: glibc aborts on it ("double free or corruption")
    proc = run_tier(prm, mode, {"RTKIT_RUN_DIR": str(tmp_path), "RTKIT_TIER_POOL_PATH": str(tmp_path / "pool")})
    assert proc.returncode == -signal.SIGABRT and "survived" not in proc.stdout, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if line in ln]
    assert len(lines) == 1 and re.search(r"0x[0-9a-f]+", lines[0]), proc.stderr


def test_two_frees_racing_for_one_pool_block_free_it_once(prm, tmp_path):
    # two threads past the owner lookup free the same payload: one gives the record back, the other is told it lost
    # (free() aborts on that), 200 times; a second winner would free the record twice and punch a live block's pages
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTKIT_") and k != "LD_PRELOAD"}
    env.update({"RTKIT_TIER_POOL_PATH": str(tmp_path / "pool"), "RTKIT_RUN_DIR": str(tmp_path)})
    proc = subprocess.run([os.path.join(prm, "tests", "prmalloc_unit_tier")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout == "prmalloc_unit_tier: ok\n", proc.stdout + proc.stderr[-3000:]


TF_SCRIPT = r"""
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
ids = tf.compat.v1.placeholder(tf.int64, [256])
x = tf.compat.v1.placeholder(tf.float32, [256, 256])
table = tf.Variable(tf.random.normal([20000, 32]))   # 2.5 MB embedding table
w = tf.Variable(tf.random.normal([288, 256]))
emb = tf.nn.embedding_lookup(table, ids)
loss = tf.reduce_mean(tf.nn.relu(tf.matmul(tf.concat([x, emb], 1), w)))
train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss)
rng = np.random.default_rng(0)
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    for _ in range(20):
        sess.run(train, {ids: rng.integers(0, 20000, 256), x: rng.random((256, 256), np.float32)})
print("tf-done")
"""


@requires_tf
def test_tensorflow_run_report_has_pmem_section(prm, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TF_SCRIPT)
    run_dir = tmp_path / "r"
    proc = run_rtkit(["run", "--quiet", "--run-dir", str(run_dir), "--set", f"tier_pool_path={tmp_path / 'pool'}", "--",
                      sys.executable, str(script)], timeout=300,
                     env={"RTKIT_LIB_DIR": prm})  # the library just built (test_pmem points RTKIT_LIB_DIR elsewhere)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tf-done" in proc.stdout
    report = load_report(run_dir)
    pmem = report["pmem"]
    assert pmem is not None and pmem["state"] == "on", pmem
    # table, its two Adam slots and the dense weights were made before the first step
    assert pmem["placed_before_first_step"]["bytes"] >= 3 * 20000 * 32 * 4
    assert pmem["tier_bytes"] > 0 or pmem["tier_last_step_bytes"] > 0
    # at least the table and one of its slots were still in the pool in the last step (TF may copy a variable's
    # buffer on its first update, after the first mark)
    assert pmem["tier_last_step_bytes"] >= 2 * 20000 * 32 * 4
    assert "pmem" not in report["allocator"]
    assert not (tmp_path / "pool").exists()


# A Keras fit with no embedding table at all; like pandas's import (3.7 MiB, DeepCTR's examples), the script holds a
# long-lived array of 1 MiB or more made before the first step.
NO_TABLE_FIT = r"""
import numpy as np
import tensorflow as tf
lookup = np.arange(1 << 19, dtype=np.int64)   # 4 MiB, kept to the end: not a table
x = np.random.RandomState(0).rand(640, 8).astype("float32"); y = (x.sum(1) > 4).astype("float32")
m = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1)])
m.compile(optimizer="adam", loss="mse")
m.fit(x, y, batch_size=32, epochs=2, verbose=0)
print("fit-done", int(lookup[-1]))
"""


@requires_tf
def test_heads_of_allocations_that_are_no_table_are_not_called_table_heads(prm, tmp_path):
    """tier_dram_head gives a head to every pooled allocation of 1 MiB or more, table or not, and rtkit cannot tell
    which is a table. The capacity profile's summary said "table heads in anonymous DRAM 3.66 MiB" of DeepCTR's
    examples, whose tables are all under tier_min_size: the head was pandas's import-time array. The summary and
    the tier view say what got the heads without calling them tables."""
    from rtkit.report import sections as sec
    script = tmp_path / "fit.py"
    script.write_text(NO_TABLE_FIT)
    run_dir = tmp_path / "r"
    # the heads themselves: the capacity profile's pager (tier_pager) stands aside (test_pager.py has its words)
    proc = run_rtkit(["run", "--run-dir", str(run_dir), "--profile", "capacity",
                      "--set", f"tier_pool_path={tmp_path / 'pool'}", "--set", "tier_pool_size=1G",
                      "--set", "tier_pager=0", "--", sys.executable, str(script)], timeout=300,
                     env={"RTKIT_LIB_DIR": prm})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fit-done 524287" in proc.stdout
    report = load_report(run_dir)
    head = report["pmem"]["dram_head"]
    assert head["records"] >= 1 and head["bytes"] >= 3 << 20, head
    line = next(l for l in proc.stderr.splitlines() if l.startswith("rtkit: tier:"))
    assert "table heads" not in line, line
    n = head["records"]
    assert (f"heads in anonymous DRAM {fmt.nbytes(head['bytes'])} ({n} pooled allocation{'' if n == 1 else 's'} "
            "of 1 MiB or more: tables or other long-lived memory)") in line, line
    rows = dict((k.strip(), v) for s in sec.build_sections(report) if s.key == "tier" for k, v in s.rows)
    assert not any("table heads" in k for k in rows), rows
    assert "of 1 MiB or more (tables or other long-lived memory)" in rows["heads in DRAM (tier_dram_head)"], rows


# A Keras 2 fit whose steps rtkit does not see (hooks off): every large allocation is churn, none is a table.
KERAS2_FIT = r"""
import os
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tensorflow as tf
x = np.random.RandomState(0).rand(20000, 64).astype("float32"); y = (x.sum(1) > 32).astype("float32")
m = tf.keras.Sequential([tf.keras.layers.Dense(512, activation="relu", input_shape=(64,)),
                         tf.keras.layers.Dense(512, activation="relu"), tf.keras.layers.Dense(1)])
m.compile(optimizer="adam", loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
m.fit(x, y, batch_size=256, epochs=3, verbose=0)
print("fit-done")
"""


@requires_tf
def test_tier_mode_without_steps_costs_no_memory_it_does_not_save(prm, tmp_path):
    """Placement before a first step is bounded: without any step the job stays near its plain RSS, and says why."""
    pytest.importorskip("tf_keras")
    script = tmp_path / "fit.py"
    script.write_text(KERAS2_FIT)
    peaks = {}
    for name, extra in (("plain", []), ("tier", ["--set", f"tier_pool_path={tmp_path / 'pool'}"])):
        run_dir = tmp_path / name
        proc = run_rtkit(["run", "--run-dir", str(run_dir), "--set", "hooks=0", *extra, "--", sys.executable,
                          str(script)], timeout=300, env={"RTKIT_LIB_DIR": prm})
        assert proc.returncode == 0 and "fit-done" in proc.stdout, proc.stderr[-3000:]
        report = load_report(run_dir)
        peaks[name] = report["process"]["peak_rss_bytes"]
    pmem = report["pmem"]
    assert pmem["state"] == "on" and pmem["step_marks"] == 0
    pre, release = pmem["placed_before_first_step"], pmem["page_release"]
    assert pre["stopped_for_churn"] and pre["freed_bytes"] > pre["bytes"] * 3 // 4
    assert release["deferred_bytes"] <= release["deferred_max_bytes"]
    # unbounded, the freed records' file pages stayed resident: 1.48x the plain peak on this script
    assert peaks["tier"] <= peaks["plain"] * 1.10, peaks
    assert "warning: no training step reached tier mode" in proc.stderr


@requires_tf
@pytest.mark.timeout(1200)   # three Keras fits: on a loaded 2-core machine more than the file's 300 s
def test_summary_warns_when_tier_mode_raised_peak_rss(prm, tmp_path):
    """The same Keras 2 fit with its steps seen: with tier_min_size at 256 B the pool takes Python's and Keras's
    small objects before the first step, many to a page, and their freed neighbours keep the pages in DRAM: the
    peak RSS rises over plain and the summary says so, with what it saw and the fix. With the default
    tier_min_size the pool holds about what lives in it: no such warning."""
    pytest.importorskip("tf_keras")
    script = tmp_path / "fit.py"
    script.write_text(KERAS2_FIT)
    runs = {}
    for name, extra in (("plain", []), ("small", ["--set", f"tier_pool_path={tmp_path / 'p1'}", "--set", "tier_min_size=256"]),
                        ("default", ["--set", f"tier_pool_path={tmp_path / 'p2'}"])):
        run_dir = tmp_path / name
        proc = run_rtkit(["run", "--run-dir", str(run_dir), *extra, "--", sys.executable, str(script)], timeout=300,
                         env={"RTKIT_LIB_DIR": prm})
        assert proc.returncode == 0 and "fit-done" in proc.stdout, proc.stderr[-3000:]
        runs[name] = (load_report(run_dir), proc.stderr)
    peak = {name: r["process"]["peak_rss_bytes"] for name, (r, _) in runs.items()}
    small, said = runs["small"]
    at = small["pmem"]["at_rss_peak"]
    assert small["pmem"]["step_marks"] > 0 and at["rss_bytes"] <= peak["small"], at
    over = at["pool_dram_bytes"] - at["tier_bytes"]
    assert over >= 16 << 20, at
    # the warning is true: this run's peak RSS is over plain's (41-45 MiB, 52 MiB over live, in four pairs)
    assert peak["small"] >= peak["plain"] + (16 << 20), peak
    tier_line = [line for line in said.splitlines() if line.startswith("rtkit: tier: ")]
    assert len(tier_line) == 1 and "warning: tier mode raised peak RSS" in tier_line[0], said[-3000:]
    assert "more); raise tier_min_size (now 256 B) or run without tier_pool_path" in tier_line[0], tier_line
    from rtkit.report import html   # the HTML report's tier section says it too
    assert "warning: tier mode raised peak RSS" in html.render(small)
    default, said = runs["default"]
    assert default["pmem"]["at_rss_peak"]["rss_bytes"] > 0, default["pmem"]
    assert "raised peak RSS" not in said and peak["default"] <= peak["plain"] * 1.03, (peak, said[-2000:])


# A TF1 loop that writes nothing itself; slow enough steps that rtkit rewrites its own run files many times.
QUIET_LOOP = r"""
import os, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
ids = tf.compat.v1.placeholder(tf.int64, [64])
table = tf.Variable(tf.random.normal([4096, 32]))   # 512 KiB: pooled in tier mode
loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids))
train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
rng = np.random.default_rng(0)
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    for _ in range(1500):
        sess.run(train, {ids: rng.integers(0, 4096, 64)})
        time.sleep(0.004)
print("loop-done")
"""


@requires_tf
def test_disk_writes_say_how_much_were_rtkits_own_run_files(prm, tmp_path):
    """The tier line's "written to disk" is the child's /proc/PID/io, which counts rtkit's own run files too (the
    allocator's and the steps' files, rewritten as the job runs). On tensorflow/recommenders' DCN example it said
    "written to disk 91.9 MiB" where a run of the same script without tier mode wrote 60.7 MiB: the pool wrote about
    a third. The child's files now say what they wrote, and the line says how much of the figure they were."""
    from rtkit.report import sections as sec
    script = tmp_path / "loop.py"
    script.write_text(QUIET_LOOP)
    # without a pool the script writes nothing: what the child wrote is rtkit's run files, which the count must match
    # (no bytecode caches either: a module edited since its last import would be compiled and written)
    plain_dir = tmp_path / "plain"
    proc = run_rtkit(["run", "--quiet", "--run-dir", str(plain_dir), "--", sys.executable, str(script)], timeout=300,
                     env={"RTKIT_LIB_DIR": prm, "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0 and "loop-done" in proc.stdout, proc.stderr[-3000:]
    process = load_report(plain_dir)["process"]
    written, own = process.get("disk_written_bytes"), process.get("run_files_written_bytes")
    if not written:
        pytest.skip("this file system counts no disk writes for the run directory (tmpfs?)")
    # the summaries rewritten (a few KiB each) and every step's records appended once: tens of KiB and more
    assert own is not None and own > 64 << 10, process
    # Both count pages dirtied, but the flusher's timing moves the kernel's figure both ways: disk_written_bytes is
    # net of the pages of files deleted before their writeback (a summary renamed over while still dirty:
    # cancelled_write_bytes), and the kernel counts a partly written last page again when an append finds it written
    # back since the last one (at most a page an append; rtkit's count has it once). So rtkit's count is at most the
    # pages dirtied, and at least a third of them (a page rewritten or begun for every append, at worst one more)
    dirtied = written + process["disk_cancelled_bytes"]
    assert dirtied / 3 <= own <= dirtied, (own, written, process["disk_cancelled_bytes"])

    run_dir = tmp_path / "tier"
    proc = run_rtkit(["run", "--run-dir", str(run_dir), "--set", f"tier_pool_path={tmp_path / 'pool'}", "--",
                      sys.executable, str(script)], timeout=300, env={"RTKIT_LIB_DIR": prm})
    assert proc.returncode == 0 and "loop-done" in proc.stdout, proc.stderr[-3000:]
    report = load_report(run_dir)
    written, own = report["process"]["disk_written_bytes"], report["process"]["run_files_written_bytes"]
    assert 0 < own <= written + report["process"]["disk_cancelled_bytes"], report["process"]
    # "of it": never more than the net figure it is part of (the cancelled pages may be the run files')
    part = fmt.nbytes(min(own, written))
    line = next(l for l in proc.stderr.splitlines() if l.startswith("rtkit: tier:"))
    assert f"written to disk {fmt.nbytes(written)} (of it rtkit's own run files {part})" in line, line
    rows = dict((k.strip(), v) for s in sec.build_sections(report) if s.key == "tier" for k, v in s.rows)
    assert rows["disk written (child)"] == f"{fmt.nbytes(written)} (of it rtkit's own run files {part})"


# A model made after the first steps (DCN's example builds 15 more models after its first fit): its variable is
# made after the first step mark, so tier mode leaves it in DRAM; the tier line must say so.
LATE_VARIABLE = r"""
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
ids = tf.compat.v1.placeholder(tf.int64, [64])
table = tf.Variable(tf.random.normal([4096, 32]))   # 512 KiB, made before the first step: pooled
loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids))
train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
rng = np.random.default_rng(0)
late = None
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    for step in range(60):
        if step == 8:   # a second model, after the first steps: 4 MiB of variables, kept to the end
            late = tf.Variable(tf.zeros([1 << 20]))
            sess.run(late.initializer)
        sess.run(train, {ids: rng.integers(0, 4096, 64)})
    print("late-done", sess.run(tf.reduce_sum(late)))
"""


@requires_tf
def test_tier_line_names_what_was_made_after_the_first_step_and_stayed_in_dram(prm, tmp_path):
    """DCN's 15 later models (~36 MiB of variables and Adam slots, live to the end) stayed in DRAM while the tier line
    said nothing: the placement rule places only what exists before the first step mark and sizes the profile saw
    outlive steps. The allocator now counts the requests of tier_min_size or more made after the first mark that stay
    in DRAM for 16 step marks or more, and the tier line says how many and how large."""
    script = tmp_path / "late.py"
    script.write_text(LATE_VARIABLE)
    run_dir = tmp_path / "r"
    proc = run_rtkit(["run", "--run-dir", str(run_dir), "--set", f"tier_pool_path={tmp_path / 'pool'}", "--",
                      sys.executable, str(script)], timeout=300, env={"RTKIT_LIB_DIR": prm})
    assert proc.returncode == 0 and "late-done 0.0" in proc.stdout, proc.stderr[-3000:]
    late = load_report(run_dir)["pmem"]["dram_after_first_step"]
    # the 4 MiB variable, at least (TF may keep a temporary beside it), in whole pages of the large heap
    assert late["peak_allocs"] >= 1 and (4 << 20) <= late["peak_bytes"] < (16 << 20), late
    line = next(l for l in proc.stderr.splitlines() if l.startswith("rtkit: tier:"))
    n = late["peak_allocs"]
    assert (f"{n} allocation{'' if n == 1 else 's'} ({fmt.nbytes(late['peak_bytes'])}) made after the first step stayed "
            "in DRAM") in line, line
    assert "build every model, and its optimizer's slots, before the first training step" in line, line
