# test_pager.py -- tier mode's own pager (tier_pager): pooled records paged by rtkit under userfaultfd.
import os
import subprocess
import sys

import pytest

from test_tier import pmem_doc, run_tier
from rtkit.report.tier_view import cost_words, room_that_holds, tier_view, warning_words
from rtkit.report import fmt

pytestmark = pytest.mark.timeout(300)


def run_pager(native, mode, run_dir, pool, extra=None):
    env = {"RTKIT_RUN_DIR": str(run_dir), "RTKIT_TIER_POOL_PATH": str(pool), "RTKIT_TIER_PAGER": "1",
           "RTKIT_TIER_PAGER_MAX": str(8 << 20), "RTKIT_TIER_PAGER_HEAT_EVERY": "1", "RTKIT_TIER_PAGER_HEAT_FROM": "0",
           **(extra or {})}
    return run_tier(native, mode, env, program="prmalloc_pager", timeout=240)


def skip_where_the_kernel_refuses(doc):
    # a kernel without userfaultfd's move and asynchronous write-protect (Linux < 6.8), or one that refuses an
    # unprivileged userfaultfd or /proc/self/pagemap: the note says which; nothing here to test
    pg = doc["pager"]
    if not pg["on"] and any(w in pg["note"] for w in ("userfaultfd", "pagemap")):
        pytest.skip(pg["note"])


def run_paged(native, mode, run_dir, pool):
    """The C program's `mode`, which must pass (skipped where the kernel refuses the pager): its stats document and
    its stderr."""
    proc = run_pager(native, mode, run_dir, pool)
    doc = pmem_doc(run_dir)
    skip_where_the_kernel_refuses(doc)
    assert proc.returncode == 0 and proc.stdout == f"prmalloc_pager {mode}: ok\n", proc.stdout + proc.stderr
    return doc, proc.stderr


@pytest.fixture
def dirs(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return run_dir, tmp_path / "pool"


def test_paged_records_keep_their_data_through_eviction_refill_and_free(prm, dirs):
    # a 32 MiB record with a few rows written before the first step and an 8 MiB one written whole, 8 MiB of room:
    # the C program checks the data after adoption, after evictions (read back from the pool) and the file's
    # mapping back after free; here: what the pager says it did
    run_dir, pool = dirs
    doc, stderr = run_paged(prm, "basic", run_dir, pool)
    assert stderr == "", stderr
    pg = doc["pager"]
    assert pg["on"] and pg["note"] == "" and pg["regions"] == 2
    # the rows written before the first step are the file's data (and pages earlier records left there: the pool
    # keeps a freed record's pages until the first mark); the holes are filled with zeros at their first touch
    assert (8 << 20) + (64 << 10) <= pg["data_at_adopt_bytes"] < pg["adopted_bytes"]
    assert pg["filled_zero"] > 0
    # every page of a was written: no eviction found one still zero to drop unwritten
    assert pg["evicted_pages"] > 0 and pg["evicted_holes"] == 0
    # b's pages (all 7s) are kept as their word when evicted, the others written
    assert pg["evicted_bytes"] == (pg["evicted_pages"] - pg["evicted_same"]) * 4096
    assert pg["filled_from_file"] >= pg["evicted_pages"]
    assert pg["forgotten_bytes"] == pg["adopted_bytes"]   # both freed: back to the pool file
    for k in ("read_errors", "write_errors", "move_errors", "scan_errors", "adopt_errors"):
        assert pg[k] == 0, k
    assert not pool.exists()
    # the report says it, in the summary's tier line and the tier section
    report = {"pmem": doc}
    words = cost_words(report)
    assert any(w.startswith("paged by rtkit (tier_pager): ") and f"{pg['evicted_pages']:,} pages evicted" in w
               for w in words), words
    # a limit, not a bound the process stayed under: the peak is said beside it (a TF2 loop whose optimizer slot
    # alone passed a 64 MiB room peaked at twice its limit)
    assert any(f"its limit on anonymous memory {fmt.nbytes(pg['limit_bytes'])} (peak "
               f"{fmt.nbytes(pg['anon_peak_bytes'])}: " in w for w in words), words
    assert not any(w.startswith("heads in anonymous DRAM") for w in words)
    # the pager's threads' time, wall and CPU (the evictor's own clock: never more than its wall time)
    assert pg["evict_moves"] > 0 and 0 < pg["evict_cpu_seconds"] <= pg["evict_seconds"] + 0.01, pg
    assert 0 < pg["fill_cpu_seconds"] <= pg["fill_seconds"] + 0.01, pg
    assert 0 <= pg["scan_cpu_seconds"] <= pg["scan_seconds"] + 0.01, pg
    row = dict(tier_view(report)["rows"])["pager (tier_pager)"]
    assert "of CPU), faults served in " in row and row.endswith("of CPU) (on the pager's threads)"), row


def test_writes_racing_evictions_are_never_lost(prm, dirs):
    # three threads rewrite their pages round after round, checking the last round's value first, while the main
    # thread marks steps and the evictor moves pages out under them (24 MiB through 8 MiB of room)
    run_dir, pool = dirs
    doc, _ = run_paged(prm, "race", run_dir, pool)
    pg = doc["pager"]
    assert pg["evicted_pages"] > 0 and pg["filled_from_file"] > 0
    # a fourth thread fetched the pages ahead all along (the writers' checks cover its fills)
    assert pg["fetch_calls"] > 0 and pg["fetch_filled"] > 0, pg


def test_a_fetch_ahead_brings_evicted_pages_back_before_any_access(prm, dirs):
    # the lookahead's call (rtkit_tier_pager_fetch): after evictions, one fetch of the record's pages (any order) puts
    # every evicted page back, so that reading them all faults none in; pages in DRAM, outside the pool, of 8 KiB, and
    # of a freed record are handled as the C program checks
    run_dir, pool = dirs
    doc, _ = run_paged(prm, "fetch", run_dir, pool)
    pg = doc["pager"]
    assert pg["fetch_calls"] == 5 and pg["fetch_filled"] > 0 and pg["fetch_busy"] == 0, pg
    assert pg["fetch_asked"] == pg["fetch_filled"] and pg["fetch_seconds"] > 0, pg
    assert pg["read_errors"] == 0 and pg["write_errors"] == 0 and pg["move_errors"] == 0
    words = cost_words({"pmem": doc})
    assert any(f"read from the pool at a fault and {pg['fetch_filled']:,} read ahead of their step (the lookahead)" in w
               for w in words), words


def test_pages_of_one_repeated_word_are_kept_as_the_word_not_written(prm, dirs):
    # an Adagrad slot's rows no step moved are 0.1 in every float: evicted, such a page is kept as its word (nothing
    # written) and read back rebuilt from it, in the parent and in a forked child; a page that differs in one float
    # and pages of data are written as before (the C program checks every value)
    run_dir, pool = dirs
    doc, _ = run_paged(prm, "same", run_dir, pool)
    pg = doc["pager"]
    assert 0 < pg["evicted_same"] < pg["evicted_pages"] and pg["filled_same"] > 0, pg
    assert pg["evicted_bytes"] == (pg["evicted_pages"] - pg["evicted_same"] - pg["evicted_holes"]) * 4096, pg
    words = cost_words({"pmem": doc})
    assert any(f"{pg['evicted_same']:,} kept as a repeated word (not written)" in w for w in words), words
    # evicted again, a fetch ahead rebuilt the word pages (no fault did: the C program checks filled_same stood)
    assert 0 < pg["fetch_same"] <= pg["fetch_filled"], pg
    assert any(f"{pg['fetch_same']:,} of them rebuilt from their word)" in w for w in words), words


def test_a_forked_child_reads_the_parents_rows_resident_or_evicted(prm, dirs):
    # the child's mappings lose the parent's handler: the runs of pages absent at the fork get a private view of
    # the pool file (evicted rows read as the parent wrote them, never-written ones as zeros), its writes stay its own
    run_dir, pool = dirs
    doc, _ = run_paged(prm, "fork", run_dir, pool)
    assert doc["pager"]["evicted_pages"] > 0 and doc["pager"]["regions"] == 2


def test_a_pager_that_cannot_start_says_why_and_the_heads_run(prm, dirs):
    # a pool on a RAM file system is DRAM already: the pager refuses it with one line, tier mode runs on
    run_dir, _ = dirs
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    pool = f"/dev/shm/rtkit-pager-test-{os.getpid()}"
    proc = run_pager(prm, "basic", run_dir, pool)
    doc = pmem_doc(run_dir)
    pg = doc["pager"]
    assert doc["state"] == "on" and pg["setting"] and not pg["on"], pg
    assert pg["note"] == ("tier_pager off: the pool file is in DRAM already (a RAM file system): nothing to page; "
                          "the DRAM heads run instead")
    assert proc.returncode == 1 and "prmalloc_pager basic: " in proc.stderr  # its checks expect paging; it ran on
    assert "warning: " + pg["note"] in warning_words({"pmem": doc})
    assert not os.path.exists(pool)


def test_the_pager_refuses_a_resident_budget_beside_it(prm, dirs):
    # tier_resident_max is the page cache's budget over the same pages: the pager says so and the heads run
    run_dir, pool = dirs
    proc = run_pager(prm, "basic", run_dir, pool, {"RTKIT_TIER_RESIDENT_MAX": str(4 << 20)})
    pg = pmem_doc(run_dir)["pager"]
    assert not pg["on"] and pg["note"] == ("tier_pager off: tier_resident_max is set (the page cache's budget): unset "
                                           "it, or bound the pager with tier_pager_max; the DRAM heads run instead")
    assert proc.returncode == 1  # its checks expect paging; the program ran on


_PAIR_CHECK = """
import ctypes, sys
from rtkit.scheduler import lookahead_pages as pages
lib = ctypes.CDLL(None)
lib.aligned_alloc.restype = ctypes.c_void_p
lib.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
lib.rtkit_malloc_in_pmem.argtypes = [ctypes.c_void_p]
lib.rtkit_tier_pager_wait.restype = ctypes.c_long
n = 2 << 20
table, slot, other = (lib.aligned_alloc(pages.PAGE, n) for _ in range(3))
assert all(lib.rtkit_malloc_in_pmem(a) for a in (table, slot, other))

def mark():
    lib.rtkit_step_mark()
    lib.rtkit_tier_pager_wait()

mark()
records = [(other, n), (slot, n), (table, n), (slot, n + 64)]
# before any page has aged: the slot cannot be judged, and says so (the lookahead asks again after two more scans)
unheard = set()
assert pages.pair_by_writes({"t#1": (table, n)}, records, set(), unheard) == {} and unheard == {"t#1"}, unheard
scans0 = pages.heat_scans()
assert scans0 >= 0, scans0
import types
import numpy as np
from rtkit.scheduler import lookahead as la_mod
t = types.SimpleNamespace(rows=n // 64, row_bytes=64, slots=[None], dtype=np.dtype(np.float32))
la = la_mod.Lookahead(types.SimpleNamespace(tables={"t": t}, table_of_index=["t"]), "on", max_rows=1 << 20,
                      pool_path="", run_touch=lambda *a: [], thread_name=None)
la._row_bytes_of[(id(t), 1)] = 64
la.pool = (table, table + n)
la.bases = {"t": [table, None]}
la._find_tries = la_mod.FIND_TRIES + 1          # a retry: it does not count while the slot waits for heat
la.counts["batches"] = la_mod.FIND_RETRY_FIRST    # ... and the next is due by the batches
la._pair_slots(records)
assert la._find_tries == la_mod.FIND_TRIES and la.bases["t"][1] is None and not la._wants_find(), la.__dict__
for step in range(6):   # the slot is written where and when its table is; the other record at its own rows
    for i in range(n // pages.PAGE):
        if (i * 2654435761 >> 7) % 6 == step:
            ctypes.memset(table + i * pages.PAGE + 8, step, 1)
            ctypes.memset(slot + i * pages.PAGE + 8, step, 1)
        if (i * 40503 >> 3) % 6 == step:
            ctypes.memset(other + i * pages.PAGE + 8, step, 1)
    mark()
assert pages.heat_scans() >= scans0 + 6 and la._wants_find()
la._pair_slots(records)
assert la.bases["t"][1] == slot and la.counts["regions_paired"] == 1, la.bases
assert pages.pair_by_writes({"t#1": (table, n)}, records, set()) == {"t#1": slot}
assert pages.pair_by_writes({"t#1": (table, n)}, records, {slot}) == {}          # taken: the other is no twin
both = pages.pair_by_writes({"t#1": (table, n), "u#1": (table, n)}, records, set())
assert list(both.values()) == [slot], both                                    # a record goes to one slot
print("paired")
"""


def test_a_slot_is_told_by_its_write_history(prm, dirs):
    # rtkit_tier_pager_likeness: a record written at the same pages in the same steps as the table scores 1, one
    # written elsewhere far less, one at another offset in its page and memory outside the pool nothing
    run_dir, pool = dirs
    _, err = run_paged(prm, "likeness", run_dir, pool)
    assert "likeness: " in err


def test_a_child_past_the_word_copies_gets_sigbus_for_an_absent_page_never_zeros(prm, dirs):
    # 80k pages kept as their word, past the 65,536 a forked child gets copies of: the child reads the pages in DRAM
    # at the fork as the parent's and dies of SIGBUS at an absent one (the C program checks the signal); the parent's
    # pages all read back rebuilt
    run_dir, pool = dirs
    doc, _ = run_paged(prm, "fork_words", run_dir, pool)
    pg = doc["pager"]
    assert pg["evicted_same"] > 65536 and pg["filled_same"] > 0, pg


def test_fetches_racing_frees_leave_every_live_record_as_written(prm, dirs):
    # a thread fetches six records' pages without pause while they are written, evicted, read back and freed one by
    # one: every live record reads back its last writes (the C program checks every page; a fetch that put stale
    # file data in place fails it: checked by hand), and the freed ones leave the pager
    run_dir, pool = dirs
    doc, stderr = run_paged(prm, "fetch_free", run_dir, pool)
    pg = doc["pager"]
    assert pg["regions"] == 6 and pg["forgotten_bytes"] == pg["adopted_bytes"], pg
    assert pg["fetch_filled"] > 0 and pg["evicted_pages"] > 0, pg


def test_eviction_takes_the_coldest_pages_first_and_its_walk_skips_chunks_holding_none(prm, dirs):
    # 4 MiB written at every step, 4 MiB once, 8 MiB of room: the C program checks that every hot page stayed in DRAM
    # and the cold ones went (and read back as written); here: the walk for candidates looked at the chunks holding
    # one, not at the hot chunks and the 8 MiB never touched before them (walking every page it looked at 3,500 or so)
    run_dir, pool = dirs
    doc, _ = run_paged(prm, "order", run_dir, pool)
    pg = doc["pager"]
    assert 0 < pg["evicted_pages"] <= 1024, pg
    assert pg["evicted_pages"] <= pg["evict_walked_pages"] <= pg["evicted_pages"] + 256, pg


def _room_short(report):
    return [w for w in warning_words(report) if "pager's room" in w]


def test_a_room_below_what_a_step_touches_is_warned_with_the_room_that_holds_it(prm, tmp_path):
    # each step writes its whole 32 MiB record against 8 MiB of room (a slot that a dense optimizer update writes
    # whole): nearly every page evicted is back within two steps, and the summary says the room is short and what
    # holds at least that; 4 MiB hot and 4 MiB written once (the mode of test_eviction_takes...): the cold pages
    # went for good, no warning
    docs = {}
    for mode in ("whole", "order"):
        run_dir = tmp_path / mode
        run_dir.mkdir()
        docs[mode], _ = run_paged(prm, mode, run_dir, tmp_path / f"{mode}.pool")
    whole, order = docs["whole"]["pager"], docs["order"]["pager"]
    assert whole["room_bytes"] == 8 << 20 and whole["room_by_max"] == 1, whole
    assert 0 < whole["evicted_pages"] < whole["back_within_two_steps"] * 2, whole
    line = _room_short({"pmem": docs["whole"]})
    assert len(line) == 1 and line[0].startswith("warning: the pager's room (8.00 MiB) is below what the steps touch: ")
    # the room that holds it: at least the 32 MiB record a step writes whole, in whole 64 MiB
    holds = room_that_holds(whole)
    assert holds % (64 << 20) == 0 and holds >= 32 << 20, whole
    assert f"; set tier_pager_max to {fmt.nbytes(holds)} or more (the most the process held over its start" in line[0]
    assert 0 < order["evicted_pages"] and order["back_within_two_steps"] * 4 < order["evicted_pages"], order
    assert _room_short({"pmem": docs["order"]}) == []
    # a room that MemAvailable set: no tier_pager_max to raise
    by_memory = {**docs["whole"], "pager": {**whole, "room_by_max": 0}}
    assert _room_short({"pmem": by_memory})[0].endswith(
        "the DRAM left for it (MemAvailable less tier_pager_reserve) holds no more: give the job more memory or a "
        "smaller tier_pager_reserve")


def test_pages_the_lookahead_tells_cost_fewer_write_faults_and_keep_their_heat(prm, tmp_path):
    # the hot 4 MiB of test_eviction_takes... told before every step (rtkit_tier_pager_heat) and not: told, their
    # region is write-protected at every eighth scan, then further apart while few writes it was not told turn up, so
    # the steps' writes fault far less; both ways the C program checks that the hot pages stayed in DRAM and the cold
    # ones went. told_dense: 1 MiB of the hot pages written at every step but never told (a slot its optimizer
    # writes whole): after one cycle its region is protected at every scan again, so those pages stay hot
    faults, docs = {}, {}
    for mode in ("told", "untold", "told_dense"):
        run_dir, pool = tmp_path / mode, tmp_path / f"{mode}.pool"
        run_dir.mkdir()
        proc = run_pager(prm, mode, run_dir, pool)
        docs[mode] = pmem_doc(run_dir)
        skip_where_the_kernel_refuses(docs[mode])
        assert proc.returncode == 0 and proc.stdout == f"prmalloc_pager {mode}: ok\n", proc.stdout + proc.stderr
        faults[mode] = int(proc.stderr.split("faults ")[1].split()[0])
    told, untold, dense = docs["told"]["pager"], docs["untold"]["pager"], docs["told_dense"]["pager"]
    assert told["told_pages"] == 72 * 1024 and untold["told_pages"] == 0 and dense["told_pages"] == 72 * 768, dense
    assert untold["regions_armed"] == untold["regions_scanned"] == untold["scans"], untold
    assert told["regions_scanned"] == told["scans"] and told["regions_armed"] <= told["scans"] // 8 + 2, told
    # 64 steps' writes to 1,024 pages: one fault per page and step untold, at most one per page and protected scan told
    assert faults["untold"] >= 64 * 1024 and faults["told"] <= faults["untold"] // 6, faults
    # the dense pages: protected at every scan after the first cycle, evicted (and read back) in that cycle at most
    assert dense["regions_armed"] >= dense["scans"] - 10 and faults["told_dense"] >= 56 * 1024, (dense, faults)
    assert 1024 <= told["evicted_pages"] <= 1024 + 64 and 1024 <= untold["evicted_pages"] <= 1024 + 64, (told, untold)
    assert 1024 <= dense["evicted_pages"] <= 1024 + 8 * 256, dense
    row = dict(tier_view({"pmem": docs["told"]})["rows"])["pager (tier_pager)"]
    assert (f"; {told['regions_armed']} of {told['scans']} region scans write-protected, the lookahead told the "
            "others' pages) in " in row), row
    row = dict(tier_view({"pmem": docs["untold"]})["rows"])["pager (tier_pager)"]
    assert "write-protected" not in row, row


def test_a_heat_window_a_tell_short_still_counts_as_told(prm, tmp_path):
    # the lookahead tells the next step's pages while a step runs, so a window a scan cuts may hold a tell fewer than
    # its marks: told at 7 steps of every 8 (scans every 8 marks), the region is still protected seldom and the
    # writes fault far less than untold; a lookahead backing off (every second step or fewer) is not told whole
    faults, docs = {}, {}
    for mode in ("told_gaps", "untold"):
        run_dir, pool = tmp_path / mode, tmp_path / f"{mode}.pool"
        run_dir.mkdir()
        proc = run_pager(prm, mode, run_dir, pool, {"RTKIT_TIER_PAGER_HEAT_EVERY": "8"})
        docs[mode] = pmem_doc(run_dir)
        skip_where_the_kernel_refuses(docs[mode])
        assert proc.returncode == 0 and proc.stdout == f"prmalloc_pager {mode}: ok\n", proc.stdout + proc.stderr
        faults[mode] = int(proc.stderr.split("faults ")[1].split()[0])
    gaps, untold = docs["told_gaps"]["pager"], docs["untold"]["pager"]
    assert gaps["told_pages"] == 63 * 1024 and untold["regions_armed"] == untold["scans"], (gaps, untold)
    assert gaps["scans"] >= 8 and gaps["regions_armed"] <= gaps["scans"] // 2, gaps
    assert faults["told_gaps"] <= faults["untold"] // 2, faults


def _scans_started(prm, dirs, mode, heat_from, lead):
    """The pager test `mode` with 64 MiB of room: its pager stats and the report's pager row."""
    run_dir, pool = dirs
    proc = run_pager(prm, mode, run_dir, pool, {"RTKIT_TIER_PAGER_HEAT_FROM": heat_from,
                                                "RTKIT_TIER_PAGER_HEAT_LEAD": lead,
                                                "RTKIT_TIER_PAGER_MAX": str(64 << 20)})
    doc = pmem_doc(run_dir)
    skip_where_the_kernel_refuses(doc)
    assert proc.returncode == 0 and proc.stdout == f"prmalloc_pager {mode}: ok\n", proc.stdout + proc.stderr
    return doc["pager"], dict(tier_view({"pmem": doc})["rows"])["pager (tier_pager)"]


@pytest.mark.parametrize("heat_from", ["50", "100"])
def test_heat_scans_wait_until_the_process_has_used_its_share_of_the_room(prm, dirs, heat_from):
    # each scan costs the steps a fault at their next write to every page: none while the process is far from its
    # limit; past the limit a scan comes first, so an eviction never runs on ages no scan made
    pg, row = _scans_started(prm, dirs, "heat_from", heat_from, "0")
    assert pg["heat_from_bytes"] == pg["limit_bytes"] - (64 << 20) * (100 - int(heat_from)) // 100, pg
    assert f"heat scans (from step {pg['first_scan_step']:,}) in " in row, row


def test_heat_scans_start_a_lead_of_scans_before_the_limit_at_the_process_growth(prm, dirs):
    # a first step of 20 MiB, then 4 MiB of rows a step, against 64 MiB of room: with a lead of 4 one-step scans the
    # first comes at ~40 MiB (not after the burst), long before tier_pager_heat_from's 100%, and no eviction before
    # it; the tier line says why they started there
    pg, row = _scans_started(prm, dirs, "heat_lead", "100", "4")
    assert pg["first_scan_by_lead"] == 1 and pg["scans"] >= 1, pg
    assert (f"heat scans (from step {pg['first_scan_step']:,} as its growth of "
            f"{fmt.nbytes(pg['growth_bytes_per_step'])} a step neared the limit) in ") in row, row


def test_the_tier_line_says_why_no_heat_scan_ran():
    pg = {"on": True, "scans": 0, "first_scan_step": 0, "heat_from_bytes": 3 << 30, "limit_bytes": 5 << 30}
    from rtkit.report.tier_view import _scans_from
    assert _scans_from(pg) == ("(none: the process stayed under 3.00 GiB of anonymous memory, where "
                               "tier_pager_heat_from starts them, and never came within tier_pager_heat_lead scans "
                               "of its limit) ")
    assert _scans_from({"scans": 4}) == ""   # an older library's stats: nothing said
    # the lookahead told pages, but no region's scan was spared (it backed off: no window told whole): no "others"
    told = {"scans": 26, "first_scan_step": 162, "told_pages": 5855, "regions_armed": 208, "regions_scanned": 208}
    assert _scans_from(told) == ("(from step 162; all 208 region scans write-protected, though the lookahead told "
                                 "5,855 pages) ")
    assert _scans_from({**told, "regions_armed": 150}) == ("(from step 162; 150 of 208 region scans write-protected, "
                                                           "the lookahead told the others' pages) ")


def test_a_slot_is_paired_with_its_table_by_the_pages_the_steps_wrote(prm, dirs):
    # lookahead_pages.pair_by_writes through the preloaded pager: three pooled records, one written at the same pages
    # in the same steps as the table (its optimizer slot), one elsewhere; the slot is paired, once, and nothing else;
    # before any page aged the lookahead waits for the pager's scans without spending a retry, then pairs it
    run_dir, pool = dirs
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTKIT_") and k != "LD_PRELOAD"}
    env.pop("_RTKIT_MALLOC_ROOT", None)
    env.update({"LD_PRELOAD": os.path.join(prm, "librtkit_malloc.so"), "RTKIT_RUN_DIR": str(run_dir),
                "RTKIT_TIER_POOL_PATH": str(pool), "RTKIT_TIER_PAGER": "1", "RTKIT_TIER_PAGER_MAX": str(64 << 20),
                "RTKIT_TIER_PAGER_HEAT_EVERY": "1", "RTKIT_TIER_PAGER_HEAT_FROM": "0"})
    proc = subprocess.run([sys.executable, "-c", _PAIR_CHECK], env=env, capture_output=True, text=True, timeout=240)
    skip_where_the_kernel_refuses(pmem_doc(run_dir))
    assert proc.returncode == 0 and proc.stdout == "paired\n", proc.stdout + proc.stderr
